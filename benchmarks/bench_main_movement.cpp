// The harness of the data-movement *_perf programs, compiled once
// (benchmarks/common/bench_main.hpp says why): allgather_perf and
// broadcast_perf link it from the bench_harness library.
#include "bench.hpp"

template int dpkit_bench::bench_main<dpkit_bench::collective::allgather>(int, char**);
template int dpkit_bench::bench_main<dpkit_bench::collective::broadcast>(int, char**);
