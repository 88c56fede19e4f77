// reduce_scatter_perf: nccl-tests' reduce_scatter_perf for dpkit (ring, native =
// MPI_Reduce_scatter_block, auto). busbw = algbw x (n-1)/n; the size column is
// count x typesize x nranks, as nccl-tests prints it.
#include "bench_main.hpp"

int main(int argc, char** argv) { return dpkit_bench::bench_main<dpkit_bench::collective::reduce_scatter>(argc, argv); }
