/// @file shm_collectives.hpp
/// @brief Shared-memory broadcast, reduce, all-gather and reduce-scatter on
/// one node (the shm refinement, like allreduce_shm.hpp), also reached through
/// broadcast / reduce / allgather / reduce_scatter with algorithm::shm.
/// Semantics of ncclBroadcast, ncclReduce, ncclAllGather and ncclReduceScatter
/// (NCCL's in-place conventions).
///
/// Each is one synchronization per chunk of the transport's buffer
/// (DPKIT_SHM_BYTES; a reduce-scatter chunk is a buffer / n per rank): the
/// ranks that contribute copy their chunk into their buffer of the segment,
/// publish a numbered step and wait for every peer's, then read the peers'
/// buffers directly: broadcast copies root's buffer out; reduce has root
/// reduce every buffer in rank order; all-gather copies every buffer out;
/// reduce-scatter has rank r reduce slice r of every buffer in rank order.
/// Per rank and chunk of m bytes: broadcast moves m (2m on root), reduce m in
/// plus (n-1) x m reduced on root, all-gather m in and n x m out,
/// reduce-scatter n x m in and (n-1) x m reduced. Reductions are in rank
/// order 0, 1, ..., n-1: the bits of the sequential reduction, identical from
/// run to run.
///
/// Host memory only; every wait under the collective's deadline, with the
/// fingerprint and failure checks of docs/reliability.md; one shm collective
/// at a time per transport. Requirements and errors as allreduce_shm: a
/// shared_memory_transport whose shm() is available (dpkit::mpi with every
/// rank on one node, dpkit::inproc), else dpkit::invalid_argument.
#pragma once

#include "detail/shm_collectives.hpp"

namespace dpkit {

namespace detail {
/// The shared segment of `comm` for a shm collective on host tensors, or
/// invalid_argument naming the operation.
template <class C>
shm_segment& shm_for(C& comm, const op_context& ctx, memory_space space) {
  if (space != memory_space::host) ctx.invalid("shared-memory collectives need host tensors");
  return shm_of(comm, ctx);
}
} // namespace detail

/// Out-of-place shared-memory broadcast: out = root's in on every rank.
/// @param in   count elements, read on root only (may be empty elsewhere).
/// @param out  count elements on every rank (on root: in's size; may alias in).
/// @param root rank in [0, world size).
/// Every rank must pass the same count, root and options.
/// @throws dpkit::invalid_argument (root, sizes, device tensors, no shared
///         segment, another shm collective running on this transport);
///         dpkit::timeout_error; dpkit::peer_error; dpkit::mismatch_error.
template <transport C, tensor In, tensor Out>
void broadcast_shm(C& comm, const In& in, Out&& out, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<Out>;
  const auto ctx = detail::make_context(comm, "broadcast_shm");
  const auto ip_outp = detail::resolve_broadcast(comm, ctx, in, out, root);
  if constexpr (shared_memory_transport<C>) {
    detail::shm_segment& seg = detail::shm_for(comm, ctx, space_of(out));
    detail::broadcast_shm_raw<C, T>(comm, ctx, seg, ip_outp.first, ip_outp.second, size_of(out), root, o);
  } else {
    (void)ip_outp, (void)o;
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}
/// In-place shared-memory broadcast of t from root.
template <transport C, tensor Tn>
void broadcast_shm(C& comm, Tn&& t, int root = 0, const collective_options& o = {}) {
  broadcast_shm(comm, t, t, root, o);
}

/// Shared-memory reduce: root's out[i] = op over ranks of in[i].
/// @param in   count elements on every rank.
/// @param out  count elements on root (may alias in; ignored elsewhere, may be empty).
/// @param op   sum, prod, min, max or avg (root divides by the world size).
/// @param root rank in [0, world size).
/// @throws as broadcast_shm.
template <transport C, tensor In, tensor Out>
void reduce_shm(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum, int root = 0,
                const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "reduce_shm");
  const auto ip_outp = detail::resolve_reduce(comm, ctx, in, out, root);
  if constexpr (shared_memory_transport<C>) {
    detail::shm_segment& seg = detail::shm_for(comm, ctx, space_of(in));
    detail::reduce_shm_raw<C, T>(comm, ctx, seg, ip_outp.first, ip_outp.second, size_of(in), op, root, o);
  } else {
    (void)ip_outp, (void)op, (void)o;
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}
/// In-place shared-memory reduce: on root t becomes the reduction; elsewhere t is only read.
template <transport C, tensor Tn>
void reduce_shm(C& comm, Tn&& t, reduce_op op = reduce_op::sum, int root = 0, const collective_options& o = {}) {
  reduce_shm(comm, t, t, op, root, o);
}

/// Out-of-place shared-memory all-gather: out[k * count + i] = rank k's in[i].
/// @param in  count elements on every rank.
/// @param out count x n elements.
/// @throws as broadcast_shm.
template <transport C, tensor In, tensor Out>
void allgather_shm(C& comm, const In& in, Out&& out, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "allgather_shm");
  const std::size_t count = size_of(in);
  const auto ip_outp = detail::resolve_inout(comm, ctx, in, out, count * static_cast<std::size_t>(ctx.size));
  if constexpr (shared_memory_transport<C>) {
    detail::shm_segment& seg = detail::shm_for(comm, ctx, space_of(in));
    detail::allgather_shm_raw<C, T>(comm, ctx, seg, ip_outp.first, ip_outp.second, count, o);
  } else {
    (void)ip_outp, (void)o;
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}
/// In-place shared-memory all-gather (NCCL's convention): t holds count x n
/// elements, this rank's contribution already in t[rank * count, (rank + 1) * count).
/// @throws as broadcast_shm; t.size() must be a multiple of n.
template <transport C, tensor Tn>
void allgather_shm(C& comm, Tn&& t, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  const auto ctx = detail::make_context(comm, "allgather_shm");
  const auto p_count = detail::resolve_chunked_inplace(comm, ctx, t);
  if constexpr (shared_memory_transport<C>) {
    detail::shm_segment& seg = detail::shm_for(comm, ctx, space_of(t));
    T* p = p_count.first;
    detail::allgather_shm_raw<C, T>(comm, ctx, seg, p + static_cast<std::size_t>(ctx.rank) * p_count.second, p, p_count.second, o);
  } else {
    (void)p_count, (void)o;
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}

/// Out-of-place shared-memory reduce-scatter: out[i] = op over ranks of
/// in[rank * count + i].
/// @param in  count x n elements on every rank.
/// @param out count elements.
/// @param op  sum, prod, min, max or avg.
/// @throws as broadcast_shm; also when a buffer holds fewer than n elements.
template <transport C, tensor In, tensor Out>
void reduce_scatter_shm(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "reduce_scatter_shm");
  const std::size_t n = static_cast<std::size_t>(ctx.size), total = size_of(in);
  if (total % n != 0)
    ctx.invalid("input has " + std::to_string(total) + " elements, not a multiple of the world size " + std::to_string(n));
  const auto ip_outp = detail::resolve_inout(comm, ctx, in, out, total / n);
  if constexpr (shared_memory_transport<C>) {
    detail::shm_segment& seg = detail::shm_for(comm, ctx, space_of(in));
    detail::reduce_scatter_shm_raw<C, T>(comm, ctx, seg, ip_outp.first, ip_outp.second, total / n, op, o);
  } else {
    (void)ip_outp, (void)op, (void)o;
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}
/// In-place shared-memory reduce-scatter (NCCL's convention): t holds count x n
/// elements; the result lands in t[rank * count, (rank + 1) * count).
/// @throws as the out-of-place overload; t.size() must be a multiple of n.
template <transport C, tensor Tn>
void reduce_scatter_shm(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  const auto ctx = detail::make_context(comm, "reduce_scatter_shm");
  const auto p_count = detail::resolve_chunked_inplace(comm, ctx, t);
  if constexpr (shared_memory_transport<C>) {
    detail::shm_segment& seg = detail::shm_for(comm, ctx, space_of(t));
    T* p = p_count.first;
    detail::reduce_scatter_shm_raw<C, T>(comm, ctx, seg, p, p + static_cast<std::size_t>(ctx.rank) * p_count.second,
                                         p_count.second, op, o);
  } else {
    (void)p_count, (void)op, (void)o;
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}

} // namespace dpkit
