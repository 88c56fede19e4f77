// Pipelining: tiny and default segment sizes x pipeline depths 1, 2, 4 for
// every algorithm (pipelining bugs hide there).
#include "common.hpp"

using namespace dpt;

namespace {
std::vector<config> pipeline_configs(int n, std::size_t elem_size) {
  std::vector<config> cfgs;
  const std::size_t nn = static_cast<std::size_t>(n);
  for (std::size_t seg : {std::size_t{4}, std::size_t{64}, std::size_t{1} << 20})
    for (int depth : {1, 2, 4}) {
      dpkit::collective_options o;
      o.segment_bytes = seg;
      o.pipeline_depth = depth;
      // Tiny segments mean one message per element: keep those counts moderate.
      const std::size_t big = seg >= 64 ? 1031 : 3 * nn + 2;
      for (std::size_t count : {nn > 1 ? nn - 1 : 1, 3 * nn + 2, big}) {
        for (kind k : {kind::ar_ring, kind::ar_tree})
          for (bool ip : {false, true})
            for (reduce_op op : {reduce_op::sum, reduce_op::avg}) cfgs.push_back({k, count, op, ip, o});
        cfgs.push_back({kind::ar_ring, count, reduce_op::prod, false, o});
        cfgs.push_back({kind::ar_tree, count, reduce_op::min, true, o});
        cfgs.push_back({kind::ar_auto, count, reduce_op::max, false, o});
        const std::size_t per = count / nn + 1;
        cfgs.push_back({kind::reduce_scatter, per, reduce_op::sum, false, o});
        cfgs.push_back({kind::reduce_scatter, per, reduce_op::avg, true, o});
        cfgs.push_back({kind::allgather, per, reduce_op::max, false, o});
        cfgs.push_back({kind::allgather, per, reduce_op::min, true, o});
        cfgs.push_back({kind::broadcast, count, reduce_op::max, false, o, n - 1});
        cfgs.push_back({kind::broadcast, count, reduce_op::max, true, o, n / 2});
        cfgs.push_back({kind::reduce, count, reduce_op::sum, false, o, n - 1});
        cfgs.push_back({kind::reduce, count, reduce_op::avg, false, o, 0});
      }
      (void)elem_size;
    }
  return cfgs;
}
} // namespace

TEST_CASE_TEMPLATE("pipelining: segment sizes 4, 64, default x depths 1, 2, 4 for every algorithm", T,
                   DPKIT_ELEMENT_TYPES) {
  for (int n : test_sizes::worlds({1, 2, 3, 4, 7, 16})) {
    CAPTURE(n);
    CHECK(run_and_check<T>(n, pipeline_configs(n, sizeof(T))) == 0);
  }
}

