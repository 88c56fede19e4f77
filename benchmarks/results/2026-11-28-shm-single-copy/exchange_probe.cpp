// The probe of benchmarks/results/2026-11-28-shm-single-copy.md (a lab instrument, not built by
// meson): point-to-point messages of SZ bytes between 2 ranks, ping-pong or (XCH=1) an exchange
// (both ranks irecv, isend, wait), over dpkit::mpi under mpirun or gloo_transport from the env://
// variables; prints the median time per message in us. Build from the repository root:
//   mpicxx -DOMPI_SKIP_MPICXX=1 -Iinclude -std=c++20 -O2 -DNDEBUG -DDPKIT_WITH_GLOO=1 -DDPKIT_WITH_MPI=1 \
//     -isystem/usr/include/hiredis -pthread benchmarks/results/2026-11-28-shm-single-copy/exchange_probe.cpp -o pp /usr/lib/libgloo.so.0.5.0 -lhiredis
// Run: XCH=1 SZ=4194304 mpirun -np 2 -x XCH -x SZ ./pp 300; or, per rank r in 1 0: RANK=r WORLD_SIZE=2
//   LOCAL_RANK=r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P taskset -c r ./pp 300 &
#include <mpi.h>
#include <dpkit/transport/launch.hpp>
#include <dpkit/transport/mpi.hpp>
#include <dpkit/dpkit.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cstdlib>
#include <span>
template <class C> void run(C& comm, int iters) {
  int r = comm.rank(); auto dl = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (std::size_t bytes : {std::size_t(std::atol(getenv("SZ")))}) {
    std::vector<std::byte> a(bytes), b(bytes);
    std::vector<double> t(iters);
    for (int i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      if (std::getenv("XCH")) { auto q1 = comm.irecv(std::span<std::byte>(b), 1 - r, 7); auto q2 = comm.isend(std::span<const std::byte>(a), 1 - r, 7); q1.wait(dl); q2.wait(dl); }
      else if (r == 0) { comm.isend(std::span<const std::byte>(a), 1, 7).wait(dl); comm.irecv(std::span<std::byte>(b), 1, 8).wait(dl); }
      else { comm.irecv(std::span<std::byte>(b), 0, 7).wait(dl); comm.isend(std::span<const std::byte>(a), 0, 8).wait(dl); }
      t[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    std::sort(t.begin(), t.end());
    if (r == 0) std::printf("%zu %.2f  ", bytes, t[iters / 2] / 2);
  }
  if (r == 0) std::printf("\n");
}
int main(int argc, char** argv) {
  int iters = std::atoi(argv[1]);
  if (std::getenv("OMPI_COMM_WORLD_RANK")) {
    int p; MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &p);
    { dpkit::mpi comm; run(comm, iters); }
    MPI_Finalize();
  } else {
    auto job = dpkit::launch_from_env();
    auto comm = dpkit::connect_launch(*job);
    run(comm, iters);
  }
}
