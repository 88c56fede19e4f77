// reduce_scatter_perf: nccl-tests' reduce_scatter_perf for dpkit (ring,
// native = MPI_Reduce_scatter_block). busbw = algbw x (n-1)/n; the size column
// is count x typesize x nranks, as nccl-tests prints it.
#include "bench.hpp"

namespace {

struct reduce_scatter_bench {
  static constexpr dpkit_bench::collective kind = dpkit_bench::collective::reduce_scatter;
  static constexpr std::string_view name = "reduce_scatter";
  static constexpr std::string_view busbw_formula = "(n-1)/n";
  static double busbw_factor(int n) { return static_cast<double>(n - 1) / n; }
  static std::vector<dpkit::algorithm> algorithms() { return {dpkit::algorithm::ring, dpkit::algorithm::native}; }

  // NCCL's in-place convention puts rank r's result at offset r x count of the
  // big buffer; MPI_Reduce_scatter_block with MPI_IN_PLACE (what
  // mpi::native_reduce_scatter does for in == out) leaves it at offset 0.
  static std::size_t inplace_result_offset(dpkit::algorithm a, int rank, std::size_t count) {
    return a == dpkit::algorithm::native ? 0 : static_cast<std::size_t>(rank) * count;
  }

  template <class C, class T>
  static void run(C& comm, dpkit::algorithm a, const dpkit_bench::op_args<T>& x) {
    switch (a) {
    case dpkit::algorithm::native:
      dpkit_bench::with_native(comm, [&](auto& c) {
        if (x.in_place) c.native_reduce_scatter(x.buf.data(), x.buf.data(), x.count, dpkit::element_type_of_v<T>, x.op);
        else c.native_reduce_scatter(x.in.data(), x.out.data(), x.count, dpkit::element_type_of_v<T>, x.op);
      });
      return;
    case dpkit::algorithm::ring:
    case dpkit::algorithm::automatic:
    case dpkit::algorithm::tree:
      break;
    }
    if (x.in_place) dpkit::reduce_scatter_ring(comm, x.buf, x.op, x.opts);
    else dpkit::reduce_scatter_ring(comm, std::span<const T>(x.in), x.out, x.op, x.opts);
  }
};

} // namespace

int main(int argc, char** argv) { return dpkit_bench::bench_main<reduce_scatter_bench>(argc, argv); }
