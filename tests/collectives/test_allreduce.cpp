// All-reduce (ring, tree, allreduce() automatic dispatch): every world size,
// count, op and element type; out-of-place and in-place.
#include "common.hpp"

using namespace dpt;

TEST_CASE_TEMPLATE("allreduce ring/tree/automatic: exact, bitwise identical on every rank", T, DPKIT_ELEMENT_TYPES) {
  for (int n : test_sizes::worlds(world_sizes)) {
    std::vector<config> cfgs;
    for (std::size_t count : counts_for(n))
      for (reduce_op op : all_ops)
        for (kind k : {kind::ar_ring, kind::ar_tree, kind::ar_auto})
          for (bool in_place : {false, true}) cfgs.push_back({k, count, op, in_place});
    CAPTURE(n);
    CHECK(run_and_check<T>(n, cfgs) == 0);
  }
}
