// dpkit internals: the message tags of every algorithm, in one place. A
// collective with options o uses tags [o.tag, o.tag + tag_span); each
// algorithm owns one offset so two algorithms never match each other's
// messages. Not for users.
#pragma once

#include "../../core/options.hpp"

namespace dpkit::detail {

/// Tag offset of each algorithm's messages (added to collective_options::tag).
enum class tag_offset : int {
  allreduce_ring = 0, ///< ring all-reduce (reduce-scatter and all-gather phases)
  tree_up = 2,        ///< tree reduce phase (child -> parent)
  tree_down = 3,      ///< tree broadcast phase (parent -> child)
  reduce_scatter_ring = 4,
  allgather_ring = 5,
  barrier = 7,
};

/// Number of tags a collective may use from its base tag.
inline constexpr int tag_span = 8;

/// The tag of algorithm part `t` for a collective with options o.
inline int tag_of(const collective_options& o, tag_offset t) noexcept { return o.tag + static_cast<int>(t); }

} // namespace dpkit::detail
