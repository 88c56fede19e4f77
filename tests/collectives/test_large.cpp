// >= 1M-element buffers on a few world sizes and element types.
#include "common.hpp"

using namespace dpt;

TEST_CASE_TEMPLATE("large buffers (>= 1M elements)", T, float, std::int32_t, dpkit::bf16) {
  for (int n : {3, 8}) {
    for (std::size_t count : {std::size_t{1} << 20, std::size_t{1000003}}) {
      CAPTURE(n);
      CAPTURE(count);
      dpkit::collective_options small_seg;
      small_seg.segment_bytes = 64 << 10;
      small_seg.pipeline_depth = 4;
      // One world.run per configuration keeps memory bounded.
      for (const config& c : {config{kind::ar_ring, count, reduce_op::sum, false},
                              config{kind::ar_ring, count, reduce_op::avg, true, small_seg},
                              config{kind::ar_tree, count, reduce_op::max, true},
                              config{kind::ar_tree, count, reduce_op::sum, false, small_seg},
                              config{kind::ar_auto, count, reduce_op::min, true},
                              config{kind::reduce_scatter, count / static_cast<std::size_t>(n), reduce_op::sum, false},
                              config{kind::allgather, count / static_cast<std::size_t>(n) + 1, reduce_op::max, false},
                              config{kind::broadcast, count, reduce_op::max, true, small_seg, n - 1},
                              config{kind::reduce, count, reduce_op::prod, false, {}, 1}})
        CHECK(run_and_check<T>(n, {c}) == 0);
    }
  }
}
