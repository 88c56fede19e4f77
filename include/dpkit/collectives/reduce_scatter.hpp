/// @file reduce_scatter.hpp
/// @brief `reduce_scatter(comm, in, out, op, algorithm)`: reduce-scatter with
/// the algorithm chosen by the caller: ring (reduce_scatter_ring.hpp), shm
/// (shm/reduce_scatter.hpp; what `automatic` picks when the transport has a
/// shared segment, else ring) or the transport's native one
/// (MPI_Reduce_scatter_block, ncclReduceScatter). Semantics of ncclReduceScatter.
#pragma once

#include "allgather_hierarchical.hpp"
#include "policy.hpp"
#include "reduce_scatter_ring.hpp"
#include "shm/reduce_scatter.hpp"

namespace dpkit {

/// Out-of-place reduce-scatter: out[i] = op over ranks of in[rank * count + i].
/// @param in  count x n elements (n = world size) on every rank.
/// @param out count elements, same element type and memory space.
/// @param op  sum, prod, min, max or avg.
/// @param a   ring, native, shm (reduce_scatter_shm), hierarchical
///            (reduce_scatter_hierarchical; what automatic picks across nodes
///            of equal size) or automatic (shm when the
///            transport has a shared segment and the buffers are host memory,
///            else ring; ring also where it measured faster:
///            detail::automatic_with_shm, docs/tuning.md); tree
///            does not exist here.
/// Every rank must pass the same count, op, algorithm and options.
/// @throws dpkit::invalid_argument (sizes, spaces, tree requested, native on a
///         transport without native collectives), dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void reduce_scatter(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                    algorithm a = algorithm::automatic, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  if (a == algorithm::automatic) {
    const std::size_t per_rank = size_of(in) / static_cast<std::size_t>(comm.size()) * sizeof(T);
    a = detail::hierarchical_uniform(comm)
            ? algorithm::hierarchical
            : detail::automatic_with_shm(comm, detail::coll_kind::reduce_scatter, per_rank, algorithm::ring, in, out);
  }
  if (a == algorithm::ring) return reduce_scatter_ring(comm, in, out, op, o);
  if (a == algorithm::hierarchical) return reduce_scatter_hierarchical(comm, in, out, op, o);
  if (a == algorithm::shm) return reduce_scatter_shm(comm, in, out, op, o);
  const auto ctx = detail::make_context(comm, "reduce_scatter_native");
  if (a != algorithm::native) detail::no_such_algorithm(ctx, algorithm_name(a));
  const std::size_t n = static_cast<std::size_t>(ctx.size), total = size_of(in);
  if (total % n != 0)
    ctx.invalid("input has " + std::to_string(total) + " elements, not a multiple of the world size " +
                std::to_string(n));
  const auto ip_outp = detail::resolve_inout(comm, ctx, in, out, total / n);
  const auto ip = ip_outp.first;
  const auto outp = ip_outp.second;
  detail::call_native(comm, ctx, detail::coll_kind::reduce_scatter, element_type_of_v<T>, total / n, op, -1, o,
                      [&](auto& c) { c.native_reduce_scatter(ip, outp, total / n, element_type_of_v<T>, op); });
}

/// In-place reduce-scatter (NCCL's convention): t holds count x n elements;
/// the result lands in t[rank * count, (rank + 1) * count).
/// @throws as the out-of-place overload; t.size() must be a multiple of n.
template <transport C, tensor Tn>
void reduce_scatter(C& comm, Tn&& t, reduce_op op = reduce_op::sum, algorithm a = algorithm::automatic,
                    const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  if (a == algorithm::automatic) {
    const std::size_t per_rank = size_of(t) / static_cast<std::size_t>(comm.size()) * sizeof(T);
    a = detail::hierarchical_uniform(comm)
            ? algorithm::hierarchical
            : detail::automatic_with_shm(comm, detail::coll_kind::reduce_scatter, per_rank, algorithm::ring, t);
  }
  if (a == algorithm::ring) return reduce_scatter_ring(comm, t, op, o);
  if (a == algorithm::hierarchical) return reduce_scatter_hierarchical(comm, t, op, o);
  if (a == algorithm::shm) return reduce_scatter_shm(comm, t, op, o);
  const auto ctx = detail::make_context(comm, "reduce_scatter_native");
  if (a != algorithm::native) detail::no_such_algorithm(ctx, algorithm_name(a));
  const auto p_count = detail::resolve_chunked_inplace(comm, ctx, t);
  const auto p = p_count.first;
  const auto count = p_count.second;
  T* own = p + static_cast<std::size_t>(ctx.rank) * count;
  detail::call_native(comm, ctx, detail::coll_kind::reduce_scatter, element_type_of_v<T>, count, op, -1, o,
                      [&](auto& c) { c.native_reduce_scatter(p, own, count, element_type_of_v<T>, op); });
}

} // namespace dpkit
