// The shared-memory engine before and after the receiver polled the
// fragments' own header words, in the same two processes: blocks of the tree
// all-reduce's 2-rank pattern (rank 1 sends n bytes, rank 0 receives, adds,
// sends back) alternate between the two engines, each on an area of its own,
// so the VM's fast and slow states fall on both alike; prints the medians
// and the per-block ratio new/old.
// Build and run from the repository root (2 processes, ranks on cores 0 and 1):
//   sh benchmarks/results/2026-11-28-shm-published-header/make_old_engine.sh
//   c++ -O3 -DNDEBUG -std=c++20 -Iinclude -I/tmp/dpkit-engine-ab -o /tmp/engine_ab \
//     benchmarks/results/2026-11-28-shm-published-header/engine_ab.cpp
//   /tmp/engine_ab BLOCKS ITERS FLOATS     e.g. /tmp/engine_ab 200 500 512
#include <dpkit/transport/detail/shm_p2p.hpp>
#include "old_engine.hpp"
#include <sys/mman.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
using clk = std::chrono::steady_clock;
template <class E, class Op> static void spin(E& e, Op& op) {
  while (op.state.load(std::memory_order_acquire) == dpkit::detail::p2p_op::pending) { e.progress(); __builtin_ia32_pause(); }
}
template <class E> struct run {
  E& e; int r; std::size_t n; std::vector<float> a, b, c;
  run(E& e_, int r_, std::size_t n_) : e(e_), r(r_), n(n_), a(n_, 1.f), b(n_), c(n_) {}
  void once() {
    if (r == 0) {
      auto q = e.post_recv(reinterpret_cast<std::byte*>(b.data()), n * 4, 1, 7); spin(e, *q);
      for (std::size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
      auto s = e.post_send(reinterpret_cast<const std::byte*>(c.data()), n * 4, 1, 8); spin(e, *s);
    } else {
      auto s = e.post_send(reinterpret_cast<const std::byte*>(a.data()), n * 4, 0, 7);
      auto q = e.post_recv(reinterpret_cast<std::byte*>(c.data()), n * 4, 0, 8); spin(e, *q); spin(e, *s);
    }
  }
  double block(int iters) { auto t0 = clk::now(); for (int i = 0; i < iters; ++i) once(); return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / iters; }
};
int main(int argc, char** argv) {
  const int blocks = std::atoi(argv[1]), iters = std::atoi(argv[2]); const std::size_t n = std::atoi(argv[3]);
  namespace N = dpkit::detail; namespace O = dpkit::detail::v0;
  auto* an = static_cast<std::byte*>(mmap(nullptr, N::shm_p2p_area_bytes(2, N::shm_p2p_ring_bytes(2, true)), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* ao = static_cast<std::byte*>(mmap(nullptr, O::shm_p2p_area_bytes(2), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  N::shm_p2p::init_area(an, 2, N::shm_p2p_ring_bytes(2, true)); O::shm_p2p::init_area(ao, 2);
  pid_t child = fork(); const int r = child == 0 ? 1 : 0;
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(r, &cs); sched_setaffinity(0, sizeof cs, &cs);
  N::shm_p2p::prefault(an, r, 2, N::shm_p2p_ring_bytes(2, true)); O::shm_p2p::prefault(ao, r, 2);
  N::shm_p2p en(r, 2, an, N::shm_p2p_ring_bytes(2, true)); O::shm_p2p eo(r, 2, ao); // 256 KiB rings, as when this was recorded
  run<N::shm_p2p> rn(en, r, n); run<O::shm_p2p> ro(eo, r, n);
  for (int i = 0; i < 2000; ++i) { rn.once(); ro.once(); }
  std::vector<double> tn(blocks), to(blocks), q(blocks);
  for (int b = 0; b < blocks; ++b) {
    if (b % 2) { tn[b] = rn.block(iters); to[b] = ro.block(iters); } else { to[b] = ro.block(iters); tn[b] = rn.block(iters); }
    q[b] = tn[b] / to[b];
  }
  if (r == 0) {
    std::sort(tn.begin(), tn.end()); std::sort(to.begin(), to.end()); std::sort(q.begin(), q.end());
    std::printf("n=%zu old median %.3f p10 %.3f | new median %.3f p10 %.3f | new/old per block median %.3f (p25 %.3f p75 %.3f)\n", n * 4, to[blocks / 2], to[blocks / 10], tn[blocks / 2], tn[blocks / 10], q[blocks / 2], q[blocks / 4], q[3 * blocks / 4]);
  }
  if (child) waitpid(child, nullptr, 0);
}
