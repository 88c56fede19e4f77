/// @file lengths.hpp
/// @brief The length value that marks "no length" in a JSONL index length
/// column (a line whose JSON field was missing, indexed with
/// missing_field_policy::skip). token_budget_batch_sampler always leaves such
/// samples out (counted in skipped()).
#pragma once

#include <cstdint>

namespace dpkit {

/// Sentinel length of a line without a length (0xFFFFFFFF, the largest u32;
/// a JSON field with this value is rejected when indexing).
inline constexpr std::uint32_t missing_length = 0xFFFFFFFFu;

} // namespace dpkit
