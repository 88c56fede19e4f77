/// @file reduce_tree.hpp
/// @brief Tree reduce: out at `root` = op over all ranks of in; pipelined up a
/// binary tree rooted at `root` (semantics of ncclReduce / MPI_Reduce).
#pragma once

#include "detail/tree.hpp"


namespace dpkit {

/// Reduces every rank's `in` into `out` on rank `root`.
/// @param in  tensor of count elements on every rank.
/// @param out tensor of count elements on root (same type and space as in);
///            ignored on other ranks (may be empty there).
/// @param op  sum, prod, min, max or avg (root divides by the world size).
/// @param root rank in [0, world size).
/// @throws dpkit::invalid_argument (root out of range, out size differs on
///         root, wrong memory space), dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void reduce_tree(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum, int root = 0,
                 const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "reduce_tree");
  const auto [ip, outp] = detail::resolve_reduce(comm, ctx, in, out, root);
  const std::size_t count = size_of(in);
  detail::tree_raw<C, T>(comm, ctx, ip, outp, count, op, root, detail::tree_mode::reduce, o,
                         detail::make_local<C, T>(comm, ctx, space_of(in)));
}

/// In-place tree reduce: on root, t becomes op over all ranks of t; on other
/// ranks t is only read.
template <transport C, tensor Tn>
void reduce_tree(C& comm, Tn&& t, reduce_op op = reduce_op::sum, int root = 0, const collective_options& o = {}) {
  reduce_tree(comm, t, t, op, root, o);
}

} // namespace dpkit
