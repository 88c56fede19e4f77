/// @file policy.hpp
/// @brief Algorithm selection: the `algorithm` enum and `allreduce_policy`.
#pragma once

#include "../core/errors.hpp"

#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>

namespace dpkit {

/// Which algorithm a collective uses.
/// - ring: bandwidth-optimal, 2(n-1) latency steps (large messages).
/// - tree: 2 log2(n) latency steps (small messages, many ranks).
/// - native: the transport's own collective (MPI_Allreduce, ncclAllReduce),
///   for comparison; dpkit::invalid_argument on transports without one.
/// - automatic: chosen by allreduce_policy from message size, world size and
///   whether the transport has a shared segment.
/// - shm: through the transport's shared segment (shared_memory_transport;
///   one-shot or two-shot by size, allreduce_shm.hpp); dpkit::invalid_argument
///   when the transport has none at run time.
enum class algorithm : std::uint8_t { automatic, ring, tree, native, shm };

/// "automatic", "ring", "tree", "native" or "shm".
inline constexpr std::string_view algorithm_name(algorithm a) noexcept {
  switch (a) {
  case algorithm::automatic: return "automatic";
  case algorithm::ring: return "ring";
  case algorithm::tree: return "tree";
  case algorithm::native: return "native";
  case algorithm::shm: return "shm";
  }
  return "?";
}
/// Prints algorithm_name(a).
inline std::ostream& operator<<(std::ostream& os, algorithm a) { return os << algorithm_name(a); }

/// Parses "automatic" (or "auto"), "ring", "tree", "native", "shm".
/// @throws dpkit::invalid_argument naming the string.
inline algorithm parse_algorithm(std::string_view s) {
  if (s == "auto") return algorithm::automatic;
  for (auto a : {algorithm::automatic, algorithm::ring, algorithm::tree, algorithm::native, algorithm::shm})
    if (algorithm_name(a) == s) return a;
  throw invalid_argument("unknown algorithm '" + std::string(s) + "' (expected ring, tree, native, shm or automatic)");
}

/// Messages up to this many bytes use the one-shot shared-memory all-reduce
/// (allreduce_shm, allreduce_policy) on 3 or more ranks, two-shot above (the
/// crossover measured in docs/tuning.md).
inline constexpr std::size_t shm_one_shot_max_bytes_default = 64u << 10;
/// The same on 2 ranks (docs/tuning.md "Two-shot on two ranks": two-shot
/// ahead in place from 512 KiB, level out of place from 2 MiB).
inline constexpr std::size_t shm_one_shot_max_bytes_two_ranks_default = 256u << 10;

/// All-reduce algorithm policy (regular aggregate; compares and prints).
/// With algo == automatic: tree below `tree_max_bytes` per rank buffer (or
/// always tree when the world size is at least `tree_min_world` and the message
/// is below `tree_max_bytes_large_world`), ring otherwise; when the
/// transport has a shared segment (host tensors) and `use_shm`, shm below
/// `shm_max_bytes` instead. The defaults come from allreduce_perf runs on the
/// reference machine (docs/tuning.md).
struct allreduce_policy {
  algorithm algo = algorithm::automatic;
  std::size_t tree_max_bytes = 4u << 10;              ///< bytes; tree below this
  int tree_min_world = 4;                             ///< world size from which...
  std::size_t tree_max_bytes_large_world = 64u << 10; ///< ...tree is used below this many bytes
  bool use_shm = true;                                ///< automatic may pick shm when available
  std::size_t shm_max_bytes = ~std::size_t{0};        ///< shm below or at this many bytes
  std::size_t shm_one_shot_max_bytes = shm_one_shot_max_bytes_default; ///< shm on 3+ ranks: one-shot up to this
  std::size_t shm_one_shot_max_bytes_two_ranks = shm_one_shot_max_bytes_two_ranks_default; ///< the same on 2 ranks
  friend bool operator==(const allreduce_policy&, const allreduce_policy&) = default;

  /// The concrete algorithm for a message of `bytes` bytes on `world_size`
  /// ranks, on a transport with (`shm_ok`) or without a usable shared segment.
  algorithm choose(std::size_t bytes, int world_size, bool shm_ok = false) const noexcept {
    if (algo != algorithm::automatic) return algo;
    if (shm_ok && use_shm && world_size > 1 && bytes <= shm_max_bytes) return algorithm::shm;
    if (bytes < tree_max_bytes) return algorithm::tree;
    if (world_size >= tree_min_world && bytes < tree_max_bytes_large_world) return algorithm::tree;
    return algorithm::ring;
  }
};

/// Prints "allreduce_policy{algo=..., tree_max_bytes=..., ...}".
inline std::ostream& operator<<(std::ostream& os, const allreduce_policy& p) {
  return os << "allreduce_policy{algo=" << p.algo << ", tree_max_bytes=" << p.tree_max_bytes
            << ", tree_min_world=" << p.tree_min_world << ", tree_max_bytes_large_world=" << p.tree_max_bytes_large_world
            << ", use_shm=" << p.use_shm << ", shm_max_bytes=" << p.shm_max_bytes
            << ", shm_one_shot_max_bytes=" << p.shm_one_shot_max_bytes
            << ", shm_one_shot_max_bytes_two_ranks=" << p.shm_one_shot_max_bytes_two_ranks << "}";
}

} // namespace dpkit
