// The shared-memory point-to-point engine (transport/detail/shm_p2p.hpp)
// that gloo_transport uses between the processes of one node: engines of
// several ranks on one area in this process, driven by threads or step by
// step from one thread, checked against the bytes each sender sent.
#include <doctest/doctest.h>

#include "p2p_test_util.hpp"

#include "dpkit/transport/detail/health.hpp"
#include "dpkit/transport/detail/shm_p2p.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace {

using dpkit::detail::shm_p2p;
using dpkit::detail::shm_p2p_op;

// An area for n ranks, as store_map_segment's creator leaves it: rings of
// the size for ranks with cores of their own (8 KiB), or with `share_cores`
// of the size for ranks that share them (256 KiB for a few ranks).
struct area {
  explicit area(int n, bool share_cores = false)
      : ring(dpkit::detail::shm_p2p_ring_bytes(n, share_cores)), bytes(dpkit::detail::shm_p2p_area_bytes(n, ring)) {
    mem = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64}));
    std::fill(mem, mem + bytes, std::byte{0});
    shm_p2p::init_area(mem, n, ring);
  }
  ~area() { ::operator delete(mem, std::align_val_t{64}); }
  area(const area&) = delete;
  area& operator=(const area&) = delete;
  std::size_t ring;
  std::size_t bytes;
  std::byte* mem;
};

using p2p_test::pattern;
using p2p_test::pending;

// Drives engines until `op` is no longer pending (at most 10 s).
void drive(std::vector<shm_p2p*> engines, const shm_p2p_op& op) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pending(op) && std::chrono::steady_clock::now() < until)
    for (auto* e : engines) e->progress();
  REQUIRE(!pending(op));
}

// Fresh shared memory, as a segment's pages are before any rank touched them
// (no page of it is in this process's page table yet).
struct fresh_shared {
  explicit fresh_shared(std::size_t n) : bytes(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    mem = static_cast<std::byte*>(p);
  }
  ~fresh_shared() { ::munmap(mem, bytes); }
  fresh_shared(const fresh_shared&) = delete;
  fresh_shared& operator=(const fresh_shared&) = delete;
  std::size_t bytes;
  std::byte* mem;
};

// Whether the page holding `addr` is in this process's page table (bit 63
// of its /proc/self/pagemap entry), so touching it takes no page fault; -1
// when pagemap cannot be read.
int page_present(const void* addr) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::uint64_t entry = 0;
  const off_t at = static_cast<off_t>(reinterpret_cast<std::uintptr_t>(addr) / 4096 * sizeof entry);
  const ssize_t got = ::pread(fd, &entry, sizeof entry, at);
  ::close(fd);
  if (got != static_cast<ssize_t>(sizeof entry)) return -1;
  return static_cast<int>(entry >> 63);
}

// The pages overlapping [p, p + n) that are not in this process's page
// table (empty when all are; {nullptr} when pagemap cannot be read).
std::vector<const std::byte*> absent_pages(const std::byte* p, std::size_t n) {
  std::vector<const std::byte*> absent;
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  for (std::uintptr_t a = begin & ~std::uintptr_t{4095}; a < begin + n; a += 4096) {
    const int present = page_present(reinterpret_cast<const void*>(a));
    if (present < 0) return {nullptr};
    if (!present) absent.push_back(reinterpret_cast<const std::byte*>(a));
  }
  return absent;
}

} // namespace

TEST_CASE("shm p2p: prefault maps every page of every ring in, the last page of a ring that does not start on one "
          "included; the segment's buffers likewise") {
  const int probe = 0; // on the stack: present
  if (page_present(&probe) < 0) {
    MESSAGE("skipped: /proc/self/pagemap cannot be read here");
    return;
  }
  // A ring's data starts 128 bytes past its control part, which is not on a
  // page: stepping 4096 bytes from its start missed its last page, which
  // the first wrap of the ring then faulted in inside a timed collective.
  for (int n : {2, 3})
  for (bool share_cores : {false, true}) {
    CAPTURE(n);
    CAPTURE(share_cores);
    const std::size_t cap = dpkit::detail::shm_p2p_ring_bytes(n, share_cores);
    fresh_shared area(dpkit::detail::shm_p2p_area_bytes(n, cap));
    shm_p2p::init_area(area.mem, n, cap);
    for (int r = 0; r < n; ++r) shm_p2p::prefault(area.mem, r, n, cap); // every rank's view is this process here
    for (int s = 0; s < n; ++s)
      for (int r = 0; r < n; ++r) {
        if (s == r) continue;
        CAPTURE(s);
        CAPTURE(r);
        const std::byte* data = shm_p2p::ring_at(area.mem, n, cap, s, r) + sizeof(dpkit::detail::shm_p2p_ring_ctl);
        CHECK(absent_pages(data, cap).empty());
      }
  }
  // The segment's buffers start after the rank's control line: the same.
  const std::size_t slot = 64u << 10;
  const std::size_t stride = (dpkit::detail::shm_region_bytes(slot) + 4095) / 4096 * 4096;
  fresh_shared seg(2 * stride);
  const dpkit::detail::shm_segment view(0, {seg.mem, seg.mem + stride}, slot);
  view.prefault();
  for (int p = 0; p < 2; ++p) {
    CAPTURE(p);
    CHECK(absent_pages(view.buffer(p, 0), 2 * view.slot_bytes()).empty());
  }
  // Nothing outside the buffers was written: rank 1's control line is still zero.
  CHECK(std::all_of(seg.mem + stride, seg.mem + stride + sizeof(dpkit::detail::shm_control),
                    [](std::byte b) { return b == std::byte{0}; }));
}

TEST_CASE("shm p2p: ring sizes, and the area fits every pair") {
  using dpkit::detail::shm_p2p_ring_bytes;
  CHECK(shm_p2p_ring_bytes(1) == 0);
  CHECK(shm_p2p_ring_bytes(1, true) == 0);
  CHECK(dpkit::detail::shm_p2p_area_bytes(1, 0) == 0);
  // ranks with cores of their own: small rings; ranks that share cores: large ones
  CHECK(shm_p2p_ring_bytes(2) == 8u << 10);
  CHECK(shm_p2p_ring_bytes(2, true) == 256u << 10);
  CHECK(shm_p2p_ring_bytes(16, true) * 16 * 15 <= 64u << 20);
  CHECK(shm_p2p_ring_bytes(64, true) == 16u << 10); // the floor
  CHECK(shm_p2p_ring_bytes(91) == 8u << 10);        // 91 x 90 rings of 8 KiB: 63.98 MiB
  CHECK(shm_p2p_ring_bytes(92) == 4u << 10);
  CHECK(shm_p2p_ring_bytes(512) == 4u << 10);       // the floor
  for (int n : {2, 3, 5, 16, 64, 128})
    for (bool share_cores : {false, true}) {
      CAPTURE(n);
      CAPTURE(share_cores);
      const std::size_t cap = shm_p2p_ring_bytes(n, share_cores);
      CHECK(dpkit::detail::shm_p2p_ring_bytes_valid(cap));
      CHECK(dpkit::detail::shm_p2p_area_bytes(n, cap) % 4096 == 0);
      CHECK(dpkit::detail::shm_p2p_area_bytes(n, cap) >=
            static_cast<std::size_t>(n) * 64 +
                static_cast<std::size_t>(n * (n - 1)) * (sizeof(dpkit::detail::shm_p2p_ring_ctl) + cap));
    }
  CHECK(!dpkit::detail::shm_p2p_ring_bytes_valid(0));
  CHECK(!dpkit::detail::shm_p2p_ring_bytes_valid(2048));
  CHECK(!dpkit::detail::shm_p2p_ring_bytes_valid(12u << 10));
  CHECK(!dpkit::detail::shm_p2p_ring_bytes_valid(32u << 20));
}

TEST_CASE("shm p2p: every pair of 3 ranks (threads), sizes from 0 bytes to 4 ring lengths, one tag reused, "
          "receives posted before and after their sends") {
  const int n = 3;
  // through the rings only, and with every message of 4 KiB or more read
  // from the sender's memory (a request to send, acknowledged)
  std::size_t cma = SIZE_MAX;
  bool share_cores = false;
  SUBCASE("rings only") {}
  SUBCASE("single copy from 4 KiB") { cma = 4096; }
  SUBCASE("rings only, the rings of ranks that share cores") { share_cores = true; }
  CAPTURE(cma);
  CAPTURE(share_cores);
  area a(n, share_cores);
  const std::vector<std::size_t> sizes = {0,     1,          15,         16,    17, 4095, 4096, a.ring / 4, a.ring / 4 + 1,
                                          65537, a.ring - 16, a.ring + 1, (256u << 10) - 16, (1u << 20) + 3};
  const auto errors = p2p_test::exchange_matrix(n, sizes, [&](int r) { return std::make_unique<shm_p2p>(r, n, a.mem, a.ring, cma); });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
  }
}

TEST_CASE("shm p2p: a message that arrives before its receive, partly, is completed into the receive") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, SIZE_MAX), r(1, 2, a.mem, a.ring, SIZE_MAX);
  const std::size_t n = (3u << 20) + 5; // 12 ring lengths
  const auto data = pattern(0, 1, 0, n);
  auto send = s.post_send(data.data(), n, 1, 42);
  CHECK(pending(*send)); // more than a ring: the rest waits for space
  r.progress();          // the receiver takes what is there into an early buffer
  s.progress();
  r.progress();
  std::vector<std::byte> got(n);
  auto recv = r.post_recv(got.data(), n, 0, 42);
  drive({&s, &r}, *recv);
  drive({&s, &r}, *send);
  CHECK(recv->state.load() == shm_p2p_op::done);
  CHECK(send->state.load() == shm_p2p_op::done);
  CHECK(got == data);
  // a complete early message of 0 bytes, and a complete small one
  const auto small = pattern(0, 1, 1, 100);
  auto s0 = s.post_send(nullptr, 0, 1, 5);
  auto s1 = s.post_send(small.data(), small.size(), 1, 5);
  CHECK(!pending(*s0));
  CHECK(!pending(*s1));
  r.progress();
  std::vector<std::byte> g0, g1(100);
  auto r0 = r.post_recv(g0.data(), 0, 0, 5);
  auto r1 = r.post_recv(g1.data(), 100, 0, 5);
  CHECK(r0->state.load() == shm_p2p_op::done);
  CHECK(r1->state.load() == shm_p2p_op::done);
  CHECK(g1 == small);
}

TEST_CASE("shm p2p: a small send behind a queued one waits its turn; with nothing queued it leaves and completes "
          "at once") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, SIZE_MAX), r(1, 2, a.mem, a.ring, SIZE_MAX);
  // nothing queued: a small send is in the ring and complete when post_send returns
  const auto first = pattern(0, 1, 0, 2048);
  auto s0 = s.post_send(first.data(), first.size(), 1, 7);
  CHECK(!pending(*s0));
  // a send of more than a ring stays queued; the small ones after it, of the
  // same tag and of another, must not overtake it (its fragments would be
  // interleaved with theirs)
  const std::size_t n = 3 * a.ring + 5;
  const auto big = pattern(0, 1, 1, n);
  const auto small = pattern(0, 1, 2, 64);
  const auto other = pattern(0, 1, 3, 16);
  auto s1 = s.post_send(big.data(), n, 1, 7);
  r.progress(); // the receiver drains the ring (into an early buffer): there is room again, s1 still queued
  auto s2 = s.post_send(small.data(), small.size(), 1, 7);
  auto s3 = s.post_send(other.data(), other.size(), 1, 8);
  CHECK(pending(*s1));
  CHECK(pending(*s2)); // queued behind s1, not written ahead of it
  CHECK(pending(*s3));
  std::vector<std::byte> g0(first.size()), g1(n), g2(small.size()), g3(other.size());
  auto r3 = r.post_recv(g3.data(), g3.size(), 0, 8);
  auto r0 = r.post_recv(g0.data(), g0.size(), 0, 7);
  auto r1 = r.post_recv(g1.data(), g1.size(), 0, 7);
  auto r2 = r.post_recv(g2.data(), g2.size(), 0, 7);
  for (auto* op : {r0.get(), r1.get(), r2.get(), r3.get()}) drive({&s, &r}, *op);
  for (auto* op : {r0.get(), r1.get(), r2.get(), r3.get(), s1.get(), s2.get(), s3.get()})
    CHECK_MESSAGE(op->state.load() == shm_p2p_op::done, op->error);
  CHECK(g0 == first);
  CHECK(g1 == big);
  CHECK(g2 == small);
  CHECK(g3 == other);
}

TEST_CASE("shm p2p: early messages below the single-copy threshold take the buffers the engine faulted in at "
          "start, and give them back; a larger one allocates its own") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, SIZE_MAX), r(1, 2, a.mem, a.ring, SIZE_MAX);
  const std::vector<std::size_t> start(dpkit::detail::shm_p2p_early_buffers,
                                       dpkit::detail::shm_p2p_early_buffer_bytes);
  CHECK(r.spare_capacities() == start);
  // as many early messages at once as there are buffers, 8 B to 64 KiB
  const std::size_t sizes[] = {8, 2048, 40000, dpkit::detail::shm_p2p_early_buffer_bytes};
  std::vector<std::shared_ptr<shm_p2p_op>> sends;
  for (int k = 0; k < 4; ++k) {
    const auto data = pattern(0, 1, k, sizes[k]);
    sends.push_back(s.post_send(data.data(), data.size(), 1, 100 + k));
    drive({&s, &r}, *sends.back()); // copied into the ring; data may go
    r.progress();                   // into an early buffer of r
  }
  CHECK(r.spare_capacities().empty()); // all four lent, none allocated
  for (int k = 0; k < 4; ++k) {
    std::vector<std::byte> got(sizes[k]);
    auto recv = r.post_recv(got.data(), got.size(), 0, 100 + k);
    drive({&s, &r}, *recv);
    CHECK(recv->state.load() == shm_p2p_op::done);
    CHECK(got == pattern(0, 1, k, sizes[k]));
  }
  CHECK(r.spare_capacities() == start); // given back, nothing more held
  // beyond the buffers' size: a buffer of its own, kept for reuse afterwards
  const std::size_t big = dpkit::detail::shm_p2p_early_buffer_bytes + 1;
  const auto data = pattern(0, 1, 9, big);
  auto send = s.post_send(data.data(), big, 1, 200);
  drive({&s, &r}, *send);
  r.progress();
  std::vector<std::byte> got(big);
  auto recv = r.post_recv(got.data(), big, 0, 200);
  drive({&s, &r}, *recv);
  CHECK(got == data);
  auto caps = r.spare_capacities();
  std::sort(caps.begin(), caps.end());
  auto want = start;
  want.push_back(big);
  CHECK(caps == want);
}

TEST_CASE("shm p2p: a receive whose length differs from its send fails naming both lengths; later messages still match") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring), r(1, 2, a.mem, a.ring);
  const auto d = pattern(0, 1, 0, 64);
  const auto d2 = pattern(0, 1, 1, 32);
  std::vector<std::byte> g(48), g2(32);
  SUBCASE("receive posted first") {
    auto recv = r.post_recv(g.data(), 48, 0, 1);
    s.post_send(d.data(), 64, 1, 1);
    drive({&s, &r}, *recv);
    CHECK(recv->state.load() == shm_p2p_op::failed);
    CHECK(recv->error.find("receive from rank 0 (tag 1, 48 bytes") != std::string::npos);
    CHECK(recv->error.find("matched a message of 64 bytes") != std::string::npos);
  }
  SUBCASE("message first") {
    s.post_send(d.data(), 64, 1, 1);
    r.progress();
    auto recv = r.post_recv(g.data(), 48, 0, 1);
    CHECK(recv->state.load() == shm_p2p_op::failed);
    CHECK(recv->error.find("matched a message of 64 bytes") != std::string::npos);
  }
  auto s2 = s.post_send(d2.data(), 32, 1, 1);
  auto r2 = r.post_recv(g2.data(), 32, 0, 1);
  drive({&s, &r}, *r2);
  CHECK(r2->state.load() == shm_p2p_op::done);
  CHECK(g2 == d2);
}

TEST_CASE("shm p2p: a withdrawn receive's buffer is never written; withdraw says whether the op was pending") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, SIZE_MAX), r(1, 2, a.mem, a.ring, SIZE_MAX);
  std::vector<std::byte> g(1u << 20, std::byte{0x5a});
  auto recv = r.post_recv(g.data(), g.size(), 0, 9);
  const auto d = pattern(0, 1, 0, g.size());
  auto send = s.post_send(d.data(), d.size(), 1, 9);
  r.progress(); // part of it lands in g
  CHECK(r.withdraw(*recv));
  CHECK(recv->state.load() == shm_p2p_op::failed);
  const auto snapshot = g;
  drive({&s, &r}, *send); // the rest is drained and dropped
  CHECK(g == snapshot);
  CHECK(!r.withdraw(*recv));
  CHECK(!s.withdraw(*send));
}

TEST_CASE("shm p2p: an unreceived message of another collective at the same sequence number is found") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring), r(1, 2, a.mem, a.ring);
  const int mine = dpkit::detail::checked_tag_base(5, 0x1234);
  const int theirs = dpkit::detail::checked_tag_base(5, 0x4321);
  const int later = dpkit::detail::checked_tag_base(6, 0x4321);
  std::byte b[8]{};
  s.post_send(b, 8, 1, later);
  r.progress();
  CHECK(r.foreign_message(0, mine) == 0); // another sequence number: not (yet) a mismatch
  s.post_send(b, 8, 1, theirs);
  r.progress();
  CHECK(r.foreign_message(0, mine) == theirs);
  CHECK(r.foreign_message(0, 12345) == 0); // an unchecked tag checks nothing
}

TEST_CASE("shm p2p: a damaged ring fails the pending operations instead of reading out of bounds") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring), r(1, 2, a.mem, a.ring);
  std::vector<std::byte> g(64);
  auto recv = r.post_recv(g.data(), 64, 0, 3);
  // write a fragment header claiming more than a ring holds at the head of the ring 0 -> 1
  auto* ctl = reinterpret_cast<dpkit::detail::shm_p2p_ring_ctl*>(a.mem + 2 * sizeof(dpkit::detail::shm_p2p_bell));
  auto* data = reinterpret_cast<std::byte*>(ctl) + sizeof(dpkit::detail::shm_p2p_ring_ctl);
  const dpkit::detail::shm_p2p_header h{3, 0xFFFFFFF0u, 64 | dpkit::detail::shm_p2p_published};
  std::memcpy(data, &h, sizeof h);
  r.progress();
  CHECK(recv->state.load() == shm_p2p_op::failed);
  CHECK(recv->error.find("damaged fragment header") != std::string::npos);
}

TEST_CASE("shm p2p: a receiver stops after the last published fragment and never reads what an earlier lap left "
          "in the ring beyond it") {
  // The receiver polls the header word at its tail instead of a head
  // counter; the sender clears the next header's word before it publishes a
  // fragment. Without that clearing, the junk below (zero-byte messages of
  // tag 5 with the published bit, as a ring's earlier lap can leave them
  // anywhere a header may fall) would complete a receive no rank sent.
  area a(2);
  auto* ring = a.mem + 2 * sizeof(dpkit::detail::shm_p2p_bell) + sizeof(dpkit::detail::shm_p2p_ring_ctl); // 0 -> 1
  const std::size_t cap = a.ring;
  const dpkit::detail::shm_p2p_header junk{5, 0, dpkit::detail::shm_p2p_published};
  for (std::size_t at = 16; at < cap; at += 16) std::memcpy(ring + at, &junk, sizeof junk); // 0 holds nothing yet
  shm_p2p s(0, 2, a.mem, a.ring), r(1, 2, a.mem, a.ring);
  std::vector<std::byte> g(8);
  auto ghost = r.post_recv(nullptr, 0, 0, 5);
  auto recv = r.post_recv(g.data(), g.size(), 0, 4);
  r.progress();
  CHECK(pending(*ghost)); // nothing published at 0 yet
  const auto d = pattern(0, 1, 0, 8);
  auto send = s.post_send(d.data(), d.size(), 1, 4); // fragment at 0..31: the word at 32 is cleared first
  CHECK(!pending(*send));
  drive({&s, &r}, *recv);
  CHECK(recv->state.load() == shm_p2p_op::done);
  CHECK(g == d);
  for (int k = 0; k < 100; ++k) r.progress();
  CHECK(pending(*ghost));
  auto zero = s.post_send(nullptr, 0, 1, 5); // a real one completes it
  drive({&s, &r}, *ghost);
  CHECK(ghost->state.load() == shm_p2p_op::done);
  CHECK(!pending(*zero));
}

TEST_CASE("shm p2p: a ring that something else filled with published-looking fragments at every position, 0 "
          "included, cannot keep progress() from returning") {
  // Junk acknowledgements of a send nobody made, each 32 bytes, cover the
  // whole ring: whatever the tail, the word there says "published", so a
  // receiver without the bound of one ring's length per call would loop in
  // progress() forever and no deadline of a wait around it could fire.
  area a(2);
  auto* ring = a.mem + 2 * sizeof(dpkit::detail::shm_p2p_bell) + sizeof(dpkit::detail::shm_p2p_ring_ctl); // 0 -> 1
  const std::size_t cap = a.ring;
  shm_p2p r(1, 2, a.mem, a.ring);
  std::vector<std::byte> g(8);
  auto recv = r.post_recv(g.data(), g.size(), 0, 4); // before the junk: posting reads the ring too
  const dpkit::detail::shm_p2p_header junk{0, (std::uint32_t{dpkit::detail::shm_p2p_ack} << 28) | 16,
                                           dpkit::detail::shm_p2p_published | 16};
  const std::uint64_t payload[2] = {0xdead'beefu, 0}; // an id no send of this engine has
  for (std::size_t at = 0; at < cap; at += 32) {
    std::memcpy(ring + at, &junk, sizeof junk);
    std::memcpy(ring + at + 16, payload, sizeof payload);
  }
  std::atomic<int> calls{0};
  std::thread t([&] {
    for (int k = 0; k < 3; ++k) {
      r.progress();
      ++calls;
    }
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (calls.load() < 3 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (calls.load() < 3) {
    // progress() does not return: the thread cannot be joined, so end here
    MESSAGE("progress() has not returned after 20 s on a ring full of published junk");
    std::fflush(nullptr);
    std::abort();
  }
  t.join();
  CHECK(pending(*recv)); // acknowledgements complete no receive
}

TEST_CASE("shm p2p: fail_all ends every pending send and receive with the reason") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, SIZE_MAX);
  std::vector<std::byte> big(1u << 20), g(8);
  auto send = s.post_send(big.data(), big.size(), 1, 1); // more than a ring: stays pending
  auto recv = s.post_recv(g.data(), 8, 1, 2);
  CHECK(pending(*send));
  CHECK(pending(*recv));
  s.fail_all("the transport failed (test)");
  CHECK(send->state.load() == shm_p2p_op::failed);
  CHECK(recv->state.load() == shm_p2p_op::failed);
  CHECK(recv->error == "the transport failed (test)");
}

TEST_CASE("shm p2p: a sleeping receiver is woken by the send") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring), r(1, 2, a.mem, a.ring);
  std::vector<std::byte> g(16);
  auto recv = r.post_recv(g.data(), 16, 0, 1);
  std::atomic<bool> woke{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread t([&] {
    while (pending(*recv)) {
      r.sleep(2'000'000); // 2 s: only the doorbell ends it early
      r.progress();
    }
    woke = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto d = pattern(0, 1, 0, 16);
  s.post_send(d.data(), 16, 1, 1);
  t.join();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  CHECK(woke.load());
  CHECK(ms < 1500);
  CHECK(g == d);
}

TEST_CASE("shm p2p: single copy: an early request to send is read when its receive is posted; a wrong length "
          "completes the send and fails the receive") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, 1024), r(1, 2, a.mem, a.ring, 1024);
  const auto d = pattern(0, 1, 0, 100000);
  auto send = s.post_send(d.data(), d.size(), 1, 4);
  r.progress(); // the request to send arrives first
  CHECK(pending(*send)); // until the receiver has read it
  std::vector<std::byte> g(d.size());
  auto recv = r.post_recv(g.data(), g.size(), 0, 4);
  CHECK(pending(*recv)); // read by the next progress(), not inside post_recv
  r.progress();
  CHECK(recv->state.load() == shm_p2p_op::done);
  CHECK(g == d);
  drive({&s, &r}, *send);
  CHECK(send->state.load() == shm_p2p_op::done);
  // a receive of another length
  auto send2 = s.post_send(d.data(), d.size(), 1, 4);
  r.progress();
  std::vector<std::byte> g2(d.size() - 8);
  auto recv2 = r.post_recv(g2.data(), g2.size(), 0, 4);
  CHECK(recv2->state.load() == shm_p2p_op::failed);
  CHECK(recv2->error.find("matched a message of 100000 bytes") != std::string::npos);
  drive({&s, &r}, *send2);
  CHECK(send2->state.load() == shm_p2p_op::done);
}

TEST_CASE("shm p2p: single copy: a read that fails fails the receive and the send, naming process_vm_readv") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, 1024), r(1, 2, a.mem, a.ring, 1024);
  // the sender has checked the single copy (its first large send), then its
  // doorbell line names a process that does not exist
  const auto d = pattern(0, 1, 0, 4096);
  std::vector<std::byte> g(d.size());
  auto recv0 = r.post_recv(g.data(), g.size(), 0, 1);
  auto send0 = s.post_send(d.data(), d.size(), 1, 1);
  drive({&s, &r}, *recv0);
  drive({&s, &r}, *send0);
  REQUIRE(recv0->state.load() == shm_p2p_op::done);
  reinterpret_cast<dpkit::detail::shm_p2p_bell*>(a.mem)[0].pid.store(0x7ffffff0);
  auto recv = r.post_recv(g.data(), g.size(), 0, 2);
  auto send = s.post_send(d.data(), d.size(), 1, 2);
  drive({&s, &r}, *recv);
  drive({&s, &r}, *send);
  CHECK(recv->state.load() == shm_p2p_op::failed);
  CHECK(recv->error.find("process_vm_readv") != std::string::npos);
  CHECK(send->state.load() == shm_p2p_op::failed);
  CHECK(send->error.find("could not read the message") != std::string::npos);
}

TEST_CASE("shm p2p: a sender runs at most the early budget and a ring ahead of receives not posted yet; "
          "posting them lets everything through, in order") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, SIZE_MAX), r(1, 2, a.mem, a.ring, SIZE_MAX);
  const std::size_t n = 64u << 10, count = 40; // 2.5 MiB: more than the budget (1 MiB) and the ring
  std::vector<std::vector<std::byte>> data;
  std::vector<std::shared_ptr<shm_p2p_op>> sends;
  for (std::size_t k = 0; k < count; ++k) {
    data.push_back(pattern(0, 1, static_cast<int>(k), n));
    sends.push_back(s.post_send(data.back().data(), n, 1, 6));
  }
  for (int i = 0; i < 50; ++i) {
    r.progress();
    s.progress();
  }
  std::size_t done = 0;
  for (auto& op : sends) done += op->state.load() == shm_p2p_op::done;
  CHECK(done < count); // held back: not all of it left
  CHECK(done * n <= (1u << 20) + a.ring + 2 * n);
  std::vector<std::vector<std::byte>> got(count, std::vector<std::byte>(n));
  std::vector<std::shared_ptr<shm_p2p_op>> recvs;
  for (std::size_t k = 0; k < count; ++k) recvs.push_back(r.post_recv(got[k].data(), n, 0, 6));
  drive({&s, &r}, *recvs.back());
  for (std::size_t k = 0; k < count; ++k) {
    CAPTURE(k);
    CHECK(recvs[k]->state.load() == shm_p2p_op::done);
    CHECK(got[k] == data[k]);
  }
}

TEST_CASE("shm p2p: single copy: a receive completes only once its acknowledgement is in the ring") {
  // A receiver that finished its receives and left while its acknowledgement
  // still waited for space would strand the sender's send (seen under ASan:
  // the sender's wait ended with the segment aborted by the leaver).
  bool share_cores = false;
  SUBCASE("small rings") {}
  SUBCASE("the rings of ranks that share cores") { share_cores = true; }
  area a(2, share_cores);
  shm_p2p s(0, 2, a.mem, a.ring, 1024), r(1, 2, a.mem, a.ring, 1024);
  // The ring from 1 to 0 filled to the last byte (0 does not drain yet): a
  // first message of 992 bytes (a 1008-byte fragment), then 1000-byte ones
  // (1024 each): `fit` of them take the rest of the ring (255 of 256 KiB, 7
  // of 8 KiB) but the 16 bytes kept for the next header's cleared word.
  const std::size_t fit = (a.ring - 1024) / 1024;
  const auto first = pattern(1, 0, 0, 992);
  r.post_send(first.data(), first.size(), 0, 7);
  const auto fill = pattern(1, 0, 0, 1000); // 301 of them: more than the rest of the ring holds
  std::vector<std::shared_ptr<shm_p2p_op>> fills; // below the single-copy size: through the ring
  for (int k = 0; k < 301; ++k) fills.push_back(r.post_send(fill.data(), 1000, 0, 8)); // ~300 KiB
  CHECK(!pending(*fills[fit - 1]));
  CHECK(pending(*fills[fit])); // the ring from 1 to 0 is full
  const auto d = pattern(0, 1, 0, 4096);
  auto send = s.post_send(d.data(), d.size(), 1, 9); // a request to send (4096 >= 1024)
  std::vector<std::byte> g(d.size());
  auto recv = r.post_recv(g.data(), g.size(), 0, 9);
  r.progress();
  CHECK(g == d);              // read already
  CHECK(pending(*recv));      // but its acknowledgement cannot be written yet
  CHECK(pending(*send));
  // rank 0 drains (the fill arrives early), the acknowledgement goes out
  std::vector<std::byte> got_first(first.size());
  s.post_recv(got_first.data(), got_first.size(), 1, 7);
  std::vector<std::vector<std::byte>> got(301, std::vector<std::byte>(1000));
  for (int k = 0; k < 301; ++k) s.post_recv(got[static_cast<std::size_t>(k)].data(), 1000, 1, 8);
  drive({&s, &r}, *recv);
  drive({&s, &r}, *send);
  CHECK(recv->state.load() == shm_p2p_op::done);
  CHECK(send->state.load() == shm_p2p_op::done);
}

TEST_CASE("shm p2p: single copy: a receive posted before its send reads the peer's message only after its own "
          "request to send has left, so the two reads of an exchange overlap") {
  // Every exchange of two ranks and every ring step posts the receive, then
  // the send. A read inside post_recv held this rank's request to send back
  // for the read's whole time, so the peer's read of it began only when this
  // one ended: a 2-rank 4 MiB exchange took 2x Open MPI's time.
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, 1024), r(1, 2, a.mem, a.ring, 1024);
  const auto d0 = pattern(0, 1, 0, 100000), d1 = pattern(1, 0, 0, 100000);
  std::vector<std::byte> g0(d1.size()), g1(d0.size());
  auto send0 = s.post_send(d0.data(), d0.size(), 1, 5); // rank 0's request to send is in the ring
  auto recv1 = r.post_recv(g1.data(), g1.size(), 0, 5);  // rank 1: receive, then send
  CHECK(pending(*recv1));                                 // not read yet ...
  auto send1 = r.post_send(d1.data(), d1.size(), 0, 5);
  auto recv0 = s.post_recv(g0.data(), g0.size(), 1, 5);
  s.progress(); // ... so rank 0 reads rank 1's message while rank 1's read of rank 0's is still to come
  CHECK(recv0->state.load() == shm_p2p_op::done);
  CHECK(g0 == d1);
  CHECK(pending(*recv1));
  r.progress();
  CHECK(recv1->state.load() == shm_p2p_op::done);
  CHECK(g1 == d0);
  drive({&s, &r}, *send0);
  drive({&s, &r}, *send1);
  CHECK(send0->state.load() == shm_p2p_op::done);
  CHECK(send1->state.load() == shm_p2p_op::done);
}

TEST_CASE("shm p2p: single copy: a receive withdrawn before its read never has its buffer written, and the send "
          "completes") {
  area a(2);
  shm_p2p s(0, 2, a.mem, a.ring, 1024), r(1, 2, a.mem, a.ring, 1024);
  const auto d = pattern(0, 1, 0, 8192);
  auto send = s.post_send(d.data(), d.size(), 1, 3);
  r.progress();
  std::vector<std::byte> g(d.size(), std::byte{0x5a});
  auto recv = r.post_recv(g.data(), g.size(), 0, 3); // matched; its read waits for progress()
  CHECK(r.withdraw(*recv));
  CHECK(recv->state.load() == shm_p2p_op::failed);
  for (int i = 0; i < 10; ++i) r.progress();
  CHECK(std::all_of(g.begin(), g.end(), [](std::byte b) { return b == std::byte{0x5a}; }));
  drive({&s, &r}, *send);
  CHECK(send->state.load() == shm_p2p_op::done);
}
