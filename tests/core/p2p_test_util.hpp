// What the point-to-point engine tests share (test_shm_p2p.cpp,
// test_tcp_p2p.cpp): the bytes a sender sends, and whether an op is pending.
#pragma once

#include "dpkit/transport/detail/p2p_engine.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace p2p_test {

// The bytes rank `from` sends to rank `to` as its k-th message of `n` bytes.
inline std::vector<std::byte> pattern(int from, int to, int k, std::size_t n) {
  std::vector<std::byte> v(n);
  std::uint32_t x = 2166136261u ^ static_cast<std::uint32_t>(from * 131 + to * 7 + k * 1009);
  for (auto& b : v) {
    x = x * 16777619u + 12345u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

inline bool pending(const dpkit::detail::p2p_op& op) { return op.state.load() == dpkit::detail::p2p_op::pending; }

// Every pair of n ranks (threads; `make(r)` builds rank r's engine) sends
// one message of each size in `sizes` to every other rank, tags alternating
// between one reused tag (7) and a tag per message; rank 1 posts its first
// half of receives after its sends, the others before; the second half
// after. Messages of one tag between a pair must match in posting order.
// Each rank checks every received byte; an engine lives until every rank
// is done (its peers may still read what it sent). Returns each rank's
// error ("" when it passed).
template <class Make>
std::vector<std::string> exchange_matrix(int n, const std::vector<std::size_t>& sizes, Make make) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<dpkit::detail::p2p_engine> e = make(r);
      try {
        std::vector<std::vector<std::byte>> out, in;
        std::vector<std::shared_ptr<dpkit::detail::p2p_op>> ops;
        in.reserve(4 * sizes.size() * static_cast<std::size_t>(n));
        out.reserve(4 * sizes.size() * static_cast<std::size_t>(n));
        const auto tag = [](std::size_t k) { return k % 2 ? 7 : 100 + static_cast<int>(k); };
        auto post_recvs = [&](bool first_half) {
          for (int p = 0; p < n; ++p) {
            if (p == r) continue;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
              if ((k < sizes.size() / 2) != first_half) continue;
              in.emplace_back(sizes[k]);
              ops.push_back(e->post_recv(in.back().data(), sizes[k], p, tag(k)));
            }
          }
        };
        if (r != 1) post_recvs(true);
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          for (std::size_t k = 0; k < sizes.size(); ++k) {
            out.push_back(pattern(r, p, static_cast<int>(k), sizes[k]));
            ops.push_back(e->post_send(out.back().data(), sizes[k], p, tag(k)));
          }
        }
        if (r == 1) post_recvs(true);
        post_recvs(false);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        for (auto& op : ops) {
          while (pending(*op) && std::chrono::steady_clock::now() < until)
            if (!e->progress()) std::this_thread::yield();
          if (op->state.load() != dpkit::detail::p2p_op::done)
            throw std::runtime_error("op not done: " + op->describe(r) + " " + op->error);
        }
        std::size_t i = 0;
        for (bool first : {true, false})
          for (int p = 0; p < n; ++p) {
            if (p == r) continue;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
              if ((k < sizes.size() / 2) != first) continue;
              if (in[i] != pattern(p, r, static_cast<int>(k), sizes[k]))
                throw std::runtime_error("wrong bytes from rank " + std::to_string(p) + ", message " + std::to_string(k));
              ++i;
            }
          }
      } catch (const std::exception& ex) {
        errors[static_cast<std::size_t>(r)] = ex.what();
      }
      finished.fetch_add(1);
      while (finished.load() < n) e->progress();
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

} // namespace p2p_test
