// per-call times of the hierarchical all-reduce under a launch without mpirun; prints calls over 2 ms
#include <dpkit/dpkit.hpp>
#include <dpkit/transport/launch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char** argv) {
  const std::size_t bytes = std::strtoul(argv[1], nullptr, 10);
  const int iters = std::atoi(argv[2]);
  auto job = dpkit::launch_from_env();
  dpkit::gloo_transport comm = dpkit::connect_launch(*job);
  std::vector<float> x(bytes / 4, 1.0f);
  dpkit::allreduce_policy pol; pol.algo = dpkit::algorithm::hierarchical;
  for (int i = 0; i < 20; ++i) dpkit::allreduce(comm, x, dpkit::reduce_op::sum, pol);
  std::vector<double> t(iters);
  auto T0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    auto a = std::chrono::steady_clock::now();
    dpkit::allreduce(comm, x, dpkit::reduce_op::sum, pol);
    t[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
  }
  double tot = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - T0).count();
  std::vector<double> s = t; std::sort(s.begin(), s.end());
  std::printf("rank %d: %d calls %.1f ms; median %.0f us p99 %.0f max %.0f; >2ms:", comm.rank(), iters, tot, s[iters/2], s[iters*99/100], s.back());
  for (int i = 0; i < iters; ++i) if (t[i] > 2000) std::printf(" %d:%.1f", i, t[i] / 1000);
  std::printf("\n");
}
