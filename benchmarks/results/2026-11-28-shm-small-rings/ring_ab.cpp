// The shared-memory engine with rings of two sizes in the same two
// processes: blocks of the tree all-reduce's 2-rank pattern (rank 1 sends n
// bytes, rank 0 receives, adds, sends back) alternate between an engine on
// an area with rings of A bytes and one with rings of B bytes, so the VM's
// fast and slow states fall on both alike; prints the medians and the
// per-block ratio A/B (above 1: the B rings are faster).
// With SHARE=1 both processes run on core 0 and yield while they wait (ranks
// that share a core).
// Build and run from the repository root:
//   c++ -O3 -DNDEBUG -std=c++20 -Iinclude -o /tmp/ring_ab benchmarks/results/2026-11-28-shm-small-rings/ring_ab.cpp
//   /tmp/ring_ab BLOCKS ITERS FLOATS A_BYTES B_BYTES     e.g. /tmp/ring_ab 200 500 512 262144 8192
#include <dpkit/transport/detail/shm_p2p.hpp>
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
static bool share = false;
template <class Op> static void spin(dpkit::detail::shm_p2p& e, Op& op) {
  while (op.state.load(std::memory_order_acquire) == dpkit::detail::p2p_op::pending) {
    e.progress();
    if (share) sched_yield(); else __builtin_ia32_pause();
  }
}
struct run {
  dpkit::detail::shm_p2p& e; int r; std::size_t n; std::vector<float> a, b, c;
  run(dpkit::detail::shm_p2p& e_, int r_, std::size_t n_) : e(e_), r(r_), n(n_), a(n_, 1.f), b(n_), c(n_) {}
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
  if (argc != 6) { std::fprintf(stderr, "usage: ring_ab BLOCKS ITERS FLOATS A_BYTES B_BYTES\n"); return 2; }
  const int blocks = std::atoi(argv[1]), iters = std::atoi(argv[2]); const std::size_t n = std::atoi(argv[3]);
  const std::size_t ra = std::strtoull(argv[4], nullptr, 10), rb = std::strtoull(argv[5], nullptr, 10);
  share = std::getenv("SHARE") && std::atoi(std::getenv("SHARE")) == 1;
  namespace N = dpkit::detail;
  if (!N::shm_p2p_ring_bytes_valid(ra) || !N::shm_p2p_ring_bytes_valid(rb)) { std::fprintf(stderr, "ring sizes: powers of two, 4 KiB-16 MiB\n"); return 2; }
  auto* aa = static_cast<std::byte*>(mmap(nullptr, N::shm_p2p_area_bytes(2, ra), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* ab = static_cast<std::byte*>(mmap(nullptr, N::shm_p2p_area_bytes(2, rb), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  N::shm_p2p::init_area(aa, 2, ra); N::shm_p2p::init_area(ab, 2, rb);
  pid_t child = fork(); const int r = child == 0 ? 1 : 0;
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(share ? 0 : r, &cs); sched_setaffinity(0, sizeof cs, &cs);
  N::shm_p2p::prefault(aa, r, 2, ra); N::shm_p2p::prefault(ab, r, 2, rb);
  N::shm_p2p ea(r, 2, aa, ra), eb(r, 2, ab, rb);
  run xa(ea, r, n), xb(eb, r, n);
  for (int i = 0; i < 2000; ++i) { xa.once(); xb.once(); }
  std::vector<double> ta(blocks), tb(blocks), q(blocks);
  for (int b = 0; b < blocks; ++b) {
    if (b % 2) { ta[b] = xa.block(iters); tb[b] = xb.block(iters); } else { tb[b] = xb.block(iters); ta[b] = xa.block(iters); }
    q[b] = ta[b] / tb[b];
  }
  if (r == 0) {
    std::sort(ta.begin(), ta.end()); std::sort(tb.begin(), tb.end()); std::sort(q.begin(), q.end());
    std::printf("n=%zu B ring A %zu median %.3f us | ring B %zu median %.3f us | A/B per block median %.3f (p25 %.3f p75 %.3f)%s\n",
                n * 4, ra, ta[blocks / 2], rb, tb[blocks / 2], q[blocks / 2], q[blocks / 4], q[3 * blocks / 4], share ? " [one core]" : "");
  }
  if (child) waitpid(child, nullptr, 0);
}
