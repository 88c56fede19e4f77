/// @file allreduce_tree.hpp
/// @brief Tree all-reduce: pipelined reduce up a binary tree rooted at rank 0,
/// then broadcast down it.
///
/// Cost: 2 ceil(log2 n) hops of latency per segment instead of the ring's
/// 2(n-1): wins for small messages and large world sizes. Each interior rank
/// receives from two children, so per-rank traffic is up to 2x the ring's and
/// busbw is lower for large messages. (NCCL's double binary tree, which
/// balances this by using two complementary trees, is the reference for
/// bandwidth at scale; dpkit's single tree is its latency half.)
/// Bitwise-identical results on every rank: the root computes every element
/// and broadcasts it.
#pragma once

#include "detail/tree.hpp"

namespace dpkit {

/// Out-of-place tree all-reduce: out[i] = op over all ranks of in[i].
/// @param in, out tensors of the same element type, count and memory space.
/// @param op sum, prod, min, max or avg.
/// @param o segment size (bytes), pipeline depth, timeout, tag.
/// @throws dpkit::invalid_argument (sizes differ, wrong memory space, bad world size)
/// @throws dpkit::timeout_error if a peer does not take part before the deadline.
template <transport C, tensor In, tensor Out>
void allreduce_tree(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                    const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "allreduce_tree");
  const auto [ip, outp] = detail::resolve_inout(comm, ctx, in, out, size_of(in));
  detail::tree_raw<C, T>(comm, ctx, ip, outp, size_of(in), op, 0, detail::tree_mode::allreduce, o,
                         detail::make_local<C, T>(comm, ctx, space_of(in)));
}

/// In-place tree all-reduce of tensor t.
template <transport C, tensor Tn>
void allreduce_tree(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  allreduce_tree(comm, t, t, op, o);
}

} // namespace dpkit
