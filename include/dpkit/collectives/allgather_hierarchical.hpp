/// @file allgather_hierarchical.hpp
/// @brief Hierarchical (node-aware) all-gather and reduce-scatter across
/// nodes on a hierarchical_transport with a uniform layout (every node has
/// the same number of ranks): the stage between nodes runs among the ranks
/// of one local rank (ring on the cross transport), the stage inside a node
/// through its shared segment (host buffers) or a ring. Each node's link then
/// carries (N-1)/N of the all-gather's output (of the reduce-scatter's input)
/// for N nodes, where a flat ring over all n ranks carries (n-1)/n of it
/// through the one ring link that leaves the node: 1.5x less at 2 nodes of 2.
/// Semantics of ncclAllGather and ncclReduceScatter (NCCL's in-place
/// conventions). On one node, with one rank per node or on layouts whose
/// nodes differ in size, the flat algorithm runs (shm or ring).
#pragma once

#include "allgather_ring.hpp"
#include "detail/hierarchical.hpp"
#include "reduce_scatter_ring.hpp"
#include "shm/allgather.hpp"
#include "shm/reduce_scatter.hpp"

namespace dpkit {

namespace detail {
template <class C>
bool hierarchical_uniform(C& comm) {
  if constexpr (hierarchical_transport<C>) return comm.topology().hierarchical() && comm.topology().uniform();
  else return false;
}
} // namespace detail

/// Out-of-place hierarchical all-gather: out[k * count + i] = rank k's in[i].
/// @param in  count elements on every rank (may be out + rank * count: in place).
/// @param out count x n elements.
/// @param o   timeout for the whole collective (each stage gets what is
///            left), tag, check level.
/// @throws dpkit::invalid_argument (sizes, spaces, not a
///         hierarchical_transport); dpkit::timeout_error, dpkit::peer_error,
///         dpkit::mismatch_error from any stage, on every rank.
template <transport C, tensor In, tensor Out>
void allgather_hierarchical(C& comm, const In& in, Out&& out, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "allgather_hierarchical");
  if constexpr (hierarchical_transport<C>) {
    if (!detail::hierarchical_uniform(comm)) {
      if (space_of(in) == memory_space::host && detail::shm_available(comm)) return allgather_shm(comm, in, out, o);
      return allgather_ring(comm, in, out, o);
    }
    const std::size_t count = size_of(in);
    const auto [ip, outp] = detail::resolve_inout(comm, ctx, in, out, count * static_cast<std::size_t>(ctx.size));
    detail::allgather_hierarchical_raw<C, T>(comm, ctx, ip, outp, count, space_of(in), o,
                                             detail::make_local<C, T>(comm, ctx, space_of(in)));
  } else {
    (void)in, (void)out, (void)o;
    ctx.invalid("algorithm::hierarchical requested but this transport does not know its nodes "
                "(not a hierarchical_transport)");
  }
}
/// In-place hierarchical all-gather (NCCL's convention): t holds count x n
/// elements, this rank's part already at t[rank * count].
template <transport C, tensor Tn>
void allgather_hierarchical(C& comm, Tn&& t, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  const auto ctx = detail::make_context(comm, "allgather_hierarchical");
  const auto p_count = detail::resolve_chunked_inplace(comm, ctx, t);
  tensor_view<const T> own{p_count.first + static_cast<std::size_t>(ctx.rank) * p_count.second, p_count.second,
                           space_of(t)};
  allgather_hierarchical(comm, own, t, o);
}

/// Out-of-place hierarchical reduce-scatter: out[i] = op over ranks of
/// in[rank * count + i].
/// @param in  count x n elements on every rank.
/// @param out count elements (may be in + rank * count: in place).
/// @param op  sum, prod, min, max or avg (sum over every rank, divided by the
///            world size once).
/// @throws as allgather_hierarchical.
template <transport C, tensor In, tensor Out>
void reduce_scatter_hierarchical(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                                 const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "reduce_scatter_hierarchical");
  if constexpr (hierarchical_transport<C>) {
    if (!detail::hierarchical_uniform(comm)) {
      if (space_of(in) == memory_space::host && detail::shm_available(comm))
        return reduce_scatter_shm(comm, in, out, op, o);
      return reduce_scatter_ring(comm, in, out, op, o);
    }
    const std::size_t n = static_cast<std::size_t>(ctx.size);
    if (size_of(in) % n != 0)
      ctx.invalid("input has " + std::to_string(size_of(in)) + " elements, not a multiple of the world size " +
                  std::to_string(n));
    const std::size_t count = size_of(in) / n;
    const auto [ip, outp] = detail::resolve_inout(comm, ctx, in, out, count);
    detail::reduce_scatter_hierarchical_raw<C, T>(comm, ctx, ip, outp, count, op, space_of(in), o,
                                                  detail::make_local<C, T>(comm, ctx, space_of(in)));
  } else {
    (void)in, (void)out, (void)op, (void)o;
    ctx.invalid("algorithm::hierarchical requested but this transport does not know its nodes "
                "(not a hierarchical_transport)");
  }
}
/// In-place hierarchical reduce-scatter (NCCL's convention): t holds count x
/// n elements; the result lands in t[rank * count, (rank + 1) * count).
template <transport C, tensor Tn>
void reduce_scatter_hierarchical(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  const auto ctx = detail::make_context(comm, "reduce_scatter_hierarchical");
  const auto p_count = detail::resolve_chunked_inplace(comm, ctx, t);
  tensor_view<const T> all{p_count.first, p_count.second * static_cast<std::size_t>(ctx.size), space_of(t)};
  tensor_view<T> own{p_count.first + static_cast<std::size_t>(ctx.rank) * p_count.second, p_count.second, space_of(t)};
  reduce_scatter_hierarchical(comm, all, own, op, o);
}

} // namespace dpkit
