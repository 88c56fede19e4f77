// allreduce_perf: nccl-tests' all_reduce_perf for dpkit (ring, tree, native =
// MPI_Allreduce, auto = dpkit::allreduce's policy). busbw = algbw x 2(n-1)/n.
#include "bench_main.hpp"

int main(int argc, char** argv) { return dpkit_bench::bench_main<dpkit_bench::collective::allreduce>(argc, argv); }
