/// @file options.hpp
/// @brief Collective options and the deadline clock shared by all algorithms.
#pragma once

#include <chrono>
#include <cstddef>
#include <ostream>

namespace dpkit {

/// The clock deadlines are measured on.
using clock = std::chrono::steady_clock;
/// An absolute point in time after which a wait throws dpkit::timeout_error.
using deadline = clock::time_point;

/// Default timeout of a collective: 30 minutes, torch.distributed's
/// default_pg_timeout.
inline constexpr std::chrono::milliseconds default_timeout{30 * 60 * 1000};

/// Options every collective takes (a regular aggregate).
struct collective_options {
  /// Pipeline segment size in bytes: ring and tree algorithms move data in
  /// segments of at most this many bytes, a few in flight (double-buffered
  /// scratch of `pipeline_depth` segments, never a full-size temporary).
  /// Default measured on the reference machine (see docs/tuning.md).
  std::size_t segment_bytes = 1u << 20;
  /// Segments in flight per peer (receive scratch slots). >= 1.
  int pipeline_depth = 2;
  /// Wall-clock limit of the whole collective; past it, waiting ranks throw
  /// dpkit::timeout_error naming the rank and the operation.
  std::chrono::milliseconds timeout = default_timeout;
  /// Message tag base; collectives use tags [tag, tag + 8). Concurrent
  /// collectives on one transport need distinct tags.
  int tag = 0x6470; // "dp"
  friend bool operator==(const collective_options&, const collective_options&) = default;
};

/// Prints "segment_bytes=... pipeline_depth=... timeout_ms=... tag=...".
inline std::ostream& operator<<(std::ostream& os, const collective_options& o) {
  return os << "segment_bytes=" << o.segment_bytes << " pipeline_depth=" << o.pipeline_depth
            << " timeout_ms=" << o.timeout.count() << " tag=" << o.tag;
}

/// The deadline of a collective started now with options o.
inline deadline deadline_after(std::chrono::milliseconds timeout) {
  return clock::now() + timeout;
}

} // namespace dpkit
