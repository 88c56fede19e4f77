// dpkit internals: the message tags of every algorithm, in one place. A
// collective uses tags [base, base + tag_span); each
// algorithm owns one offset so two algorithms never match each other's
// messages. Not for users.
#pragma once

#include "../../core/options.hpp"

namespace dpkit::detail {

/// Tag offset of each algorithm's messages (added to collective_options::tag).
enum class tag_offset : int {
  allreduce_ring = 0, ///< ring all-reduce (reduce-scatter and all-gather phases)
  zero_count = 1,     ///< the empty messages of a zero-element collective (zero_count_check)
  tree_up = 2,        ///< tree reduce phase (child -> parent)
  tree_down = 3,      ///< tree broadcast phase (parent -> child)
  reduce_scatter_ring = 4,
  allgather_ring = 5,
  recursive_doubling = 6, ///< recursive-doubling all-reduce between nodes (hierarchical.hpp)
  barrier = 7,
  gather = 8,         ///< linear gather (rank -> root)
  scatter = 9,        ///< linear scatter (root -> rank)
  alltoall = 10,      ///< pairwise all-to-all, even and uneven
  rooted_ack = 11,    ///< the empty acknowledgements of gather and scatter (checked transports)
  alltoall_counts = 12, ///< the counts an uneven all-to-all's ranks compare first (checked transports)
};

/// Number of tags a collective may use from its base tag (the algorithm
/// part of a checked tag has 4 bits: transport/detail/health.hpp).
inline constexpr int tag_span = 16;

// A collective's tag base is options.tag on unchecked transports, and on
// checked ones (transport/detail/health.hpp) a value that also carries the
// sequence number and the fingerprint hash; collective_scope::tag(t) (in
// common.hpp) adds the offset.

} // namespace dpkit::detail
