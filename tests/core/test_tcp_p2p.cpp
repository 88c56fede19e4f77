// The TCP point-to-point engine (transport/detail/tcp_p2p.hpp) that
// gloo_transport uses between ranks that do not share a node's segment:
// engines of several ranks in this process over connected socket pairs,
// driven by threads or step by step from one thread, checked against the
// bytes each sender sent.
#include <doctest/doctest.h>

#include "p2p_test_util.hpp"

#include "dpkit/transport/detail/health.hpp"
#include "dpkit/transport/detail/tcp_p2p.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using dpkit::detail::p2p_op;
using dpkit::detail::tcp_p2p;

// Connected stream sockets for n ranks: fds[r][p] is rank r's end towards p.
std::vector<std::vector<int>> mesh(int n) {
  std::vector<std::vector<int>> fds(static_cast<std::size_t>(n), std::vector<int>(static_cast<std::size_t>(n), -1));
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      int sv[2];
      REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
      fds[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] = sv[0];
      fds[static_cast<std::size_t>(b)][static_cast<std::size_t>(a)] = sv[1];
    }
  return fds;
}

using p2p_test::pattern;
using p2p_test::pending;

void drive(std::vector<tcp_p2p*> engines, const p2p_op& op) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pending(op) && std::chrono::steady_clock::now() < until)
    for (auto* e : engines) e->progress();
  REQUIRE(!pending(op));
}

} // namespace

TEST_CASE("tcp p2p: every pair of 3 ranks (threads), 0 bytes to past the early budget, one tag reused, "
          "receives posted before and after their sends") {
  const int n = 3;
  auto fds = mesh(n);
  const std::vector<std::size_t> sizes = {0, 1, 15, 16, 17, 4095, 4096, 65537, (1u << 20) + 3, (5u << 20) + 1};
  const auto errors =
      p2p_test::exchange_matrix(n, sizes, [&](int r) { return std::make_unique<tcp_p2p>(r, n, fds[static_cast<std::size_t>(r)]); });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
  }
}

TEST_CASE("tcp p2p: a message read before its receive, partly, is completed into the receive; past the budget "
          "the next message waits in the kernel until its receive is posted") {
  auto fds = mesh(2);
  tcp_p2p s(0, 2, fds[0]), r(1, 2, fds[1]);
  const std::size_t n = (3u << 20) + 5; // more than the socket buffers hold
  const auto a = pattern(0, 1, 0, n), b = pattern(0, 1, 1, n), c = pattern(0, 1, 2, 100);
  auto sa = s.post_send(a.data(), n, 1, 1);
  auto sb = s.post_send(b.data(), n, 1, 2);
  auto sc = s.post_send(c.data(), c.size(), 1, 3);
  for (int i = 0; i < 200; ++i) { // a is read into an early buffer; b waits (3 MiB + 3 MiB > the 4 MiB budget)
    s.progress();
    r.progress();
  }
  CHECK(pending(*sb));
  std::vector<std::byte> gc(100), gb(n), ga(n);
  auto rc = r.post_recv(gc.data(), 100, 0, 3);
  for (int i = 0; i < 50; ++i) {
    s.progress();
    r.progress();
  }
  CHECK(pending(*rc)); // behind b, held back
  auto rb = r.post_recv(gb.data(), n, 0, 2);
  drive({&s, &r}, *rb);
  drive({&s, &r}, *rc);
  auto ra = r.post_recv(ga.data(), n, 0, 1);
  drive({&s, &r}, *ra);
  for (auto* op : {sa.get(), sb.get(), sc.get(), ra.get(), rb.get(), rc.get()}) CHECK(op->state.load() == p2p_op::done);
  CHECK(ga == a);
  CHECK(gb == b);
  CHECK(gc == c);
}

TEST_CASE("tcp p2p: a receive whose length differs from its send fails naming both lengths; later messages still match") {
  auto fds = mesh(2);
  tcp_p2p s(0, 2, fds[0]), r(1, 2, fds[1]);
  const auto d = pattern(0, 1, 0, 64);
  const auto d2 = pattern(0, 1, 1, 32);
  std::vector<std::byte> g(48), g2(32);
  SUBCASE("receive posted first") {
    auto recv = r.post_recv(g.data(), 48, 0, 1);
    s.post_send(d.data(), 64, 1, 1);
    drive({&s, &r}, *recv);
    CHECK(recv->state.load() == p2p_op::failed);
    CHECK(recv->error.find("receive from rank 0 (tag 1, 48 bytes, TCP)") != std::string::npos);
    CHECK(recv->error.find("matched a message of 64 bytes") != std::string::npos);
  }
  SUBCASE("message first") {
    s.post_send(d.data(), 64, 1, 1);
    for (int i = 0; i < 64; ++i) r.progress();
    auto recv = r.post_recv(g.data(), 48, 0, 1);
    CHECK(recv->state.load() == p2p_op::failed);
    CHECK(recv->error.find("matched a message of 64 bytes") != std::string::npos);
  }
  auto s2 = s.post_send(d2.data(), 32, 1, 1);
  auto r2 = r.post_recv(g2.data(), 32, 0, 1);
  drive({&s, &r}, *r2);
  CHECK(r2->state.load() == p2p_op::done);
  CHECK(g2 == d2);
}

TEST_CASE("tcp p2p: a withdrawn receive's buffer is never written; withdraw says whether the op was pending") {
  auto fds = mesh(2);
  tcp_p2p s(0, 2, fds[0]), r(1, 2, fds[1]);
  std::vector<std::byte> g(2u << 20, std::byte{0x5a});
  auto recv = r.post_recv(g.data(), g.size(), 0, 9);
  const auto d = pattern(0, 1, 0, g.size());
  auto send = s.post_send(d.data(), d.size(), 1, 9);
  r.progress(); // part of it lands in g
  CHECK(r.withdraw(*recv));
  CHECK(recv->state.load() == p2p_op::failed);
  const auto snapshot = g;
  drive({&s, &r}, *send); // the rest is read and dropped
  CHECK(g == snapshot);
  CHECK(!r.withdraw(*recv));
  CHECK(!s.withdraw(*send));
  // the stream goes on: the next message arrives whole
  const auto d2 = pattern(0, 1, 1, 1000);
  std::vector<std::byte> g2(1000);
  auto r2 = r.post_recv(g2.data(), 1000, 0, 9);
  s.post_send(d2.data(), 1000, 1, 9);
  drive({&s, &r}, *r2);
  CHECK(g2 == d2);
}

TEST_CASE("tcp p2p: an unreceived message of another collective at the same sequence number is found") {
  auto fds = mesh(2);
  tcp_p2p s(0, 2, fds[0]), r(1, 2, fds[1]);
  const int mine = dpkit::detail::checked_tag_base(5, 0x1234);
  const int theirs = dpkit::detail::checked_tag_base(5, 0x4321);
  const int later = dpkit::detail::checked_tag_base(6, 0x4321);
  std::byte b[8]{};
  s.post_send(b, 8, 1, later);
  for (int i = 0; i < 64; ++i) r.progress();
  CHECK(r.foreign_message(0, mine) == 0);
  s.post_send(b, 8, 1, theirs);
  for (int i = 0; i < 64; ++i) r.progress();
  CHECK(r.foreign_message(0, mine) == theirs);
  CHECK(r.foreign_message(0, 12345) == 0);
}

TEST_CASE("tcp p2p: bytes that are not a dpkit header fail the peer's operations instead of being read as a message") {
  auto fds = mesh(2);
  tcp_p2p r(1, 2, fds[1]);
  std::vector<std::byte> g(64);
  auto recv = r.post_recv(g.data(), 64, 0, 3);
  const char junk[] = "GET / HTTP/1.1\r\n\r\n";
  REQUIRE(::write(fds[0][1], junk, sizeof junk) == static_cast<ssize_t>(sizeof junk));
  r.progress();
  CHECK(recv->state.load() == p2p_op::failed);
  CHECK(recv->peer_lost);
  CHECK(recv->error.find("not a dpkit message header") != std::string::npos);
  auto later = r.post_recv(g.data(), 64, 0, 4); // the connection is gone: fails at once
  CHECK(later->state.load() == p2p_op::failed);
  ::close(fds[0][1]);
}

TEST_CASE("tcp p2p: a peer that closes: what it sent before is received, then its pending operations fail") {
  auto fds = mesh(2);
  tcp_p2p r(1, 2, fds[1]);
  std::vector<std::byte> g(100), g2(100), big(8u << 20);
  const auto d = pattern(0, 1, 0, 100);
  {
    tcp_p2p s(0, 2, fds[0]);
    auto send = s.post_send(d.data(), 100, 1, 1);
    CHECK(!pending(*send)); // small: in the kernel at once
  } // s closes its socket
  auto send_big = r.post_send(big.data(), big.size(), 0, 2);
  auto recv = r.post_recv(g.data(), 100, 0, 1);
  auto recv2 = r.post_recv(g2.data(), 100, 0, 1);
  drive({&r}, *recv);
  drive({&r}, *recv2);
  drive({&r}, *send_big);
  CHECK(recv->state.load() == p2p_op::done);
  CHECK(g == d);
  CHECK(recv2->state.load() == p2p_op::failed);
  CHECK(recv2->peer_lost);
  CAPTURE(recv2->error);
  CHECK(recv2->error.find("the connection to rank 0") != std::string::npos); // "closed" or "is gone (closed)"
  CHECK(recv2->error.find("closed") != std::string::npos);
  CHECK(send_big->state.load() == p2p_op::failed);
  CHECK(send_big->peer_lost);
}

TEST_CASE("tcp p2p: fail_all ends every pending send and receive with the reason; close ends the peer's waits") {
  auto fds = mesh(2);
  tcp_p2p s(0, 2, fds[0]), r(1, 2, fds[1]);
  std::vector<std::byte> big(8u << 20), g(8);
  auto send = s.post_send(big.data(), big.size(), 1, 1); // more than the socket buffers: stays pending
  auto recv = s.post_recv(g.data(), 8, 1, 2);
  CHECK(pending(*send));
  CHECK(pending(*recv));
  auto peer_recv = r.post_recv(g.data(), 8, 0, 3);
  s.fail_all("the transport failed (test)");
  CHECK(send->state.load() == p2p_op::failed);
  CHECK(recv->state.load() == p2p_op::failed);
  CHECK(recv->error == "rank 0: receive from rank 1 (tag 2, 8 bytes, TCP): the transport failed (test)");
  s.close();
  drive({&r}, *peer_recv);
  CHECK(peer_recv->peer_lost);
}

TEST_CASE("tcp p2p: a sleeping receiver is woken by the send") {
  auto fds = mesh(2);
  tcp_p2p s(0, 2, fds[0]), r(1, 2, fds[1]);
  std::vector<std::byte> g(16);
  auto recv = r.post_recv(g.data(), 16, 0, 1);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread t([&] {
    while (pending(*recv)) {
      r.sleep(2'000'000); // 2 s: only the arriving bytes end it early
      r.progress();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto d = pattern(0, 1, 0, 16);
  s.post_send(d.data(), 16, 1, 1);
  t.join();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500));
  CHECK(g == d);
}
