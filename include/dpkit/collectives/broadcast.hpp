/// @file broadcast.hpp
/// @brief `broadcast(comm, in, out, root, algorithm)`: broadcast with the
/// algorithm chosen by the caller: tree (broadcast_tree.hpp), shm
/// (shm/broadcast.hpp; what `automatic` picks when the transport has a
/// shared segment, else tree), hierarchical (broadcast_hierarchical.hpp;
/// what `automatic` picks when the ranks span several nodes) or the
/// transport's native one (MPI_Bcast, ncclBroadcast). Semantics of
/// ncclBroadcast.
#pragma once

#include "broadcast_hierarchical.hpp"
#include "broadcast_tree.hpp"
#include "shm/broadcast.hpp"
#include "policy.hpp"

namespace dpkit {

/// Out-of-place broadcast: out = root's in on every rank.
/// @param in  count elements, read on root only (may be empty elsewhere).
/// @param out count elements on every rank (on root: in's size).
/// @param root rank in [0, world size).
/// @param a   tree, native, shm (broadcast_shm), hierarchical
///            (broadcast_hierarchical) or automatic (hierarchical across
///            nodes; else shm when the
///            transport has a shared segment and the buffers are host memory,
///            else tree; tree also where it measured faster:
///            detail::automatic_with_shm, docs/tuning.md); ring does
///            not exist here.
/// @throws dpkit::invalid_argument (root, sizes, spaces, ring requested, native
///         on a transport without native collectives), dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void broadcast(C& comm, const In& in, Out&& out, int root = 0, algorithm a = algorithm::automatic,
               const collective_options& o = {}) {
  using T = tensor_value_t<Out>;
  if (a == algorithm::automatic) {
    bool hier = false;
    if constexpr (hierarchical_transport<C>) hier = comm.topology().hierarchical();
    a = hier ? algorithm::hierarchical
             : detail::automatic_with_shm(comm, detail::coll_kind::broadcast, size_of(out) * sizeof(T),
                                          algorithm::tree, in, out);
  }
  if (a == algorithm::tree) return broadcast_tree(comm, in, out, root, o);
  if (a == algorithm::hierarchical) return broadcast_hierarchical(comm, in, out, root, o);
  if (a == algorithm::shm) return broadcast_shm(comm, in, out, root, o);
  const auto ctx = detail::make_context(comm, "broadcast_native");
  if (a != algorithm::native) detail::no_such_algorithm(ctx, algorithm_name(a));
  const auto ip_outp = detail::resolve_broadcast(comm, ctx, in, out, root);
  const auto ip = ip_outp.first;
  const auto outp = ip_outp.second;
  detail::call_native(comm, ctx, detail::coll_kind::broadcast, element_type_of_v<T>, size_of(out), std::nullopt, root, o,
                      [&](auto& c) { c.native_broadcast(ip ? ip : outp, outp, size_of(out), element_type_of_v<T>, root); });
}

/// In-place broadcast of t from root.
template <transport C, tensor Tn>
void broadcast(C& comm, Tn&& t, int root = 0, algorithm a = algorithm::automatic, const collective_options& o = {}) {
  dpkit::broadcast(comm, t, t, root, a, o);
}

} // namespace dpkit
