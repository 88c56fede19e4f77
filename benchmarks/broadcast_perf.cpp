// broadcast_perf: nccl-tests' broadcast_perf for dpkit (tree, native =
// MPI_Bcast). busbw = algbw. -r root (default 0; -1: every root in turn).
#include "bench.hpp"

namespace {

struct broadcast_bench {
  static constexpr dpkit_bench::collective kind = dpkit_bench::collective::broadcast;
  static constexpr std::string_view name = "broadcast";
  static constexpr std::string_view busbw_formula = "1";
  static double busbw_factor(int) { return 1.0; }
  static std::vector<dpkit::algorithm> algorithms() { return {dpkit::algorithm::tree, dpkit::algorithm::native}; }

  template <class C, class T>
  static void run(C& comm, dpkit::algorithm a, const dpkit_bench::op_args<T>& x) {
    switch (a) {
    case dpkit::algorithm::native:
      dpkit_bench::with_native(comm, [&](auto& c) {
        T* out = x.in_place ? x.buf.data() : x.out.data();
        c.native_broadcast(x.in_place ? out : x.in.data(), out, x.count, dpkit::element_type_of_v<T>, x.root);
      });
      return;
    case dpkit::algorithm::tree:
    case dpkit::algorithm::automatic:
    case dpkit::algorithm::ring:
      break;
    }
    if (x.in_place) dpkit::broadcast_tree(comm, x.buf, x.root, x.opts);
    else dpkit::broadcast_tree(comm, std::span<const T>(x.in), x.out, x.root, x.opts);
  }
};

} // namespace

int main(int argc, char** argv) { return dpkit_bench::bench_main<broadcast_bench>(argc, argv); }
