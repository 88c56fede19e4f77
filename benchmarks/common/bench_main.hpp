// dpkit benchmarks: what a *_perf program's main needs, and no more. The five
// nccl-tests-style programs share one harness (bench.hpp), whose per-program
// entry point bench_main<K> is compiled once per collective in
// benchmarks/bench_main_allreduce.cpp, bench_main_reduce.cpp and
// bench_main_movement.cpp (the static
// library bench_harness, benchmarks/meson.build). Each program's own
// translation unit includes only this header:
//   int main(int argc, char** argv) { return dpkit_bench::bench_main<dpkit_bench::collective::allreduce>(argc, argv); }
// Why: the harness (CLI11 options, the MPI, in-process and Gloo runners, the
// launch without mpirun, tuning, reports) is most of each program's compile
// time, and the five programs compiled it five times: GCC 12 -O3, 89-119 s
// of CPU each, 517 s for the five, against 306 s for the two TUs here
// (benchmarks/results/2026-12-03-ci-time-cuts.md).
#pragma once

namespace dpkit_bench {

/// The five collectives the *_perf programs measure.
enum class collective { allreduce, reduce_scatter, allgather, broadcast, reduce };

/// A *_perf program: parses nccl-tests' flags (docs/benchmarks.md), runs the
/// size sweep of collective K over the transport the launch implies (MPI
/// under mpirun, in-process threads with -t N, Gloo with --rendezvous or
/// torch's env:// variables) and prints nccl-tests' table. Returns the
/// process's exit status: 0 on success, non-zero on a bad flag, a usage error
/// or a failed -c check (CLI11's code for --help and parse errors); an error
/// on a rank prints "<program>: rank R: <what>" and ends the whole job
/// (examples/run_main.hpp). Defined in bench_runner.hpp.
template <collective K>
int bench_main(int argc, char** argv);

// Compiled once, in benchmarks/bench_main_{reduce,movement}.cpp.
extern template int bench_main<collective::allreduce>(int, char**);
extern template int bench_main<collective::reduce_scatter>(int, char**);
extern template int bench_main<collective::reduce>(int, char**);
extern template int bench_main<collective::allgather>(int, char**);
extern template int bench_main<collective::broadcast>(int, char**);

} // namespace dpkit_bench
