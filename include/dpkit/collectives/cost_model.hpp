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
///   ceil(log2 p) latencies; every tree edge carries S up and S down, so the
///   busiest link moves k x S each way, k = the most tree edges at one rank
///   (one node: an interior rank's two children, k = 2) or, across nodes,
///   the most edges crossing one node's boundary (tree_crossing_edges: 2 at
///   2x2 and 4x1, 3 at 3x2 and at 5 or more nodes of one rank);
///   reductions of 2 x S. It leaves out the pipeline's fill (one segment's
///   up and down do not overlap) and, on Open MPI's tcp transport, the half
///   rate of a link that carries one pair's up and down streams at once
///   without fragments (benchmarks/results/2026-11-26-cluster-fragments.md),
///   which make the measured tree slower than the model from 1 MiB (it is
///   not the algorithm of those sizes).
/// - shm1 (one node): copy S in, one step, reduce (L-1) x S.
/// - shm2 (one node): copy (L-1)/L of S in, step, reduce (L-1) x S/L, step,
///   copy (L-1)/L of S out.
/// - hier (N > 1, L ranks per node, shared memory inside): per chunk
///   (hier_chunk_bytes, at most the node's buffer), shm2's first half, the
///   all-reduce of S/L bytes among N nodes by each of the L local ranks at
///   once (they share the node's link: a ring moves 2(N-1)/N x S through
///   it, a tree k x S with k = tree_crossing_edges(N, 1)), and shm2's
///   second half.
/// Not modelled: native collectives (their algorithm is MPI's choice),
/// contention beyond one node's link, cores shared by several ranks.
#pragma once

#include "tuning.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace dpkit {

/// The alpha-beta model of one machine or cluster (regular aggregate).
struct cost_model {
  link_cost intra;                 ///< a message between two ranks of one node
  link_cost inter;                 ///< a message between two nodes (one node's link)
  double reduce_ns_per_byte = 0.1; ///< gamma: one local reduction, per byte of the result
  std::size_t node_chunk_bytes = std::size_t{4} << 20; ///< the node's shared buffer (shm2 chunks)
  std::size_t hier_chunk_bytes = hier_chunk_max_bytes_default; ///< hier's chunk (at most the buffer)
  /// hier's small-message path (one shared-memory step, then the network)
  /// up to this many bytes
  std::size_t hier_small_bytes = hier_small_max_bytes_default;

  /// How many copies of the message the tree all-reduce (allreduce_tree:
  /// rank v's children 2v+1 and 2v+2, root 0) moves through the busiest
  /// node's link in each direction, with p ranks placed in blocks of L per
  /// node (rank r on node r / L, as mpirun maps by slot): the most tree
  /// edges with one end inside one node and the other outside (each carries
  /// the message into the node one way and out of it the other, up and
  /// down). 0 when every rank is on one node. E.g. 2x2: 2 (0-2, 1-3); 3x2:
  /// 3 (node 0 holds ranks 0 and 1: edges 0-2, 1-3, 1-4); N x 1: a rank's
  /// degree, 3 for an interior rank with two children.
  /// @return a count of tree edges (not bytes); 0 for p <= 1 or L < 1.
  /// Throws only std::bad_alloc (one counter per node).
  static int tree_crossing_edges(int p, int L) {
    if (p <= 1 || L < 1) return 0;
    const int nodes = (p + L - 1) / L;
    std::vector<int> crossing(static_cast<std::size_t>(nodes), 0);
    for (int v = 1; v < p; ++v) {
      const int a = v / L, b = ((v - 1) / 2) / L; // the node of v and of its parent
      if (a != b) {
        ++crossing[static_cast<std::size_t>(a)];
        ++crossing[static_cast<std::size_t>(b)];
      }
    }
    return *std::max_element(crossing.begin(), crossing.end());
  }

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
      const double k = nodes > 1 ? tree_crossing_edges(p, per_node) : (p == 2 ? 1.0 : 2.0);
      return 2.0 * d * net.alpha_us + k * S * net.beta_ns_per_byte * 1e-3 + 2.0 * S * g;
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
      const double chunk = static_cast<double>(std::min(node_chunk_bytes, hier_chunk_bytes));
      const double chunks = std::max(1.0, std::ceil(S / chunk));
      const double c = S / chunks;
      const double f = static_cast<double>(L - 1) / L;
      const double local = L > 1 ? 2.0 * intra.alpha_us + 2.0 * f * c * intra.beta_ns_per_byte * 1e-3 + f * c * g : 0.0;
      // the L cross all-reduces of c / L bytes each share the node's link
      const double slice = c / L;
      const int N = nodes;
      const double ring = 2.0 * (N - 1) * inter.alpha_us + 2.0 * (N - 1) / N * c * inter.beta_ns_per_byte * 1e-3 +
                          (N - 1) * slice / N * g;
      const double d = std::ceil(std::log2(static_cast<double>(N)));
      const double k = tree_crossing_edges(N, 1);
      const double tree = 2.0 * d * inter.alpha_us + k * c * inter.beta_ns_per_byte * 1e-3 + 2.0 * slice * g;
      return chunks * (local + std::min(ring, tree));
    }
    default: return std::nullopt;
    }
  }
};

} // namespace dpkit
