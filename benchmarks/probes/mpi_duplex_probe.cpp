// How fast two ranks move a message each way at once over MPI, whole or in
// fragments: the instrument behind dpkit::mpi's fragments between nodes
// (inter_fragment_bytes; benchmarks/results/2026-11-26-cluster-fragments.md).
// Plain MPI, no dpkit. Rank 0 and 1 (put them on two nodes:
// `scripts/cluster.sh run -np 2 --map-by node build/benchmarks/probes/mpi_duplex_probe`):
//   one-way   rank 0 sends BYTES to rank 1 (MPI_Send / MPI_Recv)
//   whole     both send BYTES to each other at once (MPI_Sendrecv)
//   fragments both send BYTES as fragments of F bytes, at most W receives and
//             W sends posted at a time (W = 0: all at once), for each F, W
// Prints MB/s per direction, the median of 5 runs after one warm-up.
//   mpi_duplex_probe [BYTES (33554432)] [F,F,... (1048576,61440,32768)] [W,W,... (0,2,16)]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {
std::vector<std::size_t> list(const char* s, const char* fallback) {
  std::vector<std::size_t> v;
  std::stringstream ss(s ? s : fallback);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::strtoull(x.c_str(), nullptr, 10));
  return v;
}
} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "mpi_duplex_probe: run with 2 ranks (one per node)\n");
    MPI_Finalize();
    return 2;
  }
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{32} << 20;
  const auto frags = list(argc > 2 ? argv[2] : nullptr, "1048576,61440,32768");
  const auto windows = list(argc > 3 ? argv[3] : nullptr, "0,2,16");
  std::vector<char> a(n, 1), b(n, 2);
  const int peer = rank ^ 1;
  auto timed = [&](auto&& body) {
    std::vector<double> t;
    for (int i = 0; i < 6; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      body();
      MPI_Barrier(MPI_COMM_WORLD);
      if (i > 0) t.push_back(MPI_Wtime() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  auto report = [&](const std::string& what, double s) {
    if (rank == 0) std::printf("%-36s %10zu B  %8.1f ms  %7.1f MB/s per direction\n", what.c_str(), n, s * 1e3, n / s / 1e6);
  };
  report("one-way", timed([&] {
    if (rank == 0) MPI_Send(a.data(), static_cast<int>(n), MPI_BYTE, peer, 0, MPI_COMM_WORLD);
    else MPI_Recv(b.data(), static_cast<int>(n), MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }));
  report("whole, both ways", timed([&] {
    MPI_Sendrecv(a.data(), static_cast<int>(n), MPI_BYTE, peer, 1, b.data(), static_cast<int>(n), MPI_BYTE, peer, 1,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }));
  for (std::size_t f : frags)
    for (std::size_t w : windows) {
      const std::size_t k = (n + f - 1) / f, win = w == 0 ? k : w;
      std::vector<MPI_Request> rq(k), sq(k);
      report("fragments of " + std::to_string(f) + ", window " + (w == 0 ? std::string("all") : std::to_string(w)),
             timed([&] {
               std::size_t rp = 0, sp = 0, rd = 0, sd = 0;
               while (rd < k || sd < k) {
                 for (; sp < k && sp - sd < win; ++sp)
                   MPI_Isend(a.data() + sp * f, static_cast<int>(std::min(f, n - sp * f)), MPI_BYTE, peer, 2,
                             MPI_COMM_WORLD, &sq[sp]);
                 for (; rp < k && rp - rd < win; ++rp)
                   MPI_Irecv(b.data() + rp * f, static_cast<int>(std::min(f, n - rp * f)), MPI_BYTE, peer, 2,
                             MPI_COMM_WORLD, &rq[rp]);
                 int flag = 0;
                 if (rd < rp) {
                   MPI_Test(&rq[rd], &flag, MPI_STATUS_IGNORE);
                   if (flag) ++rd;
                 }
                 if (sd < sp) {
                   MPI_Test(&sq[sd], &flag, MPI_STATUS_IGNORE);
                   if (flag) ++sd;
                 }
               }
             }));
    }
  MPI_Finalize();
  return 0;
}
