// The harness of reduce_scatter_perf and reduce_perf, compiled once
// (benchmarks/common/bench_main.hpp says why) into the bench_harness library;
// allreduce_perf's is bench_main_allreduce.cpp.
#include "bench.hpp"

template int dpkit_bench::bench_main<dpkit_bench::collective::reduce_scatter>(int, char**);
template int dpkit_bench::bench_main<dpkit_bench::collective::reduce>(int, char**);
