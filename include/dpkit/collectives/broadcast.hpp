/// @file broadcast.hpp
/// @brief `broadcast(comm, in, out, root, algorithm)`: broadcast with the
/// algorithm chosen by the caller: tree (broadcast_tree.hpp; also what
/// `automatic` picks) or the transport's native one (MPI_Bcast,
/// ncclBroadcast). Semantics of ncclBroadcast.
#pragma once

#include "broadcast_tree.hpp"
#include "policy.hpp"

namespace dpkit {

/// Out-of-place broadcast: out = root's in on every rank.
/// @param in  count elements, read on root only (may be empty elsewhere).
/// @param out count elements on every rank (on root: in's size).
/// @param root rank in [0, world size).
/// @param a   tree or automatic (tree), or native; ring does not exist here.
/// @throws dpkit::invalid_argument (root, sizes, spaces, ring requested, native
///         on a transport without native collectives), dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void broadcast(C& comm, const In& in, Out&& out, int root = 0, algorithm a = algorithm::automatic,
               const collective_options& o = {}) {
  using T = tensor_value_t<Out>;
  if (a == algorithm::automatic || a == algorithm::tree) return broadcast_tree(comm, in, out, root, o);
  const auto ctx = detail::make_context(comm, "broadcast_native");
  if (a != algorithm::native) detail::no_such_algorithm(ctx, algorithm_name(a));
  const auto [ip, outp] = detail::resolve_broadcast(comm, ctx, in, out, root);
  detail::call_native(comm, ctx, [&](auto& c) { c.native_broadcast(ip ? ip : outp, outp, size_of(out), element_type_of_v<T>, root); });
}

/// In-place broadcast of t from root.
template <transport C, tensor Tn>
void broadcast(C& comm, Tn&& t, int root = 0, algorithm a = algorithm::automatic, const collective_options& o = {}) {
  dpkit::broadcast(comm, t, t, root, a, o);
}

} // namespace dpkit
