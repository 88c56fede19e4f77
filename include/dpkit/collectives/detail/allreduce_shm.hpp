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
/// synchronization per chunk). two_shot: per chunk, every rank copies the
/// slices its peers reduce into its buffer, one step, rank r reduces slice r
/// (its own input for its own part, the peers' copies for theirs, rank order)
/// into its other buffer and out, a second step, every rank copies the peers'
/// slices to out. Results are bitwise identical on every rank.
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
    if (mode == shm_mode::one_shot) {
      std::memcpy(static_cast<void*>(st.mine(b)), static_cast<const void*>(in + off), m * sizeof(T));
      st.step();
      shm_reduce_ranks<T>(out + off, [&](int p) { return reinterpret_cast<const T*>(st.of(p, b)); }, n, m, op);
      continue;
    }
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(m, n, p);
      if (p != r && pe > pb)
        std::memcpy(static_cast<void*>(reinterpret_cast<T*>(st.mine(b)) + pb), static_cast<const void*>(in + off + pb),
                    (pe - pb) * sizeof(T));
    }
    st.step();
    const auto own = chunk_range(m, n, r); // no structured binding: clang 14 cannot capture one
    const std::size_t sb = own.first, se = own.second;
    // Slice r of the result: own input (private) and every peer's copy of
    // slice r, in rank order, into slice r of this rank's buffer of the
    // second step (a rank copies in only the slices its peers reduce), in
    // blocks small enough to stay in L1 so the copy to out reads no memory.
    const int b2 = st.next_buffer();
    T* red = reinterpret_cast<T*>(st.mine(b2));
    constexpr std::size_t block = std::max<std::size_t>(1, (std::size_t{16} << 10) / sizeof(T));
    for (std::size_t q = sb; q < se; q += block) {
      const std::size_t len = std::min(block, se - q);
      shm_reduce_ranks<T>(
          red + q, [&](int p) { return p == r ? in + off + q : reinterpret_cast<const T*>(st.of(p, b)) + q; }, n, len,
          op);
      std::memcpy(static_cast<void*>(out + off + q), static_cast<const void*>(red + q), len * sizeof(T));
    }
    st.step();
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(m, n, p);
      if (p != r && pe > pb)
        std::memcpy(static_cast<void*>(out + off + pb), static_cast<const void*>(reinterpret_cast<const T*>(st.of(p, b2)) + pb),
                    (pe - pb) * sizeof(T));
    }
  }
}

} // namespace dpkit::detail
