/// @file lane_op.hpp
/// @brief Internal: the reductions the 16-bit vector loops apply
/// (detail/reduce_f16c.hpp, detail/reduce_bf16_avx2.hpp). Never include
/// directly: core/reduce_op.hpp maps reduce_op onto it (lane_op_of).
#pragma once

#include <cstdint>

namespace dpkit::detail {

/// A vector loop's reduction (sum also serves avg, whose division is separate).
enum class lane_op : std::uint8_t { sum, prod, min, max };

} // namespace dpkit::detail
