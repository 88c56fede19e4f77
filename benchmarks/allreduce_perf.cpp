// allreduce_perf: nccl-tests' all_reduce_perf for dpkit (ring, tree, native,
// auto = dpkit::allreduce's policy). busbw = algbw x 2(n-1)/n.
#include "bench.hpp"

namespace {

struct allreduce_bench {
  static constexpr dpkit_bench::collective kind = dpkit_bench::collective::allreduce;
  static constexpr std::string_view name = "allreduce";
  static constexpr std::string_view busbw_formula = "2(n-1)/n";
  static double busbw_factor(int n) { return 2.0 * (n - 1) / n; }
  static std::vector<dpkit::algorithm> algorithms() {
    return {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::native};
  }

  template <class C, class T>
  static void run(C& comm, dpkit::algorithm a, const dpkit_bench::op_args<T>& x) {
    const std::span<const T> in = x.in;
    switch (a) {
    case dpkit::algorithm::ring:
      if (x.in_place) dpkit::allreduce_ring(comm, x.buf, x.op, x.opts);
      else dpkit::allreduce_ring(comm, in, x.out, x.op, x.opts);
      return;
    case dpkit::algorithm::tree:
      if (x.in_place) dpkit::allreduce_tree(comm, x.buf, x.op, x.opts);
      else dpkit::allreduce_tree(comm, in, x.out, x.op, x.opts);
      return;
    case dpkit::algorithm::native:
      dpkit_bench::with_native(comm, [&](auto& c) {
        T* out = x.in_place ? x.buf.data() : x.out.data();
        c.native_allreduce(x.in_place ? out : x.in.data(), out, x.count, dpkit::element_type_of_v<T>, x.op);
      });
      return;
    case dpkit::algorithm::automatic:
      if (x.in_place) dpkit::allreduce(comm, x.buf, x.op, dpkit::allreduce_policy{}, x.opts);
      else dpkit::allreduce(comm, in, x.out, x.op, dpkit::allreduce_policy{}, x.opts);
      return;
    }
  }
};

} // namespace

int main(int argc, char** argv) { return dpkit_bench::bench_main<allreduce_bench>(argc, argv); }
