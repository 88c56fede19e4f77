// What collective checking (docs/reliability.md) costs per call, measured
// side by side in one process so both sides see the same machine.
//
// Under mpirun (the figure docs/tuning.md quotes):
//   mpirun -np 2 build/benchmarks/check_cost_perf [-b blocks] [-s sizes]
// all-reduces float sum at 8 B, 64 KiB and 16 MiB (or -s 8,65536,...) over
// the mpi transport with ring, tree, shm and native, each in three variants:
//   off  an unchecked wrapper of the transport (it forwards only the
//        transport concept: no health, no sequence numbers, no fingerprints,
//        plain tags; what v0.1 did); for native, MPI_Allreduce itself,
//   L0   the checked transport at DPKIT_CHECK level 0 (health, sequence
//        numbers, plain tags; native: MPI_Iallreduce waited against the
//        deadline),
//   L1   level 1, the default (the fingerprint hash in every tag, the
//        fingerprint published in the shared segment; native: the call
//        check, inside the all-reduce up to 64 bytes).
// Blocks of calls of the variants alternate (in rotating order) `blocks`
// times; each block's time is the slowest rank's; the table gives the
// median per-call time of each variant and L1/off. shm has no unchecked
// variant (the shared segment is part of the checked transport), so its
// ratio is L1/L0.
//
// Without MPI (or with --inproc): a 1-rank inproc world runs allreduce_ring
// of 2 floats in a tight loop (validation, the collective scope and a local
// copy, no messages): the checking cost without any transport's noise.
#include <dpkit/dpkit.hpp>

#include "run_main.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef DPKIT_NO_MPI
#include <mpi.h>
#endif

// Forwards the transport concept's members only: not a checked_transport.
// Outside the anonymous namespace on purpose: with internal linkage GCC
// specializes the algorithm templates instantiated for it (IPA constant
// propagation clones) that it leaves alone for dpkit::mpi's (weak)
// instantiations, which made "off" faster for reasons that have nothing to
// do with checking.
namespace ccp {
template <class C>
struct unchecked {
  C* c;
  int rank() const { return c->rank(); }
  int size() const { return c->size(); }
  bool accepts(dpkit::memory_space s) const { return c->accepts(s); }
  auto isend(std::span<const std::byte> b, int p, int t) { return c->isend(b, p, t); }
  auto irecv(std::span<std::byte> b, int p, int t) { return c->irecv(b, p, t); }
  dpkit::detail::scratch_arena& scratch() { return c->scratch(); }
};
} // namespace ccp

namespace {

using clk = std::chrono::steady_clock;
using ccp::unchecked;

template <class C>
double ns_per_call(C& comm, long calls, int level) {
  std::vector<float> in(2, 1.0f), out(2);
  dpkit::collective_options o;
  o.check = level;
  const auto t0 = clk::now();
  for (long i = 0; i < calls; ++i) dpkit::allreduce_ring(comm, in, out, dpkit::reduce_op::sum, o);
  return std::chrono::duration<double, std::nano>(clk::now() - t0).count() / static_cast<double>(calls);
}

int run_inproc(long calls) {
  dpkit::inproc_world world(1);
  world.run([&](dpkit::inproc& comm) {
    unchecked<dpkit::inproc> u{&comm};
    double base = 1e30, l0 = 1e30, l1 = 1e30;
    for (int round = 0; round < 7; ++round) { // interleaved, best of 7 each: the machine is shared
      base = std::min(base, ns_per_call(u, calls, 1));
      l0 = std::min(l0, ns_per_call(comm, calls, 0));
      l1 = std::min(l1, ns_per_call(comm, calls, 1));
    }
    std::printf("# check_cost_perf: allreduce_ring of 2 floats on a 1-rank inproc world, %ld calls, best of 7 "
                "interleaved rounds\n",
                calls);
    std::printf("unchecked transport (v0.1 path)   %8.1f ns/call\n", base);
    std::printf("checked, DPKIT_CHECK=0            %8.1f ns/call  (+%.1f ns)\n", l0, l0 - base);
    std::printf("checked, DPKIT_CHECK=1 (default)  %8.1f ns/call  (+%.1f ns)\n", l1, l1 - base);
  });
  return 0;
}

#ifndef DPKIT_NO_MPI
double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

template <class C>
void call(C& comm, const std::string& algo, const std::vector<float>& in, std::vector<float>& out,
          const dpkit::collective_options& o) {
  if (algo == "ring") dpkit::allreduce_ring(comm, in, out, dpkit::reduce_op::sum, o);
  else if (algo == "tree") dpkit::allreduce_tree(comm, in, out, dpkit::reduce_op::sum, o);
  else if (algo == "native") {
    if constexpr (dpkit::native_collectives<C>)
      dpkit::allreduce(comm, in, out, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::native}, o);
  } else if constexpr (dpkit::shared_memory_transport<C>)
    dpkit::allreduce_shm(comm, in, out, dpkit::reduce_op::sum, o);
}

int run_mpi(int argc, char** argv) {
  int blocks = 41;
  int only = -1; // -v V: run variant V alone (0 off, 1 L0, 2 L1), for a profiler
  std::string only_algo = "ring"; // -a ALGO: the algorithm -v runs (ring, tree, shm, native)
  std::vector<std::size_t> sizes = {8, std::size_t{64} << 10, std::size_t{16} << 20};
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "-b" && i + 1 < argc) blocks = std::max(3, std::atoi(argv[++i]));
    else if (s == "-v" && i + 1 < argc) only = std::atoi(argv[++i]);
    else if (s == "-a" && i + 1 < argc) only_algo = argv[++i];
    else if (s == "-s" && i + 1 < argc) {
      sizes.clear();
      const std::string l = argv[++i];
      for (std::size_t p = 0; p <= l.size();) {
        const std::size_t q = std::min(l.find(',', p), l.size());
        sizes.push_back(std::strtoull(l.substr(p, q - p).c_str(), nullptr, 10));
        p = q + 1;
      }
    }
  }
  dpkit::mpi comm(MPI_COMM_WORLD);
  unchecked<dpkit::mpi> u{&comm};
  const int r = comm.rank();
  if (r == 0) {
    std::printf("# check_cost_perf: np=%d, float sum all-reduce, out of place, %d alternating blocks per variant; "
                "time per call in us (median over blocks of the slowest rank's block mean)\n",
                comm.size(), blocks);
    std::printf("%10s %6s %10s %10s %10s %8s %8s\n", "bytes", "algo", "off_us", "L0_us", "L1_us", "L0/off",
                "L1/off");
  }
  for (const std::size_t bytes : sizes) {
    const std::size_t count = std::max<std::size_t>(1, bytes / sizeof(float));
    std::vector<float> in(count), out(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i + static_cast<std::size_t>(r)) % 5);
    // About 2 ms per block at the size's expected speed (1 GB/s floor).
    const int per_block = static_cast<int>(std::clamp<double>(2e-3 / (2e-6 + static_cast<double>(bytes) / 1e9), 1, 500));
    for (const std::string algo : {"ring", "tree", "shm", "native"}) {
      if (algo == "shm" && !comm.shm()) continue;
      if (only >= 0 && algo != only_algo) continue;
      const bool has_off = algo != "shm";
      std::vector<double> t[3];
      dpkit::collective_options o0, o1;
      o0.check = 0;
      o1.check = 1;
      auto block = [&](int variant) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = clk::now();
        for (int k = 0; k < per_block; ++k) {
          if (variant == 0 && algo == "native") // off: MPI's own call, nothing of dpkit's
            MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm.native_handle());
          else if (variant == 0) call(u, algo, in, out, o1);
          else call(comm, algo, in, out, variant == 1 ? o0 : o1);
        }
        const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / per_block;
        t[variant].push_back(max_over_ranks(us));
      };
      for (int v = 0; v < 3; ++v) // warm-up
        if (v > 0 || has_off) block(v);
      for (auto& x : t) x.clear();
      for (int b = 0; b < blocks; ++b)
        for (int j = 0; j < 3; ++j) {
          const int v = only >= 0 ? only : (b + j) % 3; // rotating order: no variant always runs first
          if (v > 0 || has_off) block(v);
        }
      auto median = [](std::vector<double> v) {
        if (v.empty()) return 0.0;
        std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
        return v[v.size() / 2];
      };
      if (only >= 0) continue;
      const double off = median(t[0]), l0 = median(t[1]), l1 = median(t[2]);
      if (r == 0) {
        if (has_off)
          std::printf("%10zu %6s %10.3f %10.3f %10.3f %8.3f %8.3f\n", bytes, algo.c_str(), off, l0, l1, l0 / off,
                      l1 / off);
        else
          std::printf("%10zu %6s %10s %10.3f %10.3f %8s %8.3f  (L1/L0)\n", bytes, algo.c_str(), "-", l0, l1, "-",
                      l1 / l0);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
#endif

int check_cost_perf_main(int argc, char** argv) {
  bool inproc = false;
  long calls = 300000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--inproc") == 0) {
      inproc = true;
      if (i + 1 < argc) calls = std::atol(argv[++i]);
    }
  }
#ifdef DPKIT_NO_MPI
  return run_inproc(inproc && calls > 0 ? calls : 300000);
#else
  if (inproc) return run_inproc(calls > 0 ? calls : 300000);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int rc = run_mpi(argc, argv);
  MPI_Finalize();
  return rc;
#endif
}

} // namespace

// An error prints "check_cost_perf: rank R: <what>" and ends the whole job (examples/run_main.hpp).
int main(int argc, char** argv) {
  return dpkit_programs::run_main("check_cost_perf", [&] { return check_cost_perf_main(argc, argv); });
}
