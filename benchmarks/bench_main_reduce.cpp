// The harness of the reducing *_perf programs, compiled once
// (benchmarks/common/bench_main.hpp says why): allreduce_perf,
// reduce_scatter_perf and reduce_perf link it from the bench_harness library.
#include "bench.hpp"

template int dpkit_bench::bench_main<dpkit_bench::collective::allreduce>(int, char**);
template int dpkit_bench::bench_main<dpkit_bench::collective::reduce_scatter>(int, char**);
template int dpkit_bench::bench_main<dpkit_bench::collective::reduce>(int, char**);
