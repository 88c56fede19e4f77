/// @file allgather.hpp
/// @brief Shared-memory all-gather on one node (also dpkit::allgather with
/// algorithm::shm; ncclAllGather's semantics, in place when in = out +
/// rank x count): per chunk of one buffer, every rank copies its part in,
/// one step, every rank copies every part out (m in, n x m out).///
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

/// All-gather of `count` elements per rank: out[p * count + i] = rank p's
/// in[i], in chunks of one buffer: every rank copies its chunk in, one step,
/// every rank copies every rank's chunk out. `in` may be out + rank * count.
template <class C, element T>
void allgather_shm_raw(C& comm, const op_context& ctx, shm_segment& seg, const T* in, T* out, std::size_t count,
                       const collective_options& o) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t cap = shm_chunk_elems<T>(seg, ctx);
  shm_claim claim(seg, ctx);
  collective_scope<C> S(comm, ctx, coll_kind::allgather, "shm", element_type_of_v<T>, count, std::nullopt, -1, o);
  if (count == 0) return shm_zero_count_check(comm, seg, S, ctx);
  T* own = out + static_cast<std::size_t>(r) * count;
  if (n == 1) return shm_single_rank(in, own, count);
  shm_steps<C> st(comm, seg, S, ctx);
  for (std::size_t off = 0; off < count; off += cap) {
    const std::size_t m = std::min(cap, count - off);
    const int b = st.next_buffer();
    std::memcpy(static_cast<void*>(st.mine(b)), static_cast<const void*>(in + off), m * sizeof(T));
    st.step();
    for (int p = 0; p < n; ++p) {
      T* dst = out + static_cast<std::size_t>(p) * count + off;
      const T* src = p == r ? in + off : reinterpret_cast<const T*>(st.of(p, b));
      if (dst != src) std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), m * sizeof(T));
    }
  }
}

} // namespace detail

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

} // namespace dpkit
