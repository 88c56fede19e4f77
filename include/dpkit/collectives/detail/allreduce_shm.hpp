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

/// The two-shot all-reduce of `count` host elements from `in` to `out`
/// (in == out: in place) in chunks of `cap` elements, pipelined: between two
/// steps a rank copies chunk t - 1's reduced slices of its peers out (the
/// all-gather), reduces its own slice of chunk t (the reduce-scatter: its own
/// input and the peers' copies, rank order, so every rank gets the same bits)
/// and copies in chunk t + 1's slices for its peers. K chunks take K + 1 steps
/// instead of 2K (one chunk: copy in, step, reduce, step, copy out), and a
/// rank that is ahead goes on with the next chunk while a peer still copies
/// the previous one out. Rank p's slice of every chunk lives at a fixed place
/// of a buffer (region p, where a full chunk puts it): in the buffer of step
/// t + 1 a rank's regions q != r hold its copies of chunk t + 1's slices for
/// rank q and region r its reduced slice of chunk t. Every write before a step
/// goes to that step's buffer, as the step protocol requires (shm_steps.hpp),
/// so back-to-back collectives stay safe.
template <class C, element T>
void allreduce_shm_two_shot_raw(shm_steps<C>& st, const T* in, T* out, std::size_t count, std::size_t cap, int n,
                                int r, reduce_op op) {
  const std::size_t chunks = (count + cap - 1) / cap;
  auto len_of = [&](std::size_t t) { return std::min(cap, count - t * cap); };
  auto region = [&](int p) { return chunk_range(cap, n, p).first; };
  auto copy_in = [&](std::size_t t, int b) {
    const std::size_t off = t * cap, m = len_of(t);
    T* buf = reinterpret_cast<T*>(st.mine(b));
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(m, n, p);
      if (p != r && pe > pb)
        std::memcpy(static_cast<void*>(buf + region(p)), static_cast<const void*>(in + off + pb), (pe - pb) * sizeof(T));
    }
  };
  int b = st.next_buffer();
  copy_in(0, b);
  st.step();
  const std::size_t mine_at = region(r);
  for (std::size_t t = 0; t < chunks; ++t) {
    const std::size_t off = t * cap, m = len_of(t);
    const int bn = st.next_buffer();
    // Slice r of chunk t: own input (private) and every peer's copy, in rank
    // order, into region r of the next step's buffer, in blocks small enough
    // to stay in L1 so the copy to out reads no memory.
    const auto own = chunk_range(m, n, r); // no structured binding: clang 14 cannot capture one
    const std::size_t sb = own.first, se = own.second;
    T* red = reinterpret_cast<T*>(st.mine(bn)) + mine_at;
    constexpr std::size_t block = std::max<std::size_t>(1, (std::size_t{16} << 10) / sizeof(T));
    for (std::size_t q = sb; q < se; q += block) {
      const std::size_t len = std::min(block, se - q);
      shm_reduce_ranks<T>(
          red + (q - sb),
          [&](int p) { return p == r ? in + off + q : reinterpret_cast<const T*>(st.of(p, b)) + mine_at + (q - sb); }, n,
          len, op);
      std::memcpy(static_cast<void*>(out + off + q), static_cast<const void*>(red + (q - sb)), len * sizeof(T));
    }
    if (t + 1 < chunks) copy_in(t + 1, bn);
    st.step();
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(m, n, p);
      if (p != r && pe > pb)
        std::memcpy(static_cast<void*>(out + off + pb),
                    static_cast<const void*>(reinterpret_cast<const T*>(st.of(p, bn)) + region(p)), (pe - pb) * sizeof(T));
    }
    b = bn;
  }
}

/// Shared-memory all-reduce of `count` host elements from `in` to `out`
/// (in == out: in place), through segment `seg` in chunks of at most one
/// buffer. one_shot: per chunk, every rank copies its input into its buffer,
/// one step, every rank reduces all buffers in rank order into out (one
/// synchronization per chunk). two_shot: allreduce_shm_two_shot_raw. Results
/// are bitwise identical on every rank.
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
  if (mode == shm_mode::two_shot) return allreduce_shm_two_shot_raw<C, T>(st, in, out, count, cap, n, r, op);
  for (std::size_t off = 0; off < count; off += cap) {
    const std::size_t m = std::min(cap, count - off);
    const int b = st.next_buffer();
    std::memcpy(static_cast<void*>(st.mine(b)), static_cast<const void*>(in + off), m * sizeof(T));
    st.step();
    shm_reduce_ranks<T>(out + off, [&](int p) { return reinterpret_cast<const T*>(st.of(p, b)); }, n, m, op);
  }
}

} // namespace dpkit::detail
