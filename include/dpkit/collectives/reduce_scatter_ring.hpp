/// @file reduce_scatter_ring.hpp
/// @brief Ring reduce-scatter (semantics of ncclReduceScatter /
/// MPI_Reduce_scatter_block): rank r receives chunk r of the element-wise
/// reduction of every rank's input.
///
/// n-1 steps; in step t rank r sends its partial sum of chunk (r-t-1) to the
/// right and reduces chunk (r-t-2) from the left, so it ends holding chunk r.
/// Pipelined in segments; scratch is 2 x pipeline_depth segments.
#pragma once

#include "detail/reduce_scatter_ring.hpp"

#include <vector>

namespace dpkit {

/// Out-of-place ring reduce-scatter.
/// @param in  count x n elements (n = world size) on every rank.
/// @param out count elements: chunk `rank` of the reduction, i.e. out[i] = op
///            over ranks of in[rank * count + i].
/// @param op  sum, prod, min, max or avg.
/// @throws dpkit::invalid_argument if in.size() != out.size() x n, spaces
///         differ or the transport cannot move them; dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void reduce_scatter_ring(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                         const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "reduce_scatter_ring");
  const std::size_t total = size_of(in), n = static_cast<std::size_t>(ctx.size);
  if (total % n != 0)
    ctx.invalid("input has " + std::to_string(total) + " elements, not a multiple of the world size " +
                std::to_string(n));
  const auto [ip, outp] = detail::resolve_inout(comm, ctx, in, out, total / n);
  detail::reduce_scatter_ring_raw<C, T>(comm, ctx, ip, outp, total / n, op, o,
                                        detail::make_local<C, T>(comm, ctx, space_of(in)));
}

/// In-place ring reduce-scatter (NCCL's in-place convention): t holds count x
/// n elements; the result lands in t[rank * count, (rank + 1) * count); the
/// rest of t is left unchanged.
/// @throws dpkit::invalid_argument if t.size() is not a multiple of n.
template <transport C, tensor Tn>
void reduce_scatter_ring(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  const auto ctx = detail::make_context(comm, "reduce_scatter_ring");
  const auto [p, count] = detail::resolve_chunked_inplace(comm, ctx, t);
  detail::reduce_scatter_ring_raw<C, T>(comm, ctx, p, p + static_cast<std::size_t>(ctx.rank) * count, count, op, o,
                                        detail::make_local<C, T>(comm, ctx, space_of(t)));
}

} // namespace dpkit
