// The probe of benchmarks/results/2026-11-28-store-launch-latency.md (a lab
// instrument, not built by meson): N in-place float all-reduces of one size
// on a store launch (torch's env:// variables), tree or ring (ALG=ring),
// then percentiles of the per-call time in microseconds. Build from the
// repository root:
//   c++ -Iinclude -std=c++20 -O2 -DNDEBUG -DDPKIT_WITH_GLOO=1 -isystem/usr/include/hiredis -pthread \
//       benchmarks/results/2026-11-28-store-launch-latency/p2p_latency_probe.cpp -o probe \
//       /usr/lib/libgloo.so.0.5.0 -lhiredis
// Run (two ranks, bound as mpirun binds):
//   for r in 1 0; do RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
//     MASTER_PORT=29500 taskset -c $r ./probe 2048 50000 & done; wait
#include <dpkit/transport/launch.hpp>
#include <dpkit/dpkit.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cstdlib>
#include <algorithm>
#include <string>
int main(int argc, char** argv) { bool ring = std::getenv("ALG") && std::string(std::getenv("ALG")) == "ring";
  auto job = dpkit::launch_from_env();
  auto comm = dpkit::connect_launch(*job);
  std::size_t n = std::atoi(argv[1]) / 4;
  int iters = std::atoi(argv[2]);
  std::vector<float> in(n, 1.f);
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    auto a = std::chrono::steady_clock::now();
    if (ring) dpkit::allreduce_ring(comm, dpkit::tensor_view<float>{in.data(), n, dpkit::memory_space::host}); else dpkit::allreduce_tree(comm, dpkit::tensor_view<float>{in.data(), n, dpkit::memory_space::host});
    t[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
  }
  std::sort(t.begin(), t.end());
  std::printf("rank %d: p10 %.2f p50 %.2f p90 %.2f p99 %.2f max %.1f mean %.2f\n", comm.rank(), t[iters/10], t[iters/2], t[iters*9/10], t[iters*99/100], t[iters-1], [&]{double s=0; for(double x: t) s+=x; return s/iters;}());
}
