// Bad input (typed exceptions whose messages name the value), timeouts when a
// rank never joins, and asynchronous collectives.
#include "common.hpp"

#include <atomic>
#include <chrono>
#include <thread>

using namespace dpt;
using namespace std::chrono_literals;

namespace {

// Runs f and returns the message of the expected exception type E ("" and a
// failed check if it did not throw E).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("threw a different exception: " << e.what());
    return {};
  }
  FAIL_CHECK("did not throw");
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A user tensor whose traits say it lives in device memory.
struct device_tensor {
  float* p;
  std::size_t n;
};
// A transport whose size() is 0 (a broken communicator).
struct null_request {
  void wait(dpkit::deadline) {}
  bool test() const { return true; }
};
struct zero_world {
  int rank() const { return 0; }
  int size() const { return 0; }
  null_request isend(std::span<const std::byte>, int, int) { return {}; }
  null_request irecv(std::span<std::byte>, int, int) { return {}; }
  bool accepts(dpkit::memory_space s) const { return s == dpkit::memory_space::host; }
};
static_assert(dpkit::transport<zero_world>);

} // namespace

template <>
struct dpkit::tensor_traits<device_tensor> {
  using value_type = float;
  static dpkit::memory_space space(const device_tensor&) { return dpkit::memory_space::device; }
  static float* data(device_tensor& t) { return t.p; }
  static std::size_t size(const device_tensor& t) { return t.n; }
};

TEST_CASE("bad input: world size and rank out of range") {
  for (int bad : {0, -3}) {
    const auto m = message_of<dpkit::invalid_argument>([&] { dpkit::inproc_world w(bad); });
    CHECK(contains(m, "got " + std::to_string(bad)));
  }
  dpkit::inproc_world world(4);
  for (int bad : {5, 4, -1}) {
    const auto m = message_of<dpkit::invalid_argument>([&] { (void)world.rank_handle(bad); });
    CHECK(contains(m, "rank " + std::to_string(bad)));
    CHECK(contains(m, "world size 4"));
  }
  auto h = world.rank_handle(1);
  CHECK(h.rank() == 1);
  CHECK(h.size() == 4);
  std::byte b[4]{};
  auto m = message_of<dpkit::invalid_argument>([&] { (void)h.isend(std::span<const std::byte>(b), 7, 0); });
  CHECK(contains(m, "peer rank 7"));
  CHECK(contains(m, "rank 1"));
  CHECK(contains(m, "isend"));
  m = message_of<dpkit::invalid_argument>([&] { (void)h.irecv(std::span<std::byte>(b), -1, 0); });
  CHECK(contains(m, "peer rank -1"));
  CHECK(contains(m, "irecv"));

  // A transport reporting world size 0 is rejected by every collective.
  zero_world z;
  std::vector<float> v(4);
  for (auto f : std::initializer_list<std::function<void()>>{
           [&] { dpkit::allreduce_ring(z, v); }, [&] { dpkit::allreduce_tree(z, v); },
           [&] { dpkit::allreduce(z, v); }, [&] { dpkit::broadcast_tree(z, v); },
           [&] { dpkit::reduce_tree(z, v, v); }, [&] { dpkit::barrier(z); },
           [&] { dpkit::allgather_ring(z, v); }, [&] { dpkit::reduce_scatter_ring(z, v); }}) {
    m = message_of<dpkit::invalid_argument>(f);
    CHECK(contains(m, "world size must be >= 1, got 0"));
  }
}

TEST_CASE("bad input: point-to-point size mismatch is a dpkit::error naming both sizes") {
  dpkit::inproc_world world(2);
  CHECK_THROWS_AS(world.run([](dpkit::inproc& comm) {
    std::vector<std::byte> buf(comm.rank() == 0 ? 4 : 8);
    auto rq = comm.rank() == 0 ? comm.isend(buf, 1, 3) : comm.irecv(buf, 0, 3);
    const auto m = message_of<dpkit::error>([&] { rq.wait(dpkit::deadline_after(10s)); });
    CHECK(contains(m, "sent 4 bytes"));
    CHECK(contains(m, "expects 8"));
    throw dpkit::error(m);
  }), dpkit::error);
}

TEST_CASE("bad input: collectives reject mismatched lengths, memory spaces, roots, native, divisibility") {
  constexpr int n = 4;
  dpkit::inproc_world world(n);
  std::vector<std::string> msgs[n];
  world.run([&](dpkit::inproc& comm) {
    const int r = comm.rank();
    auto& out = msgs[r];
    std::vector<float> in(12), small(10);
    auto expect = [&](auto&& f, std::initializer_list<std::string> parts) {
      const auto m = message_of<dpkit::invalid_argument>(f);
      for (const auto& p : parts)
        if (!contains(m, p)) out.push_back("'" + m + "' lacks '" + p + "'");
    };
    const std::string rk = "rank " + std::to_string(r) + " of 4";
    // Out-of-place output size differs from the input's.
    expect([&] { dpkit::allreduce_ring(comm, in, small); }, {"allreduce_ring", rk, "10", "12"});
    expect([&] { dpkit::allreduce_tree(comm, in, small); }, {"allreduce_tree", rk, "10", "12"});
    expect([&] { dpkit::allreduce(comm, in, small); }, {rk, "10", "12"});
    expect([&] { dpkit::allgather_ring(comm, in, small); }, {"allgather_ring", rk, "10", "48"});
    expect([&] { dpkit::reduce_scatter_ring(comm, in, small); }, {"reduce_scatter_ring", rk, "10", "3"});
    // Tensor in device memory on the host-only inproc transport.
    device_tensor dev{in.data(), in.size()};
    expect([&] { dpkit::allreduce_ring(comm, dev); }, {rk, "device"});
    expect([&] { dpkit::allreduce_tree(comm, dev); }, {rk, "device"});
    expect([&] { dpkit::broadcast_tree(comm, dev, 0); }, {rk, "device"});
    expect([&] { dpkit::allgather_ring(comm, dev); }, {rk, "device"});
    dpkit::tensor_view<float> dview{in.data(), in.size(), dpkit::memory_space::device};
    expect([&] { dpkit::allreduce(comm, dview); }, {rk, "device"});
    expect([&] { dpkit::allreduce_ring(comm, in, dview); }, {rk, "device"});
    // Root out of range.
    for (int root : {4, -1, 7}) {
      const std::string rs = "root rank " + std::to_string(root);
      expect([&] { dpkit::broadcast_tree(comm, in, root); }, {"broadcast_tree", rk, rs, "world size 4"});
      expect([&] { dpkit::reduce_tree(comm, in, in, dpkit::reduce_op::sum, root); }, {"reduce_tree", rk, rs});
    }
    // Reduce-scatter / in-place all-gather input not divisible by the world size.
    std::vector<float> odd(13);
    expect([&] { dpkit::reduce_scatter_ring(comm, odd); }, {"reduce_scatter_ring", rk, "13", "world size 4"});
    expect([&] { dpkit::reduce_scatter_ring(comm, odd, small); }, {"reduce_scatter_ring", rk, "13"});
    expect([&] { dpkit::allgather_ring(comm, odd); }, {"allgather_ring", rk, "13"});
    // algorithm::native on a transport without native collectives.
    expect([&] { dpkit::allreduce(comm, in, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::native}); },
           {"native", rk});
    std::vector<float> four(4 * 3);
    expect([&] { dpkit::reduce_scatter(comm, four, dpkit::reduce_op::sum, dpkit::algorithm::native); },
           {"reduce_scatter_native", rk, "native"});
    expect([&] { dpkit::allgather(comm, four, dpkit::algorithm::native); }, {"allgather_native", rk, "native"});
    expect([&] { dpkit::broadcast(comm, in, 0, dpkit::algorithm::native); }, {"broadcast_native", rk, "native"});
    expect([&] { dpkit::reduce(comm, in, dpkit::reduce_op::sum, 0, dpkit::algorithm::native); }, {"reduce_native", rk});
    expect([&] { dpkit::barrier(comm, dpkit::algorithm::native); }, {"barrier_native", rk});
    // An algorithm the collective does not have.
    expect([&] { dpkit::reduce_scatter(comm, four, dpkit::reduce_op::sum, dpkit::algorithm::tree); },
           {"reduce_scatter", rk, "no tree algorithm"});
    expect([&] { dpkit::allgather(comm, four, dpkit::algorithm::tree); }, {"allgather", rk, "no tree algorithm"});
    expect([&] { dpkit::broadcast(comm, in, 0, dpkit::algorithm::ring); }, {"broadcast", rk, "no ring algorithm"});
    expect([&] { dpkit::reduce(comm, in, dpkit::reduce_op::sum, 0, dpkit::algorithm::ring); }, {"reduce", rk, "no ring algorithm"});
    // Root's out size differs on broadcast and reduce.
    if (r == 0) {
      expect([&] { dpkit::broadcast_tree(comm, in, small, 0); }, {"broadcast_tree", "10", "12"});
      expect([&] { dpkit::reduce_tree(comm, in, small, dpkit::reduce_op::sum, 0); }, {"reduce_tree", "10", "12"});
    }
    // The transport is still usable after all of that.
    std::vector<std::int32_t> ok(5, r);
    dpkit::allreduce(comm, ok);
    if (ok != std::vector<std::int32_t>(5, 6)) out.push_back("allreduce after errors is wrong");
  });
  for (int r = 0; r < n; ++r)
    for (const auto& m : msgs[r]) FAIL_CHECK("rank " << r << ": " << m);
}

TEST_CASE("timeouts: a rank that never joins makes the others throw timeout_error within the deadline") {
  enum which { ring, tree, automatic, broadcast, barrier, reduce_scatter, allgather, reduce, async };
  for (int n : {3, 4}) {
    for (which w : {ring, tree, automatic, broadcast, barrier, reduce_scatter, allgather, reduce, async}) {
      CAPTURE(n);
      CAPTURE(static_cast<int>(w));
      dpkit::inproc_world world(n);
      std::vector<int> outcome(static_cast<std::size_t>(n), -1); // 0 ok, 1 timeout, 2 other
      std::vector<double> seconds(static_cast<std::size_t>(n), 0);
      std::vector<std::string> what(static_cast<std::size_t>(n));
      dpkit::collective_options o;
      o.timeout = 200ms;
      o.segment_bytes = 64;
      const auto t_start = dpkit::clock::now();
      try {
        world.run([&](dpkit::inproc& comm) {
          const int r = comm.rank();
          const auto i = static_cast<std::size_t>(r);
          if (r == 2) return; // never joins
          std::vector<float> v(1000, 1.0f), out(1000 * static_cast<std::size_t>(n));
          const auto t0 = dpkit::clock::now();
          try {
            switch (w) {
            case ring: dpkit::allreduce_ring(comm, v, dpkit::reduce_op::sum, o); break;
            case tree: dpkit::allreduce_tree(comm, v, dpkit::reduce_op::sum, o); break;
            case automatic: dpkit::allreduce(comm, v, dpkit::reduce_op::sum, {}, o); break;
            case broadcast: dpkit::broadcast_tree(comm, v, 0, o); break;
            case barrier: dpkit::barrier(comm, o); break;
            case reduce_scatter: dpkit::reduce_scatter_ring(comm, out, v, dpkit::reduce_op::sum, o); break;
            case allgather: dpkit::allgather_ring(comm, v, out, o); break;
            case reduce: dpkit::reduce_tree(comm, v, v, dpkit::reduce_op::sum, 0, o); break;
            case async: {
              auto h1 = dpkit::allreduce_async(comm, v, dpkit::reduce_op::sum, {}, o);
              h1.wait();
              break;
            }
            }
            outcome[i] = 0;
          } catch (const dpkit::timeout_error& e) {
            outcome[i] = 1;
            what[i] = e.what();
            seconds[i] = std::chrono::duration<double>(dpkit::clock::now() - t0).count();
            throw;
          } catch (const std::exception& e) {
            outcome[i] = 2;
            what[i] = e.what();
            throw;
          }
        });
        // Only broadcast and reduce may finish everywhere a skipped leaf does not matter.
        CHECK_MESSAGE(false, "world.run did not rethrow a timeout");
      } catch (const dpkit::timeout_error& e) {
        CHECK(contains(e.what(), "rank 0 of " + std::to_string(n)));
      }
      const double total = std::chrono::duration<double>(dpkit::clock::now() - t_start).count();
      CHECK(total < 10.0);
      int timed_out = 0;
      for (int r = 0; r < n; ++r) {
        if (r == 2) continue;
        const auto i = static_cast<std::size_t>(r);
        CAPTURE(r);
        CAPTURE(what[i]);
        CHECK(outcome[i] != 2);
        CHECK(outcome[i] != -1);
        if (outcome[i] == 1) {
          ++timed_out;
          CHECK(seconds[i] >= 0.19);
          CHECK(seconds[i] <= 5.0);
          CHECK(contains(what[i], "rank " + std::to_string(r)));
          CHECK(contains(what[i], "deadline"));
        }
      }
      // Rank 0 depends on rank 2 in every algorithm (tree root / ring); in
      // the ring-based and all-reduce algorithms every waiting rank times out.
      CHECK(outcome[0] == 1);
      if (w != broadcast && w != reduce) CHECK(timed_out == n - 1);
    }
  }
}

TEST_CASE("async: several outstanding collectives complete in submission order with correct results") {
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    dpkit::inproc_world world(n);
    std::vector<std::string> errs(static_cast<std::size_t>(n));
    world.run([&](dpkit::inproc& comm) {
      const int r = comm.rank();
      const auto nn = static_cast<std::size_t>(n);
      auto& err = errs[static_cast<std::size_t>(r)];
      dpkit::collective_options small;
      small.segment_bytes = 64;
      // Different sizes so the automatic policy picks both tree and ring.
      std::vector<std::vector<double>> bufs;
      for (std::size_t k = 0; k < 6; ++k) bufs.emplace_back(k % 2 ? 1000 + k : 50000 + k, static_cast<double>(r + 1 + k));
      std::vector<dpkit::collective_handle> hs;
      for (std::size_t k = 0; k < bufs.size(); ++k)
        hs.push_back(dpkit::allreduce_async(comm, bufs[k], k == 3 ? dpkit::reduce_op::max : dpkit::reduce_op::sum,
                                            {}, k == 4 ? small : dpkit::collective_options{}));
      // Out-of-place all-reduce, reduce-scatter, all-gather, broadcast.
      const auto in = make_input<std::int32_t>(dpkit::reduce_op::sum, r, 7 * nn);
      std::vector<std::int32_t> ar(7 * nn), rs(7), ag(7 * nn * nn), bc(33, r);
      hs.push_back(dpkit::allreduce_async(comm, in, ar, dpkit::reduce_op::sum));
      hs.push_back(dpkit::reduce_scatter_async(comm, in, rs, dpkit::reduce_op::sum));
      hs.push_back(dpkit::allgather_async(comm, in, ag));
      hs.push_back(dpkit::broadcast_async(comm, bc, n - 1));
      // Wait in reverse order: completion of the last implies all earlier ran.
      hs.back().wait(dpkit::deadline_after(60s));
      for (std::size_t k = 0; k + 1 < hs.size(); ++k)
        if (!hs[k].test()) err += "handle " + std::to_string(k) + " not complete after a later one; ";
      for (auto it = hs.rbegin(); it != hs.rend(); ++it) it->wait();
      for (std::size_t k = 0; k < bufs.size(); ++k) {
        double want = 0;
        for (int q = 0; q < n; ++q)
          want = k == 3 ? std::max(want, static_cast<double>(q + 1 + k)) : want + static_cast<double>(q + 1 + k);
        for (double x : bufs[k])
          if (x != want) { err += "buffer " + std::to_string(k) + " wrong; "; break; }
      }
      for (std::size_t i = 0; i < 7 * nn; ++i)
        if (ar[i] != reference<std::int32_t>(dpkit::reduce_op::sum, n, i)) { err += "async allreduce wrong; "; break; }
      for (std::size_t i = 0; i < 7; ++i)
        if (rs[i] != reference<std::int32_t>(dpkit::reduce_op::sum, n, static_cast<std::size_t>(r) * 7 + i)) { err += "async reduce_scatter wrong; "; break; }
      for (int q = 0; q < n; ++q) {
        const auto part = make_input<std::int32_t>(dpkit::reduce_op::sum, q, 7 * nn);
        if (!std::equal(part.begin(), part.end(), ag.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(q) * 7 * nn))) {
          err += "async allgather wrong; ";
          break;
        }
      }
      if (bc != std::vector<std::int32_t>(33, n - 1)) err += "async broadcast wrong; ";
      // An invalid async collective reports through its handle, and later ones still run.
      std::vector<float> a(8), b(9);
      auto bad = dpkit::allreduce_async(comm, a, b);
      auto good = dpkit::allreduce_async(comm, a);
      try {
        bad.wait();
        err += "invalid async collective did not throw; ";
      } catch (const dpkit::invalid_argument& e) {
        if (!contains(e.what(), "9")) err += std::string("message lacks the size: ") + e.what();
      }
      good.wait();
    });
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(errs[static_cast<std::size_t>(r)].empty(), "rank " << r << ": " << errs[static_cast<std::size_t>(r)]);
  }
}
