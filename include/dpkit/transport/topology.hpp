/// @file topology.hpp
/// @brief Which node each rank of a transport runs on (docs/design.md
/// "Topology"): `node_layout` (the node of every rank) and `node_topology`
/// (one rank's view of it: its node, its local rank, the node's size).
///
/// A node is a set of ranks that can share memory: the ranks that
/// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) groups together on the MPI
/// transport (one host), or a declared virtual node of an inproc_world.
/// Nodes are numbered 0, 1, ... in the order of their lowest rank; within a
/// node, ranks are numbered by their rank in the transport (the local rank),
/// as NCCL and torchrun's LOCAL_RANK do.
#pragma once

#include "../core/errors.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

namespace dpkit {

/// The node of every rank of a transport (regular value type).
/// `node_of[r]` is rank r's node index; indices are canonical: node 0 holds
/// rank 0, and each new index appears in rank order (canonicalize() makes
/// any labelling canonical).
struct node_layout {
  std::vector<int> node_of; ///< rank -> node index, size = world size

  /// Every one of `world_size` ranks on one node.
  /// @throws dpkit::invalid_argument if world_size < 1.
  static node_layout single(int world_size) {
    if (world_size < 1) throw invalid_argument("node_layout::single: world size must be >= 1, got " + std::to_string(world_size));
    return node_layout{std::vector<int>(static_cast<std::size_t>(world_size), 0)};
  }
  /// `nodes` nodes of `per_node` ranks each, in blocks: ranks
  /// [k * per_node, (k + 1) * per_node) on node k (mpirun's default --map-by
  /// slot with a hostfile of `per_node` slots per host).
  /// @throws dpkit::invalid_argument if nodes < 1 or per_node < 1.
  static node_layout blocks(int nodes, int per_node) {
    if (nodes < 1 || per_node < 1)
      throw invalid_argument("node_layout::blocks: nodes and ranks per node must be >= 1, got " +
                             std::to_string(nodes) + " x " + std::to_string(per_node));
    node_layout l;
    for (int k = 0; k < nodes; ++k)
      for (int i = 0; i < per_node; ++i) l.node_of.push_back(k);
    return l;
  }
  /// Nodes of the given sizes, in blocks (sizes {2, 3}: ranks 0-1 on node 0,
  /// 2-4 on node 1).
  /// @throws dpkit::invalid_argument if a size is < 1 or the list is empty.
  static node_layout sizes(std::initializer_list<int> per_node) {
    node_layout l;
    int k = 0;
    for (int s : per_node) {
      if (s < 1) throw invalid_argument("node_layout::sizes: a node size is " + std::to_string(s) + " (must be >= 1)");
      for (int i = 0; i < s; ++i) l.node_of.push_back(k);
      ++k;
    }
    if (l.node_of.empty()) throw invalid_argument("node_layout::sizes: no nodes");
    return l;
  }
  /// The same partition with canonical indices (node 0 holds rank 0, new
  /// indices in rank order); `labels` may be any integers (host ids, the
  /// lowest rank of each node).
  static node_layout canonicalize(const std::vector<long long>& labels) {
    node_layout l;
    std::vector<long long> seen;
    for (long long x : labels) {
      auto it = std::find(seen.begin(), seen.end(), x);
      if (it == seen.end()) {
        seen.push_back(x);
        l.node_of.push_back(static_cast<int>(seen.size()) - 1);
      } else {
        l.node_of.push_back(static_cast<int>(it - seen.begin()));
      }
    }
    return l;
  }

  /// World size.
  int size() const noexcept { return static_cast<int>(node_of.size()); }
  /// Number of nodes.
  int nodes() const noexcept {
    int m = -1;
    for (int k : node_of) m = std::max(m, k);
    return m + 1;
  }
  /// The ranks on node k, ascending.
  std::vector<int> ranks_of(int k) const {
    std::vector<int> r;
    for (int i = 0; i < size(); ++i)
      if (node_of[static_cast<std::size_t>(i)] == k) r.push_back(i);
    return r;
  }
  /// "2x2" when every node has the same number of ranks, else the sizes
  /// ("2+3").
  std::string str() const {
    const int n = nodes();
    std::vector<int> s(static_cast<std::size_t>(std::max(n, 0)), 0);
    for (int k : node_of) ++s[static_cast<std::size_t>(k)];
    if (n > 0 && std::all_of(s.begin(), s.end(), [&](int x) { return x == s[0]; }))
      return std::to_string(n) + "x" + std::to_string(s[0]);
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (i) out += '+'; // (GCC 12 warns falsely, -Wrestrict, on "+" + std::to_string(...))
      out += std::to_string(s[i]);
    }
    return out;
  }
  friend bool operator==(const node_layout&, const node_layout&) = default;
};

/// One rank's view of a node_layout: its node, its rank within the node
/// (local rank, by rank order) and the node's size; whether every node has
/// the same size (uniform: the hierarchical algorithms then pair the ranks
/// with the same local rank across nodes, else they go through one leader,
/// local rank 0, per node).
class node_topology {
public:
  /// All ranks on one node (a world of one rank by default).
  node_topology() : node_topology(node_layout::single(1), 0) {}
  /// Rank `rank`'s view of `layout`.
  /// @throws dpkit::invalid_argument if rank is outside the layout or the
  ///         layout's indices are not canonical (node 0 first, new indices in
  ///         rank order, none skipped).
  node_topology(node_layout layout, int rank) : layout_(std::move(layout)), rank_(rank) {
    const int n = layout_.size();
    if (rank < 0 || rank >= n)
      throw invalid_argument("node_topology: rank " + std::to_string(rank) + " out of range for a layout of " +
                             std::to_string(n) + " ranks");
    int next = 0;
    for (int i = 0; i < n; ++i) {
      const int k = layout_.node_of[static_cast<std::size_t>(i)];
      if (k < 0 || k > next)
        throw invalid_argument("node_topology: rank " + std::to_string(i) + " is on node " + std::to_string(k) +
                               " (node indices must appear in rank order from 0: use node_layout::canonicalize)");
      if (k == next) ++next;
    }
    nodes_ = next;
    node_ = layout_.node_of[static_cast<std::size_t>(rank)];
    std::vector<int> sizes(static_cast<std::size_t>(nodes_), 0);
    for (int i = 0; i < n; ++i) {
      const int k = layout_.node_of[static_cast<std::size_t>(i)];
      if (i == rank) local_rank_ = sizes[static_cast<std::size_t>(k)];
      ++sizes[static_cast<std::size_t>(k)];
    }
    local_size_ = sizes[static_cast<std::size_t>(node_)];
    uniform_ = std::all_of(sizes.begin(), sizes.end(), [&](int s) { return s == sizes[0]; });
    max_local_ = *std::max_element(sizes.begin(), sizes.end());
    sizes_ = std::move(sizes);
  }

  /// The whole layout.
  const node_layout& layout() const noexcept { return layout_; }
  /// This rank.
  int rank() const noexcept { return rank_; }
  /// World size.
  int size() const noexcept { return layout_.size(); }
  /// Number of nodes.
  int nodes() const noexcept { return nodes_; }
  /// This rank's node index.
  int node() const noexcept { return node_; }
  /// This rank's index within its node (0 = the node's leader).
  int local_rank() const noexcept { return local_rank_; }
  /// Ranks on this rank's node.
  int local_size() const noexcept { return local_size_; }
  /// Ranks on node k.
  int node_size(int k) const noexcept { return sizes_[static_cast<std::size_t>(k)]; }
  /// The largest node's size.
  int max_local_size() const noexcept { return max_local_; }
  /// True when every node has the same number of ranks.
  bool uniform() const noexcept { return uniform_; }
  /// The node of rank r.
  int node_of(int r) const noexcept { return layout_.node_of[static_cast<std::size_t>(r)]; }
  /// True when the transport spans several nodes and some node holds more
  /// than one rank: the case where a hierarchical algorithm differs from a
  /// flat one.
  bool hierarchical() const noexcept { return nodes_ > 1 && max_local_ > 1; }

private:
  node_layout layout_;
  int rank_ = 0;
  int nodes_ = 1, node_ = 0, local_rank_ = 0, local_size_ = 1, max_local_ = 1;
  bool uniform_ = true;
  std::vector<int> sizes_{1};
};

namespace detail {
/// DPKIT_RANKS_PER_NODE: k >= 1 divides each host into virtual nodes of k
/// consecutive local ranks (dpkit::mpi's topology); 0 or unset: one node per host.
/// @throws dpkit::invalid_argument naming a malformed value.
inline int ranks_per_node_from_env() {
  const char* s = std::getenv("DPKIT_RANKS_PER_NODE");
  if (!s || !*s) return 0;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end != '\0' || v < 0 || v > 1000000)
    throw invalid_argument(std::string("DPKIT_RANKS_PER_NODE: expected a rank count >= 0, got '") + s + "'");
  return static_cast<int>(v);
}
} // namespace detail

} // namespace dpkit
