/// @file options.hpp
/// @brief Collective options and the deadline clock shared by all algorithms.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <ostream>
#include <string>

namespace dpkit {

/// The clock deadlines are measured on.
using clock = std::chrono::steady_clock;
/// An absolute point in time after which a wait throws dpkit::timeout_error.
using deadline = clock::time_point;

/// Built-in default timeout of a collective: 30 minutes, torch.distributed's
/// default_pg_timeout.
inline constexpr std::chrono::milliseconds default_timeout{30 * 60 * 1000};

namespace detail {
/// Parses a timeout in seconds (decimal, > 0, e.g. "30" or "0.5"); returns
/// `fallback` for null, empty, non-numeric or non-positive text.
inline std::chrono::milliseconds parse_timeout_seconds(const char* s, std::chrono::milliseconds fallback) {
  if (!s || !*s) return fallback;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v > 0) || v > 1e9) return fallback;
  return std::chrono::milliseconds(static_cast<long long>(v * 1000.0 + 0.5));
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
/// DPKIT_TIMEOUT=30), else default_timeout (30 min). Read once per process, at
/// the first call (the environment is process-wide state).
inline std::chrono::milliseconds env_default_timeout() {
  static const std::chrono::milliseconds v = detail::parse_timeout_seconds(std::getenv("DPKIT_TIMEOUT"), default_timeout);
  return v;
}

/// The checking level (collective_options::check) from DPKIT_CHECK: 0 off,
/// 1 tags (the default), 2 full. Read once per process.
inline int env_check() {
  static const int v = [] {
    const char* s = std::getenv("DPKIT_CHECK");
    if (s && s[0] >= '0' && s[0] <= '2' && s[1] == '\0') return s[0] - '0';
    return 1;
  }();
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
  /// transports, NCCL) messages use tags [tag, tag + 8). Tags 0-7 are
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
