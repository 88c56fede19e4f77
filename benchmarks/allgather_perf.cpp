// allgather_perf: nccl-tests' all_gather_perf for dpkit (ring, native =
// MPI_Allgather). busbw = algbw x (n-1)/n; the size column is count x
// typesize x nranks, as nccl-tests prints it.
#include "bench.hpp"

namespace {

struct allgather_bench {
  static constexpr dpkit_bench::collective kind = dpkit_bench::collective::allgather;
  static constexpr std::string_view name = "allgather";
  static constexpr std::string_view busbw_formula = "(n-1)/n";
  static double busbw_factor(int n) { return static_cast<double>(n - 1) / n; }
  static std::vector<dpkit::algorithm> algorithms() { return {dpkit::algorithm::ring, dpkit::algorithm::native}; }

  template <class C, class T>
  static void run(C& comm, dpkit::algorithm a, const dpkit_bench::op_args<T>& x) {
    switch (a) {
    case dpkit::algorithm::native:
      dpkit_bench::with_native(comm, [&](auto& c) {
        // in place: the rank's chunk already sits at offset rank x count (NCCL's convention)
        const T* in = x.in_place ? x.buf.data() + static_cast<std::size_t>(c.rank()) * x.count : x.in.data();
        c.native_allgather(in, x.in_place ? x.buf.data() : x.out.data(), x.count, dpkit::element_type_of_v<T>);
      });
      return;
    case dpkit::algorithm::ring:
    case dpkit::algorithm::automatic:
    case dpkit::algorithm::tree:
      break;
    }
    if (x.in_place) dpkit::allgather_ring(comm, x.buf, x.opts);
    else dpkit::allgather_ring(comm, std::span<const T>(x.in), x.out, x.opts);
  }
};

} // namespace

int main(int argc, char** argv) { return dpkit_bench::bench_main<allgather_bench>(argc, argv); }
