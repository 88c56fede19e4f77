/// @file reduce.hpp
/// @brief Shared-memory reduce on one node (also dpkit::reduce with
/// algorithm::shm; ncclReduce's semantics): per chunk of one buffer, every
/// rank copies its chunk in, one step, root reduces the n buffers in rank
/// order ((n-1) x m reduced on root).///
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

/// Reduce of `count` elements of every rank's `in` into root's `out`, in
/// chunks of one buffer: every rank copies its chunk in, one step, root
/// reduces all buffers in rank order (the bits of the sequential reduction).
template <class C, element T>
void reduce_shm_raw(C& comm, const op_context& ctx, shm_segment& seg, const T* in, T* out, std::size_t count, reduce_op op,
                    int root, const collective_options& o) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t cap = shm_chunk_elems<T>(seg, ctx);
  shm_claim claim(seg, ctx);
  collective_scope<C> S(comm, ctx, coll_kind::reduce, "shm", element_type_of_v<T>, count, op, root, o);
  if (count == 0) return shm_zero_count_check(comm, seg, S, ctx);
  if (n == 1) return shm_single_rank(in, out, count);
  shm_steps<C> st(comm, seg, S, ctx);
  for (std::size_t off = 0; off < count; off += cap) {
    const std::size_t m = std::min(cap, count - off);
    const int b = st.next_buffer();
    std::memcpy(static_cast<void*>(st.mine(b)), static_cast<const void*>(in + off), m * sizeof(T));
    st.step();
    if (r == root) shm_reduce_ranks<T>(out + off, [&](int p) { return reinterpret_cast<const T*>(st.of(p, b)); }, n, m, op);
  }
}

} // namespace detail

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

} // namespace dpkit
