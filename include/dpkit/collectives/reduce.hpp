/// @file reduce.hpp
/// @brief `reduce(comm, in, out, op, root, algorithm)`: reduce to one rank with
/// the algorithm chosen by the caller: tree (reduce_tree.hpp), shm
/// (shm/reduce.hpp; what `automatic` picks when the transport has a
/// shared segment, else tree) or the transport's native one (MPI_Reduce,
/// ncclReduce).
/// Semantics of ncclReduce.
#pragma once

#include "policy.hpp"
#include "reduce_tree.hpp"
#include "shm/reduce.hpp"

namespace dpkit {

/// Reduces every rank's in into out on root: out[i] = op over ranks of in[i].
/// @param in  count elements on every rank.
/// @param out count elements on root (ignored elsewhere; may be empty there).
/// @param op  sum, prod, min, max or avg (root divides by the world size).
/// @param a   tree, native, shm (reduce_shm) or automatic (shm when the
///            transport has a shared segment and the buffers are host memory,
///            else tree; tree also where it measured faster:
///            detail::automatic_with_shm, docs/tuning.md); ring does not
///            exist here.
/// @throws dpkit::invalid_argument (root, sizes, spaces, ring requested, native
///         on a transport without native collectives), dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void reduce(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum, int root = 0,
            algorithm a = algorithm::automatic, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  if (a == algorithm::automatic)
    a = detail::automatic_with_shm(comm, detail::coll_kind::reduce, size_of(in) * sizeof(T),
                                   algorithm::tree, in, out);
  if (a == algorithm::tree) return reduce_tree(comm, in, out, op, root, o);
  if (a == algorithm::shm) return reduce_shm(comm, in, out, op, root, o);
  const auto ctx = detail::make_context(comm, "reduce_native");
  if (a != algorithm::native) detail::no_such_algorithm(ctx, algorithm_name(a));
  const auto ip_outp = detail::resolve_reduce(comm, ctx, in, out, root);
  const auto ip = ip_outp.first;
  const auto outp = ip_outp.second;
  detail::call_native(comm, ctx, detail::coll_kind::reduce, element_type_of_v<T>, size_of(in), op, root, o,
                      [&](auto& c) { c.native_reduce(ip, outp, size_of(in), element_type_of_v<T>, op, root); });
}

/// In-place reduce: on root t becomes the reduction; elsewhere t is only read.
template <transport C, tensor Tn>
void reduce(C& comm, Tn&& t, reduce_op op = reduce_op::sum, int root = 0, algorithm a = algorithm::automatic,
            const collective_options& o = {}) {
  dpkit::reduce(comm, t, t, op, root, a, o);
}

} // namespace dpkit
