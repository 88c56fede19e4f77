// shm_probe: a small standalone timing program for the shared-memory
// all-reduce, outside the shared benchmark harness: float sum,
// out-of-place and in-place, sizes 8 B .. max, dpkit shm (by size), shm1
// (one-shot), shm2 (two-shot), ring, tree, auto, and native MPI_Allreduce
// (whatever coll component mpirun selects: default coll/tuned, or
// `--mca coll_sm_priority 100` for coll/sm). Buffers rotate through a pool of
// at least 64 MiB so small sizes are not cache-warm artifacts. Prints one
// line per (size, algorithm): time in us (max over ranks of the mean), algbw
// GB/s, #wrong (integer-valued data, compared with the exact sum). With -b it
// also measures the copy and reduce bandwidth of the machine on the same
// rotating buffers, all ranks at once (the bound of a shared-memory
// all-reduce). Its runs: benchmarks/results/2026-11-23-shm-allreduce-first-runs.md
// and 2026-11-23-shm-two-shot-two-ranks.md.
//
//   ninja -C build benchmarks/probes/shm_probe
//   mpirun -n 2 build/benchmarks/probes/shm_probe [-e max_bytes] [-A shm,ring,...] [-b]
#include <dpkit/dpkit.hpp>

#include <mpi.h>

#include "run_main.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

struct pool {
  std::vector<std::vector<float>> in, out;
  pool(std::size_t count, int rank) {
    const std::size_t bytes = std::max<std::size_t>(count * sizeof(float), 64);
    std::size_t k = std::max<std::size_t>(2, (64u << 20) / bytes);
    k = std::min<std::size_t>(k, 64);
    if (count * sizeof(float) >= (64u << 20)) k = 1;
    in.resize(k);
    out.resize(k);
    for (std::size_t j = 0; j < k; ++j) {
      in[j].resize(count);
      out[j].assign(count, 0.f);
      for (std::size_t i = 0; i < count; ++i) in[j][i] = static_cast<float>((i + static_cast<std::size_t>(rank)) % 5);
    }
  }
};

void run_algo(dpkit::mpi& comm, const std::string& a, const std::vector<float>& in, std::vector<float>& out,
              bool in_place) {
  // In place is the out-of-place call with out as both buffers, as dpkit's
  // one-buffer overloads do.
  const std::vector<float>& src = in_place ? out : in;
  if (a == "shm") dpkit::allreduce_shm(comm, src, out);
  else if (a == "shm1") dpkit::allreduce_shm_one_shot(comm, src, out);
  else if (a == "shm2") dpkit::allreduce_shm_two_shot(comm, src, out);
  else if (a == "ring") dpkit::allreduce_ring(comm, src, out);
  else if (a == "tree") dpkit::allreduce_tree(comm, src, out);
  else if (a == "auto") dpkit::allreduce(comm, src, out);
  else if (a == "native") { // MPI_Allreduce itself, as allreduce_perf's native_deadline = false
    MPI_Allreduce(in_place ? MPI_IN_PLACE : in.data(), out.data(), static_cast<int>(out.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  }
}

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

int shm_probe_main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  std::size_t max_bytes = std::size_t{256} << 20;
  std::vector<std::string> algos = {"shm", "shm1", "shm2", "ring", "tree", "auto", "native"};
  bool bound = false;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "-e" && i + 1 < argc) max_bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (s == "-b") bound = true;
    else if (s == "-A" && i + 1 < argc) {
      algos.clear();
      std::string l = argv[++i];
      for (std::size_t p = 0; p <= l.size();) {
        const std::size_t q = std::min(l.find(',', p), l.size());
        algos.push_back(l.substr(p, q - p));
        p = q + 1;
      }
    }
  }
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    const int n = comm.size(), r = comm.rank();
    if (r == 0)
      std::printf("# shm_probe: np=%d, float sum, shm %s, times in us (max over ranks of the mean)\n", n,
                  comm.shm() ? "available" : "UNAVAILABLE");
    if (r == 0) std::printf("%12s %6s %8s %12s %9s %7s\n", "bytes", "place", "algo", "time_us", "algbw", "#wrong");
    for (std::size_t bytes = 8; bytes <= max_bytes; bytes *= (bytes < (1u << 20) ? 4 : 2)) {
      const std::size_t count = bytes / sizeof(float);
      pool P(count, r);
      const int iters = bytes <= (64u << 10) ? 2000 : bytes <= (4u << 20) ? 100 : bytes <= (32u << 20) ? 12 : 4;
      for (bool in_place : {false, true})
        for (const auto& a : algos) {
          auto one = [&](std::size_t j) {
            if (in_place) P.out[j] = P.in[j]; // not timed (below)
            run_algo(comm, a, P.in[j], P.out[j], in_place);
          };
          // Warm up, then time; in place restores the input outside the timed region per call.
          for (int w = 0; w < 3; ++w) one(static_cast<std::size_t>(w) % P.in.size());
          MPI_Barrier(MPI_COMM_WORLD);
          double total = 0;
          long wrong = 0;
          for (int it = 0; it < iters; ++it) {
            const std::size_t j = static_cast<std::size_t>(it) % P.in.size();
            if (in_place) std::memcpy(P.out[j].data(), P.in[j].data(), bytes);
            const auto t0 = clk::now();
            run_algo(comm, a, P.in[j], P.out[j], in_place);
            total += std::chrono::duration<double>(clk::now() - t0).count();
            if (it == iters - 1)
              for (std::size_t i = 0; i < count; ++i) {
                double e = 0;
                for (int p = 0; p < n; ++p) e += static_cast<double>((i + static_cast<std::size_t>(p)) % 5);
                if (static_cast<double>(P.out[j][i]) != e) ++wrong;
              }
          }
          const double us = max_over_ranks(total / iters * 1e6);
          long wsum = 0;
          MPI_Allreduce(&wrong, &wsum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
          if (r == 0)
            std::printf("%12zu %6s %8s %12.2f %9.3f %7ld\n", bytes, in_place ? "in" : "out", a.c_str(), us,
                        static_cast<double>(bytes) / us / 1e3, wsum);
          std::fflush(stdout);
        }
      if (bound && bytes >= (64u << 10)) {
        // Copy (memcpy in -> out) and reduce (out = in + in2) on the rotating buffers, all ranks at once.
        for (int kind = 0; kind < 2; ++kind) {
          MPI_Barrier(MPI_COMM_WORLD);
          double total = 0;
          for (int it = 0; it < iters; ++it) {
            const std::size_t j = static_cast<std::size_t>(it) % P.in.size();
            const std::size_t j2 = (j + 1) % P.in.size();
            const auto t0 = clk::now();
            if (kind == 0) std::memcpy(P.out[j].data(), P.in[j].data(), bytes);
            else dpkit::reduce_host(P.out[j].data(), P.in[j].data(), P.in[j2].data(), count, dpkit::reduce_op::sum);
            total += std::chrono::duration<double>(clk::now() - t0).count();
          }
          const double us = max_over_ranks(total / iters * 1e6);
          if (r == 0)
            std::printf("%12zu %6s %8s %12.2f %9.3f %7s\n", bytes, "-", kind == 0 ? "memcpy" : "reduce", us,
                        static_cast<double>(bytes) / us / 1e3, "-");
        }
      }
    }
  }
  MPI_Finalize();
  return 0;
}

} // namespace

// An error prints "shm_probe: rank R: <what>" and ends the whole job (examples/run_main.hpp).
int main(int argc, char** argv) {
  return dpkit_programs::run_main("shm_probe", [&] { return shm_probe_main(argc, argv); });
}
