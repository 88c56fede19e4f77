/// @file reduce_scatter.hpp
/// @brief Shared-memory reduce-scatter on one node (also
/// dpkit::reduce_scatter with algorithm::shm; ncclReduceScatter's semantics,
/// in place when out = in + rank x count): per chunk of floor(buffer / n)
/// elements per rank, every rank copies the chunk of each of its n input
/// slices in, one step, rank r reduces slice r of the n buffers in rank
/// order (n x m in, (n-1) x m reduced).///
/// Host memory only; every wait under the collective's deadline, with the
/// fingerprint and failure checks of docs/reliability.md; one shm collective
/// at a time per transport. Requires a shared_memory_transport whose shm()
/// is available (dpkit::mpi with every rank on one node, dpkit::inproc),
/// else dpkit::invalid_argument. Reductions are in rank order 0, 1, ...,
/// n-1: the bits of the sequential reduction, identical from run to run.
/// Steps, buffers and waits: steps.hpp; the protocol and costs:
/// docs/algorithms.md "Shared memory".
#pragma once

#include "steps.hpp"

#include <algorithm>
#include <cstring>

namespace dpkit {

namespace detail {

/// Reduce-scatter to `count` elements per rank: out[i] = op over ranks p of
/// rank p's in[rank * count + i], in chunks of floor(buffer / n) elements per
/// rank: every rank copies the chunk of each of the n slices of its input
/// into its buffer, one step, rank r reduces slice r of every buffer in rank
/// order. `out` may be in + rank * count.
template <class C, element T>
void reduce_scatter_shm_raw(C& comm, const op_context& ctx, shm_segment& seg, const T* in, T* out, std::size_t count,
                            reduce_op op, const collective_options& o) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t nn = static_cast<std::size_t>(n);
  const std::size_t cap = shm_chunk_elems<T>(seg, ctx, nn);
  shm_claim claim(seg, ctx);
  collective_scope<C> S(comm, ctx, coll_kind::reduce_scatter, "shm", element_type_of_v<T>, count, op, -1, o);
  if (count == 0) return shm_zero_count_check(comm, seg, S, ctx);
  if (n == 1) return shm_single_rank(in, out, count);
  shm_steps<C> st(comm, seg, S, ctx);
  for (std::size_t off = 0; off < count; off += cap) {
    const std::size_t m = std::min(cap, count - off);
    const int b = st.next_buffer();
    T* mine = reinterpret_cast<T*>(st.mine(b));
    for (std::size_t q = 0; q < nn; ++q)
      std::memcpy(static_cast<void*>(mine + q * m), static_cast<const void*>(in + q * count + off), m * sizeof(T));
    st.step();
    const std::size_t at = static_cast<std::size_t>(r) * m;
    shm_reduce_ranks<T>(out + off, [&](int p) { return reinterpret_cast<const T*>(st.of(p, b)) + at; }, n, m, op);
  }
}

} // namespace detail

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
