/// @file options.hpp
/// @brief Collective options and the deadline clock shared by all algorithms.
#pragma once

#include "errors.hpp"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>

namespace dpkit {

/// The clock deadlines are measured on.
using clock = std::chrono::steady_clock;
/// An absolute point in time after which a wait throws dpkit::timeout_error.
using deadline = clock::time_point;

/// Built-in default timeout of a collective: 30 minutes, torch.distributed's
/// default_pg_timeout.
inline constexpr std::chrono::milliseconds default_timeout{30 * 60 * 1000};

namespace detail {
/// Shortest deadline a timeout in seconds may give: 1 ms (0.001 s). A shorter
/// one would round to 0 ms and fail healthy calls.
inline constexpr double min_timeout_seconds = 0.001;
/// Longest timeout in seconds accepted (about 31.7 years): "wait
/// practically forever" fits, while the deadline clock::now() + timeout
/// cannot overflow.
inline constexpr double max_timeout_seconds = 1e9;

/// Parses a timeout given in seconds by the environment variable `name`
/// (decimal or scientific notation, e.g. "30", "0.5", "1e3"; no sign, no
/// unit, nothing after the number) into whole milliseconds, rounded to the
/// nearest. Null or empty text (the variable unset or set to nothing) gives
/// `fallback`.
/// @param s        the variable's value, or nullptr.
/// @param fallback returned for null or empty text.
/// @param name     the variable, named in the messages (e.g. "DPKIT_TIMEOUT").
/// @returns at least 1 ms.
/// @throws dpkit::invalid_argument naming the variable and the value for text
///         that is not a number, NaN, infinity, zero or negative ("DPKIT_TIMEOUT:
///         expected seconds > 0, got 'abc'"), a value below
///         min_timeout_seconds ("DPKIT_TIMEOUT: '1e-9' seconds is below the
///         minimum of 0.001 s (1 ms)") or above max_timeout_seconds. Never a
///         silent fallback.
inline std::chrono::milliseconds parse_timeout_seconds(const char* s, std::chrono::milliseconds fallback,
                                                       std::string_view name = "DPKIT_TIMEOUT") {
  if (!s || !*s) return fallback;
  const std::string_view text(s);
  const std::string got = std::string(name) + ": '" + std::string(text) + "' seconds";
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || !(v > 0))
    throw invalid_argument(std::string(name) + ": expected seconds > 0, got '" + std::string(text) + "'");
  if (v < min_timeout_seconds) throw invalid_argument(got + " is below the minimum of 0.001 s (1 ms)");
  if (v > max_timeout_seconds) throw invalid_argument(got + " is above the maximum of 1e9 s");
  return std::chrono::milliseconds(static_cast<long long>(v * 1000.0 + 0.5));
}

/// Parses a checking level given by the environment variable `name`: exactly
/// "0" (off), "1" (tags) or "2" (full). Null or empty text gives `fallback`.
/// @throws dpkit::invalid_argument naming the variable and the value for
///         anything else ("DPKIT_CHECK: expected 0 (off), 1 (tags) or 2
///         (full), got 'yes'"). Never a silent fallback.
inline int parse_check_level(const char* s, int fallback, std::string_view name = "DPKIT_CHECK") {
  if (!s || !*s) return fallback;
  if (s[0] >= '0' && s[0] <= '2' && s[1] == '\0') return s[0] - '0';
  throw invalid_argument(std::string(name) + ": expected 0 (off), 1 (tags) or 2 (full), got '" + s + "'");
}

inline bool parse_flag(const char* s, bool fallback) {
  if (!s || !*s) return fallback;
  const std::string v(s);
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  return fallback;
}
} // namespace detail

/// The default deadline of every collective: the environment variable
/// DPKIT_TIMEOUT (seconds, like NCCL_TIMEOUT / torch's `timeout`; e.g.
/// DPKIT_TIMEOUT=30; at least 0.001), else default_timeout (30 min). Read once
/// per process, at the first call (the environment is process-wide state).
/// @throws dpkit::invalid_argument naming the variable and its value when it
///         is set but malformed, not positive, below 0.001 s or above 1e9 s
///         (detail::parse_timeout_seconds), at every call: it is the default
///         of collective_options::timeout (and of the transports' setup
///         timeouts), so the first collective_options constructed throws it.
inline std::chrono::milliseconds env_default_timeout() {
  static const std::chrono::milliseconds v = detail::parse_timeout_seconds(std::getenv("DPKIT_TIMEOUT"), default_timeout);
  return v;
}

/// The checking level (collective_options::check) from DPKIT_CHECK: 0 off,
/// 1 tags (the default, also when unset or empty), 2 full. Read once per
/// process.
/// @throws dpkit::invalid_argument naming the variable and its value for any
///         other value (detail::parse_check_level), at every call: the first
///         collective_options constructed throws it.
inline int env_check() {
  static const int v = detail::parse_check_level(std::getenv("DPKIT_CHECK"), 1);
  return v;
}

/// Options every collective takes (a regular aggregate).
struct collective_options {
  /// Pipeline segment size in bytes: ring and tree algorithms move data in
  /// segments of at most this many bytes, a few in flight (double-buffered
  /// scratch of `pipeline_depth` segments, never a full-size temporary).
  /// Default measured on the reference machine (docs/tuning.md "Segment size").
  std::size_t segment_bytes = 1u << 20;
  /// Segments in flight per peer (receive scratch slots). >= 1.
  int pipeline_depth = 2;
  /// Wall-clock limit of the whole collective; past it, waiting ranks throw
  /// dpkit::timeout_error naming the rank, the operation, its sequence number,
  /// the peer waited on and the bytes done. Default: env_default_timeout()
  /// (DPKIT_TIMEOUT seconds, else 30 minutes).
  std::chrono::milliseconds timeout = env_default_timeout();
  /// Stream of the collective. Collectives with the same tag on one transport
  /// must be called in the same order on every rank (they are numbered in that
  /// order, and the number is checked); concurrent collectives on one
  /// transport need distinct tags. On transports without checking (user
  /// transports, NCCL) messages use tags [tag, tag + 16). Tags 0-15 are
  /// reserved.
  int tag = 0x6470; // "dp"
  /// Checking level (docs/reliability.md). 1 (default): on checked
  /// transports (inproc, mpi) every message's tag carries the collective's
  /// sequence number and fingerprint, so a peer running another collective
  /// throws mismatch_error instead of matching: no extra message. 2 (full):
  /// also, calls whose mismatch the tags cannot reveal first agree on a
  /// fingerprint across ranks (one small all-gather, dpkit::mpi): native
  /// collectives (MPI matches them by order alone) and rooted tree
  /// collectives (a broadcast whose ranks name different roots only sends).
  /// 0: off (plain tags; for measuring the cost). Default: env_check()
  /// (DPKIT_CHECK=0|1|2).
  int check = env_check();
  /// Native collectives run as non-blocking MPI collectives waited against
  /// the deadline (true, the default), or as the blocking call (false: no
  /// deadline, but Open MPI's fastest blocking algorithms, coll/tuned or
  /// coll/sm; benchmarks use it to measure MPI_Allreduce itself).
  bool native_deadline = true;
  friend bool operator==(const collective_options&, const collective_options&) = default;
};

/// Prints "segment_bytes=... pipeline_depth=... timeout_ms=... tag=... check=... native_deadline=...".
inline std::ostream& operator<<(std::ostream& os, const collective_options& o) {
  return os << "segment_bytes=" << o.segment_bytes << " pipeline_depth=" << o.pipeline_depth
            << " timeout_ms=" << o.timeout.count() << " tag=" << o.tag << " check=" << o.check
            << " native_deadline=" << o.native_deadline;
}

/// The deadline of a collective started now with options o.
inline deadline deadline_after(std::chrono::milliseconds timeout) {
  return clock::now() + timeout;
}

} // namespace dpkit
