// Ring reduce-scatter and ring all-gather: every world size, count, op and
// element type; out-of-place and in-place (NCCL's in-place conventions).
#include "common.hpp"

using namespace dpt;

TEST_CASE_TEMPLATE("reduce_scatter_ring: exact result chunk on every rank", T, DPKIT_ELEMENT_TYPES) {
  for (int n : test_sizes::worlds(world_sizes)) {
    std::vector<config> cfgs;
    // count is the per-rank output; the input is count x n.
    for (std::size_t count : counts_for(n, false))
      for (reduce_op op : all_ops)
        for (bool in_place : {false, true}) cfgs.push_back({kind::reduce_scatter, count, op, in_place});
    for (reduce_op op : all_ops) cfgs.push_back({kind::reduce_scatter, n <= 4 ? 10007u : 1009u, op, false});
    CAPTURE(n);
    CHECK(run_and_check<T>(n, cfgs) == 0);
  }
}

TEST_CASE_TEMPLATE("allgather_ring: concatenation in rank order, bitwise identical", T, DPKIT_ELEMENT_TYPES) {
  for (int n : test_sizes::worlds(world_sizes)) {
    std::vector<config> cfgs;
    for (std::size_t count : counts_for(n, false))
      for (bool in_place : {false, true})
        for (std::uint64_t salt : {0u, 1u}) cfgs.push_back({kind::allgather, count, reduce_op::max, in_place, {}, 0, salt});
    cfgs.push_back({kind::allgather, n <= 4 ? 10007u : 1009u, reduce_op::max, false});
    cfgs.push_back({kind::allgather, n <= 4 ? 10007u : 1009u, reduce_op::max, true});
    CAPTURE(n);
    CHECK(run_and_check<T>(n, cfgs) == 0);
  }
}
