// dpkit internals: the bodies of the shared-memory all-reduces (one-shot and
// two-shot), apart from their documented entry point in
// collectives/allreduce_shm.hpp. Not for users.
#pragma once

#include "common.hpp"
#include "shm_steps.hpp"

#include <algorithm>
#include <cstring>

namespace dpkit::detail {

/// Which shared-memory all-reduce runs.
enum class shm_mode : std::uint8_t { one_shot, two_shot };

/// dst = src[0] op src[1] op ... op src[n-1] over `len` elements (rank order,
/// so every rank computing it gets the same bits); avg divides by n after.
template <element T, class Src>
void shm_reduce_ranks(T* dst, Src&& src, int n, std::size_t len, reduce_op op) {
  if (len == 0) return;
  if (n == 1) std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src(0)), len * sizeof(T));
  else {
    reduce_host(dst, src(0), src(1), len, op);
    for (int p = 2; p < n; ++p) reduce_host(dst, static_cast<const T*>(dst), src(p), len, op);
  }
  if (op == reduce_op::avg) divide_host(dst, len, static_cast<std::size_t>(n));
}

/// Shared-memory all-reduce of `count` host elements from `in` to `out`
/// (in == out: in place), through segment `seg` in chunks of at most one
/// buffer. one_shot: per chunk, every rank copies its input into its buffer,
/// one step, every rank reduces all buffers in rank order into out (one
/// synchronization per chunk). two_shot: per chunk, copy in, one step, rank r
/// reduces slice r of every buffer (rank order) into its other buffer, a
/// second step, every rank copies every slice to out. Results are bitwise
/// identical on every rank.
template <class C, element T>
void allreduce_shm_raw(C& comm, const op_context& ctx, shm_segment& seg, const T* in, T* out, std::size_t count,
                       reduce_op op, const collective_options& o, shm_mode mode) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t cap = shm_chunk_elems<T>(seg, ctx);
  shm_claim claim(seg, ctx);
  collective_scope<C> S(comm, ctx, coll_kind::allreduce, mode == shm_mode::one_shot ? "shm1" : "shm2",
                        element_type_of_v<T>, count, op, -1, o);
  if (count == 0) return;
  if (n == 1) return shm_single_rank(in, out, count);
  shm_steps<C> st(comm, seg, S, ctx);
  for (std::size_t off = 0; off < count; off += cap) {
    const std::size_t m = std::min(cap, count - off);
    const int b = st.next_buffer();
    std::memcpy(static_cast<void*>(st.mine(b)), static_cast<const void*>(in + off), m * sizeof(T));
    st.step();
    if (mode == shm_mode::one_shot) {
      shm_reduce_ranks<T>(out + off, [&](int p) { return reinterpret_cast<const T*>(st.of(p, b)); }, n, m, op);
      continue;
    }
    const auto own = chunk_range(m, n, r); // no structured binding: clang 14 cannot capture one
    const std::size_t sb = own.first, se = own.second;
    const int b2 = st.next_buffer();
    T* red = reinterpret_cast<T*>(st.mine(b2));
    shm_reduce_ranks<T>(red + sb, [&](int p) { return reinterpret_cast<const T*>(st.of(p, b)) + sb; }, n, se - sb, op);
    st.step();
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(m, n, p);
      if (pe > pb)
        std::memcpy(static_cast<void*>(out + off + pb), static_cast<const void*>(reinterpret_cast<const T*>(st.of(p, b2)) + pb),
                    (pe - pb) * sizeof(T));
    }
  }
}

} // namespace dpkit::detail
