// broadcast_perf: nccl-tests' broadcast_perf for dpkit (tree, native = MPI_Bcast,
// auto). busbw = algbw. -r root (default 0; -1: every root in turn).
#include "bench_main.hpp"

int main(int argc, char** argv) { return dpkit_bench::bench_main<dpkit_bench::collective::broadcast>(argc, argv); }
