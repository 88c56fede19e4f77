/// @file allgather.hpp
/// @brief `allgather(comm, in, out, algorithm)`: all-gather with the algorithm
/// chosen by the caller: ring (allgather_ring.hpp), shm (shm/allgather.hpp;
/// what `automatic` picks when the transport has a shared segment, else ring)
/// or the transport's native one (MPI_Allgather, ncclAllGather).
/// Semantics of ncclAllGather.
#pragma once

#include "allgather_hierarchical.hpp"
#include "allgather_ring.hpp"
#include "shm/allgather.hpp"
#include "policy.hpp"

namespace dpkit {

/// Out-of-place all-gather: out[k * count + i] = rank k's in[i].
/// @param in  count elements on every rank.
/// @param out count x n elements, same element type and memory space.
/// @param a   ring, native, shm (allgather_shm), hierarchical
///            (allgather_hierarchical; what automatic picks across nodes of
///            equal size) or automatic (shm when the
///            transport has a shared segment and the buffers are host memory,
///            else ring; ring also where it measured faster:
///            detail::automatic_with_shm, docs/tuning.md); tree does
///            not exist here.
/// @throws dpkit::invalid_argument (sizes, spaces, tree requested, native on a
///         transport without native collectives), dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void allgather(C& comm, const In& in, Out&& out, algorithm a = algorithm::automatic, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  if (a == algorithm::automatic)
    a = detail::hierarchical_uniform(comm)
            ? algorithm::hierarchical
            : detail::automatic_with_shm(comm, detail::coll_kind::allgather, size_of(in) * sizeof(T), algorithm::ring,
                                         in, out);
  if (a == algorithm::ring) return allgather_ring(comm, in, out, o);
  if (a == algorithm::hierarchical) return allgather_hierarchical(comm, in, out, o);
  if (a == algorithm::shm) return allgather_shm(comm, in, out, o);
  const auto ctx = detail::make_context(comm, "allgather_native");
  if (a != algorithm::native) detail::no_such_algorithm(ctx, algorithm_name(a));
  const std::size_t count = size_of(in);
  const auto ip_outp = detail::resolve_inout(comm, ctx, in, out, count * static_cast<std::size_t>(ctx.size));
  const auto ip = ip_outp.first;
  const auto outp = ip_outp.second;
  detail::call_native(comm, ctx, detail::coll_kind::allgather, element_type_of_v<T>, count, std::nullopt, -1, o,
                      [&](auto& c) { c.native_allgather(ip, outp, count, element_type_of_v<T>); });
}

/// In-place all-gather (NCCL's convention): t holds count x n elements and
/// this rank's contribution is already in t[rank * count, (rank + 1) * count).
/// @throws as the out-of-place overload; t.size() must be a multiple of n.
template <transport C, tensor Tn>
void allgather(C& comm, Tn&& t, algorithm a = algorithm::automatic, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  if (a == algorithm::automatic) {
    const std::size_t per_rank = size_of(t) / static_cast<std::size_t>(comm.size()) * sizeof(T);
    a = detail::hierarchical_uniform(comm)
            ? algorithm::hierarchical
            : detail::automatic_with_shm(comm, detail::coll_kind::allgather, per_rank, algorithm::ring, t);
  }
  if (a == algorithm::ring) return allgather_ring(comm, t, o);
  if (a == algorithm::hierarchical) return allgather_hierarchical(comm, t, o);
  if (a == algorithm::shm) return allgather_shm(comm, t, o);
  const auto ctx = detail::make_context(comm, "allgather_native");
  if (a != algorithm::native) detail::no_such_algorithm(ctx, algorithm_name(a));
  const auto p_count = detail::resolve_chunked_inplace(comm, ctx, t);
  const auto p = p_count.first;
  const auto count = p_count.second;
  const T* own = p + static_cast<std::size_t>(ctx.rank) * count;
  detail::call_native(comm, ctx, detail::coll_kind::allgather, element_type_of_v<T>, count, std::nullopt, -1, o,
                      [&](auto& c) { c.native_allgather(own, p, count, element_type_of_v<T>); });
}

} // namespace dpkit
