/// @file tuning.hpp
/// @brief What `algorithm::automatic` runs for a message, chosen from the
/// tuning table (core/tuning_table.hpp: the file format, DPKIT_TUNING_FILE,
/// the built-in rules) for the message's size and the transport's shape,
/// and the explanation `allreduce_perf --explain` prints.
#pragma once

#include "../core/tuning_table.hpp"
#include "algorithm.hpp"

#include <cstddef>
#include <string>

namespace dpkit {

/// What algorithm::automatic picks and why.
struct tuning_choice {
  algorithm algo = algorithm::ring;
  const tuning_rule* rule = nullptr; ///< the rule that decided (nullptr: no rule matched: ring)
  std::string origin;                ///< its table's origin (a file path, or "built-in")
};

/// The algorithm for an all-reduce of `bytes` bytes on a transport of shape
/// k that can run `avail`: the first matching rule of `table` (nullptr: the
/// DPKIT_TUNING_FILE table, if set), else of the built-in table, else ring.
/// "shm" rules resolve to one-shot or two-shot by the built-in threshold.
/// @throws dpkit::error / dpkit::format_error on a DPKIT_TUNING_FILE that
///         cannot be read or parsed.
inline tuning_choice choose_tuned(const tuning_key& k, std::size_t bytes, const tuning_availability& avail,
                                  const tuning_table* table = nullptr) {
  if (!table) table = detail::env_tuning();
  for (const tuning_table* t : {table, &tuning_table::builtin()}) {
    if (!t) continue;
    if (const tuning_rule* r = t->find(k, bytes, avail)) {
      algorithm a = r->algo;
      if (r->shm_by_size)
        a = bytes <= (k.ranks == 2 ? shm_one_shot_max_bytes_two_ranks_default : shm_one_shot_max_bytes_default)
                ? algorithm::shm_one_shot
                : algorithm::shm_two_shot;
      return {a, r, t->origin};
    }
  }
  return {algorithm::ring, nullptr, "built-in"};
}

/// One line saying what choose_tuned picks and why: "allreduce of 65536
/// bytes on 4 ranks (2 nodes, up to 2 per node): hier, by rule 'allreduce 4
/// 2 2 32K 128K hier' (FILE:7; us: hier 41.2 ring 88.0)".
inline std::string explain_tuned(const tuning_key& k, std::size_t bytes, const tuning_availability& avail,
                                 const tuning_table* table = nullptr) {
  const tuning_choice c = choose_tuned(k, bytes, avail, table);
  std::string s = "allreduce of " + std::to_string(bytes) + " bytes on " + std::to_string(k.ranks) + " ranks (" +
                  std::to_string(k.nodes) + (k.nodes == 1 ? " node" : " nodes") + ", up to " +
                  std::to_string(k.max_local) + " per node; can run:" + (avail.shm ? " shm" : "") +
                  (avail.hierarchical ? " hier" : "") + (avail.native ? " native" : "") + " ring tree): " +
                  (c.algo == algorithm::shm_one_shot ? "shm1" : c.algo == algorithm::shm_two_shot ? "shm2"
                                                                                                  : std::string(algorithm_name(c.algo)));
  if (!c.rule) return s + " (no rule matched)";
  const tuning_rule& r = *c.rule;
  s += ", by rule 'allreduce " + detail::tuning_range_str(r.ranks_min, r.ranks_max) + " " +
       detail::tuning_range_str(r.nodes_min, r.nodes_max) + " " + detail::tuning_range_str(r.local_min, r.local_max) +
       " " + detail::tuning_bytes_str(r.min_bytes) + " " + detail::tuning_bytes_str(r.max_bytes) + " " +
       detail::tuning_algo_str(r) + "' (" + c.origin + (r.line ? ":" + std::to_string(r.line) : "") +
       (r.comment.empty() ? "" : "; " + r.comment) + ")";
  return s;
}

} // namespace dpkit
