#include <mpi.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::size_t bytes = std::strtoul(argv[1], nullptr, 10); const int iters = std::atoi(argv[2]);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<float> x(bytes / 4, 1.0f), y(bytes / 4);
  for (int i = 0; i < 20; ++i) MPI_Allreduce(x.data(), y.data(), (int)x.size(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  std::vector<double> t(iters); auto T0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) { auto a = std::chrono::steady_clock::now();
    MPI_Allreduce(x.data(), y.data(), (int)x.size(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count(); }
  double tot = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - T0).count();
  std::vector<double> s = t; std::sort(s.begin(), s.end());
  std::printf("rank %d: %d calls %.1f ms; median %.0f us p99 %.0f max %.0f; >2ms:", rank, iters, tot, s[iters/2], s[iters*99/100], s.back());
  for (int i = 0; i < iters; ++i) if (t[i] > 2000) std::printf(" %d:%.1f", i, t[i] / 1000);
  std::printf("\n"); MPI_Finalize();
}
