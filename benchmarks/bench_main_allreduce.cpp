// The harness of allreduce_perf, compiled once (benchmarks/common/bench_main.hpp
// says why) into the bench_harness library. The all-reduce runs every
// algorithm dpkit has, so it has a TU of its own: with reduce_scatter_perf
// and reduce_perf in the same TU, that TU took 149-163 s at -O3 (GCC 12).
#include "bench.hpp"

template int dpkit_bench::bench_main<dpkit_bench::collective::allreduce>(int, char**);
