/// @file policy.hpp
/// @brief Algorithm selection: `allreduce_policy` (the `algorithm` enum is in
/// algorithm.hpp; the tuning table `automatic` reads in tuning.hpp).
#pragma once

#include "algorithm.hpp"
#include "tuning.hpp"

#include <cstddef>
#include <ostream>

namespace dpkit {

/// All-reduce algorithm policy (regular aggregate; compares and prints).
/// With algo == automatic the algorithm comes from the tuning table
/// (choose_tuned: `tuning` if set, else DPKIT_TUNING_FILE, then the built-in
/// rules) for the message size and the transport's shape, among the
/// algorithms the transport can run now and the `use_*` switches allow.
/// Any other algo is used as given.
struct allreduce_policy {
  algorithm algo = algorithm::automatic;
  bool use_shm = true;          ///< automatic may pick the shared-memory algorithms (one node)
  bool use_hierarchical = true; ///< automatic may pick hierarchical (several nodes)
  bool use_native = true;       ///< automatic may pick native where a tuning rule says so
  const tuning_table* tuning = nullptr; ///< rules consulted first (nullptr: DPKIT_TUNING_FILE); not owned
  friend bool operator==(const allreduce_policy&, const allreduce_policy&) = default;

  /// The concrete algorithm for a message of `bytes` bytes on a transport of
  /// shape k that can run `avail` (masked by the use_* switches).
  /// @throws dpkit::error / dpkit::format_error on a DPKIT_TUNING_FILE that
  ///         cannot be read or parsed.
  algorithm choose(std::size_t bytes, const tuning_key& k, tuning_availability avail) const {
    if (algo != algorithm::automatic) return algo;
    avail.shm = avail.shm && use_shm && k.ranks > 1;
    avail.hierarchical = avail.hierarchical && use_hierarchical;
    avail.native = avail.native && use_native;
    return choose_tuned(k, bytes, avail, tuning).algo;
  }
  /// The same on `world_size` ranks of one node, with (`shm_ok`) or without
  /// a usable shared segment.
  algorithm choose(std::size_t bytes, int world_size, bool shm_ok = false) const {
    return choose(bytes, tuning_key{world_size, 1, world_size}, tuning_availability{shm_ok, false, false});
  }
};

/// Prints "allreduce_policy{algo=..., use_shm=..., use_hierarchical=...,
/// use_native=..., tuning=<origin or env>}".
inline std::ostream& operator<<(std::ostream& os, const allreduce_policy& p) {
  return os << "allreduce_policy{algo=" << p.algo << ", use_shm=" << p.use_shm
            << ", use_hierarchical=" << p.use_hierarchical << ", use_native=" << p.use_native
            << ", tuning=" << (p.tuning ? p.tuning->origin : std::string("env")) << "}";
}

} // namespace dpkit
