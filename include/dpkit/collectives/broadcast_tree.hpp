/// @file broadcast_tree.hpp
/// @brief Tree broadcast: root's buffer to every rank, pipelined down a binary
/// tree rooted at `root` (semantics of ncclBroadcast / MPI_Bcast).
#pragma once

#include "detail/tree.hpp"


namespace dpkit {

/// Out-of-place broadcast: out = root's in on every rank.
/// @param in  count elements, read on root only (may be empty elsewhere).
/// @param out count elements on every rank (count = out's size; on root it
///            must equal in's size).
/// @param root rank in [0, world size).
/// Every rank must pass the same count.
/// @throws dpkit::invalid_argument, dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void broadcast_tree(C& comm, const In& in, Out&& out, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<Out>;
  const auto ctx = detail::make_context(comm, "broadcast_tree");
  const auto [ip, outp] = detail::resolve_broadcast(comm, ctx, in, out, root);
  const std::size_t count = size_of(out);
  detail::tree_raw<C, T>(comm, ctx, ip, outp, count, reduce_op::sum, root, detail::tree_mode::broadcast, o,
                         detail::make_local<C, T>(comm, ctx, space_of(out)));
}

/// In-place broadcast of tensor t from root.
template <transport C, tensor Tn>
void broadcast_tree(C& comm, Tn&& t, int root = 0, const collective_options& o = {}) {
  broadcast_tree(comm, t, t, root, o);
}

} // namespace dpkit
