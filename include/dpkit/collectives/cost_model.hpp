/// @file cost_model.hpp
/// @brief An alpha-beta cost model of dpkit's all-reduce algorithms, per
/// link class (within a node: the shared segment; between nodes: the
/// network), the way NCCL's tuner models its algorithms and protocols: a
/// message of b bytes over a link costs alpha + b x beta, a local reduction
/// gamma per byte. It predicts each algorithm's time on a layout of N nodes
/// of L ranks (block placement, as mpirun maps by slot) and so the busbw
/// tables of clusters larger than the one at hand (allreduce_perf
/// --predict). The link costs come from allreduce_perf --tune (inside a
/// node: the latency of one shared-memory step and the bandwidth of a
/// ping-pong; between nodes: a ping-pong), kept in the tuning file.
///
/// Models (p = N x L ranks, S bytes, c = the segment's chunk of S):
/// - ring: 2(p-1) steps of S/p bytes; with N > 1 every step crosses a node
///   boundary on some link, so the step costs an inter-node message;
///   (p-1) reductions of S/p bytes.
/// - tree: a pipelined binary tree up (reduce) and down (broadcast): 2
///   ceil(log2 p) latencies, and each phase streams S through the busiest
///   link once in each direction (an interior rank's two children: 2 x S);
///   reductions of 2 x S. It leaves out the pipeline's fill and the up and
///   down streams' contention, which make the measured tree 1.2-2x slower
///   from 1 MiB (it is not the algorithm of those sizes).
/// - shm1 (one node): copy S in, one step, reduce (L-1) x S.
/// - shm2 (one node): copy (L-1)/L of S in, step, reduce (L-1) x S/L, step,
///   copy (L-1)/L of S out.
/// - hier (N > 1, L ranks per node, shared memory inside): per chunk of the
///   node's buffer, shm2's first half, the all-reduce of S/L bytes among N
///   nodes by each of the L local ranks at once (they share the node's link:
///   a ring moves 2(N-1)/N x S through it, a tree 2 x S), and shm2's second
///   half.
/// Not modelled: native collectives (their algorithm is MPI's choice),
/// contention beyond one node's link, cores shared by several ranks.
#pragma once

#include "tuning.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>

namespace dpkit {

/// The alpha-beta model of one machine or cluster (regular aggregate).
struct cost_model {
  link_cost intra;                 ///< a message between two ranks of one node
  link_cost inter;                 ///< a message between two nodes (one node's link)
  double reduce_ns_per_byte = 0.1; ///< gamma: one local reduction, per byte of the result
  std::size_t node_chunk_bytes = std::size_t{4} << 20; ///< the node's shared buffer (hier, shm2 chunks)
  /// hier's small-message path (one shared-memory step, then the network)
  /// up to this many bytes
  std::size_t hier_small_bytes = hier_small_max_bytes_default;

  /// The model with the link costs of tuning table t (the defaults where it has none).
  static cost_model from(const tuning_table& t) {
    cost_model m;
    if (t.intra.valid) m.intra = t.intra;
    if (t.inter.valid) m.inter = t.inter;
    if (t.reduce_ns_per_byte > 0) m.reduce_ns_per_byte = t.reduce_ns_per_byte;
    return m;
  }

  /// Predicted time in microseconds of an all-reduce of `bytes` bytes with
  /// algorithm a on `nodes` nodes of `per_node` ranks; nullopt where the
  /// model does not apply (native, automatic, shm across nodes, hier on one
  /// node).
  std::optional<double> allreduce_us(algorithm a, std::size_t bytes, int nodes, int per_node) const {
    const double S = static_cast<double>(bytes);
    const int p = nodes * per_node;
    const link_cost& net = nodes > 1 ? inter : intra;
    const double g = reduce_ns_per_byte * 1e-3; // us per byte
    auto msg = [](const link_cost& l, double b) { return l.alpha_us + b * l.beta_ns_per_byte * 1e-3; };
    if (p <= 1) return 0.0;
    switch (a) {
    case algorithm::ring: {
      const double m = S / p;
      return 2.0 * (p - 1) * msg(net, m) + (p - 1) * m * g;
    }
    case algorithm::tree: {
      const double d = std::ceil(std::log2(static_cast<double>(p)));
      return 2.0 * d * net.alpha_us + 2.0 * S * net.beta_ns_per_byte * 1e-3 + 2.0 * S * g;
    }
    case algorithm::shm_one_shot:
    case algorithm::shm_two_shot:
    case algorithm::shm: {
      if (nodes > 1) return std::nullopt;
      const bool one = a == algorithm::shm_one_shot ||
                       (a == algorithm::shm &&
                        bytes <= (p == 2 ? shm_one_shot_max_bytes_two_ranks_default : shm_one_shot_max_bytes_default));
      const double chunks = std::max(1.0, std::ceil(S / static_cast<double>(node_chunk_bytes)));
      if (one) return chunks * intra.alpha_us + S * intra.beta_ns_per_byte * 1e-3 + (p - 1) * S * g;
      const double f = static_cast<double>(p - 1) / p;
      return chunks * 2.0 * intra.alpha_us + 2.0 * f * S * intra.beta_ns_per_byte * 1e-3 + f * S * g;
    }
    case algorithm::hierarchical: {
      if (nodes <= 1) return std::nullopt;
      const int L = per_node;
      if (L > 1 && bytes <= hier_small_bytes) {
        // one-shot inside the node (read L-1 peers), then recursive
        // doubling between nodes, the L local ranks' copies sharing the link
        const double d = std::ceil(std::log2(static_cast<double>(nodes)));
        return intra.alpha_us + (L - 1) * S * (intra.beta_ns_per_byte * 1e-3 + g) +
               d * (inter.alpha_us + L * S * inter.beta_ns_per_byte * 1e-3 + S * g);
      }
      const double chunks = std::max(1.0, std::ceil(S / static_cast<double>(node_chunk_bytes)));
      const double c = S / chunks;
      const double f = static_cast<double>(L - 1) / L;
      const double local = L > 1 ? 2.0 * intra.alpha_us + 2.0 * f * c * intra.beta_ns_per_byte * 1e-3 + f * c * g : 0.0;
      // the L cross all-reduces of c / L bytes each share the node's link
      const double slice = c / L;
      const int N = nodes;
      const double ring = 2.0 * (N - 1) * inter.alpha_us + 2.0 * (N - 1) / N * c * inter.beta_ns_per_byte * 1e-3 +
                          (N - 1) * slice / N * g;
      const double d = std::ceil(std::log2(static_cast<double>(N)));
      const double tree = 2.0 * d * inter.alpha_us + 2.0 * c * inter.beta_ns_per_byte * 1e-3 + 2.0 * slice * g;
      return chunks * (local + std::min(ring, tree));
    }
    default: return std::nullopt;
    }
  }
};

} // namespace dpkit
