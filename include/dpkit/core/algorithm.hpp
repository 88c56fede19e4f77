/// @file algorithm.hpp
/// @brief The `algorithm` enum: which algorithm a collective runs (in core:
/// the tuning table, read by the transports too, names algorithms).
#pragma once

#include "errors.hpp"

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace dpkit {

/// Which algorithm a collective uses.
/// - ring: bandwidth-optimal, 2(n-1) latency steps (large messages).
/// - tree: 2 log2(n) latency steps (small messages, many ranks).
/// - native: the transport's own collective (MPI_Allreduce, ncclAllReduce),
///   for comparison; dpkit::invalid_argument on transports without one.
/// - automatic: chosen by allreduce_policy from the tuning table
///   (tuning.hpp: DPKIT_TUNING_FILE, else the built-in rules) for the
///   message size and the transport's shape.
/// - shm: through the transport's shared segment (shared_memory_transport;
///   one-shot or two-shot by size, shm/allreduce.hpp); dpkit::invalid_argument
///   when the transport has none at run time.
/// - hierarchical: node-aware, across nodes (hierarchical_transport: inside
///   each node through its shared segment, between nodes among the peers of
///   the same local rank; allreduce_hierarchical.hpp); on one node the flat
///   algorithm. dpkit::invalid_argument on transports that do not know their
///   nodes.
/// - shm_one_shot, shm_two_shot: the shared-memory all-reduce forced to one
///   variant at every size (allreduce_shm_one_shot / _two_shot; what a
///   tuning table names "shm1" and "shm2"); all-reduce only.
enum class algorithm : std::uint8_t { automatic, ring, tree, native, shm, hierarchical, shm_one_shot, shm_two_shot };

/// "automatic", "ring", "tree", "native", "shm", "hier", "shm1" or "shm2".
inline constexpr std::string_view algorithm_name(algorithm a) noexcept {
  switch (a) {
  case algorithm::automatic: return "automatic";
  case algorithm::ring: return "ring";
  case algorithm::tree: return "tree";
  case algorithm::native: return "native";
  case algorithm::shm: return "shm";
  case algorithm::hierarchical: return "hier";
  case algorithm::shm_one_shot: return "shm1";
  case algorithm::shm_two_shot: return "shm2";
  }
  return "?";
}
/// Prints algorithm_name(a).
inline std::ostream& operator<<(std::ostream& os, algorithm a) { return os << algorithm_name(a); }

/// Parses "automatic" (or "auto"), "ring", "tree", "native", "shm", "hier"
/// (or "hierarchical"), "shm1", "shm2".
/// @throws dpkit::invalid_argument naming the string.
inline algorithm parse_algorithm(std::string_view s) {
  if (s == "auto") return algorithm::automatic;
  if (s == "hierarchical") return algorithm::hierarchical;
  for (auto a : {algorithm::automatic, algorithm::ring, algorithm::tree, algorithm::native, algorithm::shm,
                 algorithm::hierarchical, algorithm::shm_one_shot, algorithm::shm_two_shot})
    if (algorithm_name(a) == s) return a;
  throw invalid_argument("unknown algorithm '" + std::string(s) +
                         "' (expected ring, tree, native, shm, shm1, shm2, hier or automatic)");
}

/// Messages up to this many bytes use the one-shot shared-memory all-reduce
/// (allreduce_shm; the built-in tuning rules) on 3 or more ranks, two-shot above (the
/// crossover measured in docs/tuning.md).
inline constexpr std::size_t shm_one_shot_max_bytes_default = 64u << 10;
/// The same on 2 ranks (docs/tuning.md "Two-shot on two ranks": two-shot
/// ahead in place from 512 KiB, level out of place from 2 MiB).
inline constexpr std::size_t shm_one_shot_max_bytes_two_ranks_default = 256u << 10;
/// Out-of-place messages from this many bytes have the shared-memory two-shot
/// all-reduce write their output with non-temporal stores (DPKIT_SHM_NT_BYTES
/// overrides it; 0: never). On the 2-vCPU reference VM (32 MiB L3), np 2,
/// with one store fence per chunk: 14-18% faster out of place from 8 MiB
/// (1.60-1.64x the memory floor against 1.88-1.97x), a tie at 4 MiB, slower
/// at 2 MiB (benchmarks/results/2026-12-03-shm-nontemporal-fence.md).
inline constexpr std::size_t shm_nontemporal_min_bytes_default = std::size_t{8} << 20;
/// The same for the direct all-reduce over symmetric or registered memory
/// (allreduce_shm_direct; DPKIT_SHM_NT_BYTES overrides both). Its two-rank
/// loop asks for its input lines ahead, and with that ordinary stores beat
/// the streamed lines at 8 MiB: on the 2-vCPU reference VM (32 MiB L3), np
/// 2, out of place, 8 MiB took 0.76-0.86x the memory floor against
/// 1.33-1.41x with non-temporal stores (two sets of 6 and 8 alternated
/// rounds); at 16 MiB, where the four buffers no longer fit the last-level
/// cache, ordinary stores took 1.10x against 1.00-1.02x (one set)
/// (benchmarks/results/2026-12-05-direct-prefetch.md). Measured on two
/// ranks; more ranks take the same threshold.
inline constexpr std::size_t shm_direct_nontemporal_min_bytes_default = std::size_t{16} << 20;
/// Messages up to this many bytes take the hierarchical all-reduce's
/// small-message path (one shared-memory step, then the network; measured on
/// the 2x2 emulated cluster, benchmarks/results/2026-11-26-cluster-fragments.md).
inline constexpr std::size_t hier_small_max_bytes_default = 2048;
/// The hierarchical all-reduce's chunk (bytes; at most the shared segment's
/// buffer): each chunk's reduce-scatter inside the node, all-reduce between
/// nodes and all-gather inside the node overlap the next chunk's. 1 MiB
/// against the 4 MiB buffer: 4-16 MiB all-reduces 3-9% faster, 64 MiB at the
/// link's bound on the 2x2 and 3x2 emulated clusters
/// (benchmarks/results/2026-11-26-cluster-layouts.md).
inline constexpr std::size_t hier_chunk_max_bytes_default = std::size_t{1} << 20;

} // namespace dpkit
