// The launch's transport against mpirun's in one job: under mpirun, each of
// 2 ranks holds both a dpkit::mpi (point-to-point over Open MPI's vader, what
// an mpirun-launched allreduce_perf uses) and a gloo_transport met through a
// tcp:// store (its shared-memory engine, what a store-launched or torchrun
// one uses); blocks of 20 calls alternate between the two, so the VM's fast
// and slow states fall on both alike. Prints per mode the medians of the
// block means and the per-block ratio store/mpi. Modes: 0 allreduce_tree of
// FLOATS floats (page-aligned buffers, as allreduce_perf's), 1 the same
// pattern on the bare requests (rank 1 sends, rank 0 receives, adds, sends
// back).
// Build and run from the repository root:
//   c++ -O3 -DNDEBUG -std=c++20 -DOMPI_SKIP_MPICXX=1 -DDPKIT_WITH_MPI=1 -DDPKIT_WITH_GLOO=1 -pthread -Iinclude \
//     $(pkg-config --cflags ompi hiredis) -o /tmp/transport_ab \
//     benchmarks/results/2026-11-28-shm-published-header/transport_ab.cpp $(pkg-config --libs ompi hiredis) -lgloo
//   PORT=29555 OMPI_MCA_btl=self,vader mpirun -x PORT -np 2 /tmp/transport_ab BLOCKS FLOATS MODE...
//   e.g. /tmp/transport_ab 300 512 0 1
#include <dpkit/dpkit.hpp>
#include <dpkit/transport/launch.hpp>
#include <dpkit/transport/mpi.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

using clk = std::chrono::steady_clock;

template <class C>
void once(C& comm, int mode, std::span<const float> in, std::span<float> out, std::span<float> tmp) {
  if (mode == 0) {
    dpkit::allreduce_tree(comm, in, out);
    return;
  }
  const auto d = dpkit::deadline_after(std::chrono::seconds(100));
  if (comm.rank() == 0) {
    auto q = comm.irecv(std::as_writable_bytes(tmp), 1, 7);
    q.wait(d);
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] + tmp[i];
    auto s = comm.isend(std::as_bytes(std::span<const float>(out)), 1, 8);
    s.wait(d);
  } else {
    auto s = comm.isend(std::as_bytes(in), 0, 7);
    auto q = comm.irecv(std::as_writable_bytes(out), 0, 8);
    q.wait(d);
    s.wait(d);
  }
}

template <class C>
double block(C& comm, int mode, std::span<const float> in, std::span<float> out, std::span<float> tmp) {
  constexpr int iters = 20; // allreduce_perf's default -n
  once(comm, mode, in, out, tmp);
  dpkit::barrier(comm);
  const auto t0 = clk::now();
  for (int i = 0; i < iters; ++i) once(comm, mode, in, out, tmp);
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / iters;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (argc < 4 || !std::getenv("PORT")) {
    std::fprintf(stderr, "usage: PORT=P mpirun -x PORT -np 2 %s BLOCKS FLOATS MODE...\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const int blocks = std::atoi(argv[1]);
  const std::size_t n = static_cast<std::size_t>(std::atol(argv[2]));
  {
    dpkit::mpi m;
    const dpkit::launch_info job{"tcp://127.0.0.1:" + std::string(std::getenv("PORT")), m.rank(), m.size()};
    dpkit::gloo_transport g = dpkit::connect_launch(job);
    const std::size_t bytes = (n * sizeof(float) + 4095) / 4096 * 4096;
    auto* inp = static_cast<float*>(::operator new[](bytes, std::align_val_t{4096}));
    auto* outp = static_cast<float*>(::operator new[](bytes, std::align_val_t{4096}));
    std::vector<float> tmp(n);
    std::fill(inp, inp + n, 1.f);
    const std::span<const float> in(inp, n);
    const std::span<float> out(outp, n);
    for (int a = 3; a < argc; ++a) {
      const int mode = std::atoi(argv[a]);
      std::vector<double> tm(static_cast<std::size_t>(blocks)), ts(tm), ratio(tm);
      for (std::size_t b = 0; b < tm.size(); ++b) {
        if (b % 2) {
          tm[b] = block(m, mode, in, out, tmp);
          ts[b] = block(g, mode, in, out, tmp);
        } else {
          ts[b] = block(g, mode, in, out, tmp);
          tm[b] = block(m, mode, in, out, tmp);
        }
        ratio[b] = ts[b] / tm[b];
      }
      std::sort(tm.begin(), tm.end());
      std::sort(ts.begin(), ts.end());
      std::sort(ratio.begin(), ratio.end());
      const std::size_t h = tm.size() / 2, q1 = tm.size() / 4, q3 = 3 * tm.size() / 4;
      if (m.rank() == 0)
        std::printf("%s %zu B: mpi median %.3f us | store median %.3f us | store/mpi per block median %.3f "
                    "(p25 %.3f p75 %.3f)\n",
                    mode == 0 ? "allreduce_tree" : "requests", n * sizeof(float), tm[h], ts[h], ratio[h], ratio[q1],
                    ratio[q3]);
    }
    ::operator delete[](inp, std::align_val_t{4096});
    ::operator delete[](outp, std::align_val_t{4096});
  }
  MPI_Finalize();
}
