// dpkit internals: the bodies of the shared-memory broadcast, reduce,
// all-gather and reduce-scatter (collectives/shm_collectives.hpp is their
// documented entry point). Each is one numbered step per chunk over the
// transport's segment (shm_steps.hpp), like the one-shot all-reduce. Not for
// users.
#pragma once

#include "allreduce_shm.hpp"
#include "common.hpp"
#include "shm_steps.hpp"

#include <algorithm>
#include <cstring>

namespace dpkit::detail {

/// Broadcast of `count` elements from root's `in` to every rank's `out`, in
/// chunks of one buffer: root copies the chunk into its buffer, one step,
/// every other rank copies it out.
template <class C, element T>
void broadcast_shm_raw(C& comm, const op_context& ctx, shm_segment& seg, const T* in, T* out, std::size_t count, int root,
                       const collective_options& o) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t cap = shm_chunk_elems<T>(seg, ctx);
  shm_claim claim(seg, ctx);
  collective_scope<C> S(comm, ctx, coll_kind::broadcast, "shm", element_type_of_v<T>, count, std::nullopt, root, o);
  if (count == 0) return;
  if (n == 1) return shm_single_rank(in, out, count);
  shm_steps<C> st(comm, seg, S, ctx);
  for (std::size_t off = 0; off < count; off += cap) {
    const std::size_t m = std::min(cap, count - off);
    const int b = st.next_buffer();
    if (r == root) std::memcpy(static_cast<void*>(st.mine(b)), static_cast<const void*>(in + off), m * sizeof(T));
    st.step();
    const T* from = r == root ? in + off : reinterpret_cast<const T*>(st.of(root, b));
    if (out + off != from) std::memcpy(static_cast<void*>(out + off), static_cast<const void*>(from), m * sizeof(T));
  }
}

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
  if (count == 0) return;
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
  if (count == 0) return;
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
  if (count == 0) return;
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

} // namespace dpkit::detail
