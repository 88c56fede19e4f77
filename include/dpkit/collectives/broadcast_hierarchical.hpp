/// @file broadcast_hierarchical.hpp
/// @brief Hierarchical (node-aware) broadcast on a hierarchical_transport:
/// inside root's node from root, between nodes among the ranks of root's
/// local rank (one cross-node tree; on layouts whose nodes differ in size,
/// among the nodes' leaders), then inside every other node (shared memory
/// when the node has a segment and the buffers are host memory, else a
/// tree). Each node receives the message over the network once, where a flat
/// tree over all ranks sends it to every rank of a node separately.
#pragma once

#include "broadcast_tree.hpp"
#include "detail/hierarchical.hpp"
#include "shm/broadcast.hpp"

namespace dpkit {

/// Out-of-place hierarchical broadcast: out = root's in on every rank. On
/// one node, or with one rank per node, it is broadcast_shm (a shared
/// segment, host buffers) or broadcast_tree.
/// @param in   count elements, read on root only (may be empty elsewhere).
/// @param out  count elements on every rank (on root: in's size; may alias in).
/// @param root rank in [0, world size).
/// @param o    timeout (for the whole collective; each stage gets what is
///             left), tag, check level.
/// Every rank must pass the same count, root and options.
/// @throws dpkit::invalid_argument (root, sizes, spaces, not a
///         hierarchical_transport); dpkit::timeout_error, dpkit::peer_error,
///         dpkit::mismatch_error from any stage, on every rank.
template <transport C, tensor In, tensor Out>
void broadcast_hierarchical(C& comm, const In& in, Out&& out, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<Out>;
  const auto ctx = detail::make_context(comm, "broadcast_hierarchical");
  const auto ip_outp = detail::resolve_broadcast(comm, ctx, in, out, root);
  if constexpr (hierarchical_transport<C>) {
    if (!comm.topology().hierarchical()) {
      if (space_of(out) == memory_space::host && detail::shm_available(comm)) return broadcast_shm(comm, in, out, root, o);
      return broadcast_tree(comm, in, out, root, o);
    }
    const std::size_t count = size_of(out);
    if (ctx.rank == root && ip_outp.first != ip_outp.second && count)
      detail::make_local<C, T>(comm, ctx, space_of(out)).copy(ip_outp.second, ip_outp.first, count);
    detail::broadcast_hierarchical_raw<C, T>(comm, ctx, ip_outp.second, count, root, space_of(out), o);
  } else {
    (void)ip_outp, (void)o;
    ctx.invalid("algorithm::hierarchical requested but this transport does not know its nodes "
                "(not a hierarchical_transport)");
  }
}

/// In-place hierarchical broadcast of t from root.
template <transport C, tensor Tn>
void broadcast_hierarchical(C& comm, Tn&& t, int root = 0, const collective_options& o = {}) {
  broadcast_hierarchical(comm, t, t, root, o);
}

} // namespace dpkit
