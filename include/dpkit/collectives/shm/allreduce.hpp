/// @file allreduce.hpp
/// @brief Shared-memory all-reduce on one node (the shm refinement,
/// shared_memory_transport): one-shot for small messages, two-shot for large
/// ones, the shape of DeepSpeed's CPU all-reduce (csrc/cpu/comm/shm.cpp) and
/// Open MPI's coll/sm and coll/xhc.
///
/// One-shot: every rank copies its input into its buffer of the shared
/// segment, publishes a step, waits for every peer's step, and reduces all
/// buffers itself in rank order: one synchronization, n-1 reductions of the
/// whole message per rank. Two-shot: every rank copies in only the n-1 slices
/// its peers reduce, one step; rank r reduces slice r (its own input and the
/// peers' copies, rank order) into its second buffer and out, a second step,
/// and every rank copies the peers' slices out: two synchronizations, count/n
/// reduced elements per rank (a reduce-scatter and an all-gather over the
/// shared slices). Messages larger than one buffer (DPKIT_SHM_BYTES, default 4 MiB
/// for mpi, 256 KiB for inproc) go through in chunks. Two buffers per rank and
/// numbered steps make back-to-back calls safe without a barrier.
///
/// Results are bitwise identical on every rank and from run to run: every
/// element is reduced in rank order 0, 1, ..., n-1 (one-shot: by every rank
/// alike; two-shot: by one rank, then copied).
///
/// Host memory only. Every wait is under the collective's deadline and
/// watches for failed peers (docs/reliability.md); one shm collective at a
/// time per transport.
#pragma once

#include "steps.hpp"
#include "../../core/copy_nontemporal.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

namespace dpkit {

namespace detail {
/// Which shared-memory all-reduce runs.
enum class shm_mode : std::uint8_t { one_shot, two_shot };

/// How far ahead (bytes) reduce_into_two asks for its inputs' lines
/// (software prefetch). Measured on the 2-vCPU EPYC VM, one core, out0 and
/// out1 each half of a buffer of 1-4 MiB as the direct all-reduce writes
/// them: without it the loop took 1.12-1.15x a memcpy of the buffer, with
/// it 1.00-1.02x at 128-384 bytes and 1.07x at 512; at 8 MiB both ran
/// under the memcpy's time (benchmarks/results/2026-12-05-direct-prefetch.md).
inline constexpr std::size_t reduce_into_two_prefetch_bytes = 256;

/// out0[i] = out1[i] = a[i] op b[i] for i in [0, len) (two ranks' outputs of
/// the direct all-reduce out of place: two loads, two stores per element,
/// no staging block), a 64-byte line at a time, asking for the inputs'
/// lines reduce_into_two_prefetch_bytes ahead. The four ranges must not
/// overlap. Op as combine_any (the bits of reduce_host(dst, a, b)).
template <reduce_op Op, class T>
void reduce_into_two(T* __restrict out0, T* __restrict out1, const T* __restrict a, const T* __restrict b,
                     std::size_t len) noexcept {
  constexpr std::size_t L = sizeof(T) >= 64 ? 1 : 64 / sizeof(T);
  constexpr std::size_t P = reduce_into_two_prefetch_bytes / sizeof(T);
  std::size_t i = 0;
  for (; i + L <= len; i += L) {
#if defined(__GNUC__)
    if (len - i >= P + L) { // within the inputs
      __builtin_prefetch(a + i + P, 0, 3);
      __builtin_prefetch(b + i + P, 0, 3);
    }
#endif
    T* __restrict d0 = out0 + i;
    T* __restrict d1 = out1 + i;
    const T* __restrict x = a + i;
    const T* __restrict y = b + i;
    for (std::size_t k = 0; k < L; ++k) {
      const T v = combine_any<Op>(x[k], y[k]);
      d0[k] = v;
      d1[k] = v;
    }
  }
  for (; i < len; ++i) out0[i] = out1[i] = combine_any<Op>(a[i], b[i]);
}

/// x0[i] = x1[i] = x0[i] op x1[i] for i in [0, len) (two ranks' buffers of
/// the direct all-reduce in place). The ranges must not overlap.
template <reduce_op Op, class T>
void reduce_both_in_place(T* __restrict x0, T* __restrict x1, std::size_t len) noexcept {
  constexpr std::size_t B = block_elems<T>;
  const std::size_t nb = len / B;
  for (std::size_t blk = 0; blk < nb; ++blk) {
    T* __restrict d0 = x0 + blk * B;
    T* __restrict d1 = x1 + blk * B;
    for (std::size_t k = 0; k < B; ++k) {
      const T v = combine_any<Op>(d0[k], d1[k]);
      d0[k] = v;
      d1[k] = v;
    }
  }
  for (std::size_t i = nb * B; i < len; ++i) x0[i] = x1[i] = combine_any<Op>(x0[i], x1[i]);
}

/// reduce_into_two with non-temporal stores: out0[i] = out1[i] = a[i] op b[i]
/// for i in [0, len), each 64-byte line of results computed in registers
/// and streamed to both outputs, with no staging block (the two-rank direct
/// all-reduce out of place). On the 2-vCPU EPYC VM, 256 MiB per core: 0.88x
/// the time of a non-temporal copy of the same bytes on one core and
/// 0.95-0.96x on two at once, against 1.09-1.14x through an 8 KiB block
/// copied out twice
/// (benchmarks/results/2026-12-04-direct-fused-nontemporal.md). Ordinary
/// stores before the first 16-byte-aligned element and after the last whole
/// line; the caller fences (store_fence) before publishing. The ranges must
/// not overlap. Returns false, having written nothing, when out0 and out1 lie
/// at different addresses modulo 16 (no aligned line in common) or without
/// SSE2.
template <reduce_op Op, class T>
bool reduce_into_two_nontemporal(T* __restrict out0, T* __restrict out1, const T* __restrict a,
                                 const T* __restrict b, std::size_t len) noexcept {
#if defined(__SSE2__)
  static_assert(16 % sizeof(T) == 0);
  const auto a0 = reinterpret_cast<std::uintptr_t>(out0), a1 = reinterpret_cast<std::uintptr_t>(out1);
  if (a0 % 16 != a1 % 16) return false;
  std::size_t head = ((16 - a0 % 16) % 16) / sizeof(T);
  if (head > len) head = len;
  std::size_t i = 0;
  for (; i < head; ++i) out0[i] = out1[i] = combine_any<Op>(a[i], b[i]);
  constexpr std::size_t L = 64 / sizeof(T);
  for (; i + L <= len; i += L) {
    alignas(16) T v[L];
    for (std::size_t k = 0; k < L; ++k) v[k] = combine_any<Op>(a[i + k], b[i + k]);
    const __m128i v0 = _mm_load_si128(reinterpret_cast<const __m128i*>(v));
    const __m128i v1 = _mm_load_si128(reinterpret_cast<const __m128i*>(v) + 1);
    const __m128i v2 = _mm_load_si128(reinterpret_cast<const __m128i*>(v) + 2);
    const __m128i v3 = _mm_load_si128(reinterpret_cast<const __m128i*>(v) + 3);
    auto* d0 = reinterpret_cast<__m128i*>(out0 + i);
    auto* d1 = reinterpret_cast<__m128i*>(out1 + i);
    _mm_stream_si128(d0, v0);
    _mm_stream_si128(d0 + 1, v1);
    _mm_stream_si128(d0 + 2, v2);
    _mm_stream_si128(d0 + 3, v3);
    _mm_stream_si128(d1, v0);
    _mm_stream_si128(d1 + 1, v1);
    _mm_stream_si128(d1 + 2, v2);
    _mm_stream_si128(d1 + 3, v3);
  }
  for (; i < len; ++i) out0[i] = out1[i] = combine_any<Op>(a[i], b[i]);
  return true;
#else
  (void)out0, (void)out1, (void)a, (void)b, (void)len;
  return false;
#endif
}

/// half_into_two_nontemporal: out0[i] = out1[i] = a[i] op b[i] for f16 (on
/// F16C) or bf16 (on AVX2), i in [0, len), a 64-byte line at a time in
/// registers, streamed to both outputs (detail/reduce_f16c.hpp,
/// detail/reduce_bf16_avx2.hpp); ordinary stores before the first
/// 16-byte-aligned element and after the last whole line. Same bits as
/// reduce_host. Returns false, having written nothing, when the vector path
/// is off (no such CPU, DPKIT_F16C=0, DPKIT_BF16_AVX2=0), or out0 and out1
/// lie at different addresses modulo 16. The caller fences.
template <reduce_op Op, class T>
bool half_into_two_nontemporal(T* out0, T* out1, const T* a, const T* b, std::size_t len) noexcept {
  const auto a0 = reinterpret_cast<std::uintptr_t>(out0), a1 = reinterpret_cast<std::uintptr_t>(out1);
  if (a0 % 16 != a1 % 16 || a0 % 2 != 0) return false;
  std::size_t head = ((16 - a0 % 16) % 16) / sizeof(T);
  if (head > len) head = len;
  const std::size_t lines = half_into_two_nt_vector(lane_op_of(Op), out0 + head, out1 + head, a + head, b + head,
                                                    len - head);
  if (lines == static_cast<std::size_t>(-1)) return false;
  for (std::size_t i = 0; i < head; ++i) out0[i] = out1[i] = combine_any<Op>(a[i], b[i]);
  for (std::size_t i = head + lines; i < len; ++i) out0[i] = out1[i] = combine_any<Op>(a[i], b[i]);
  return true;
}

/// The two-rank direct all-reduce's slice [b, e) without a staging block,
/// for sum, prod, min and max: with ordinary stores straight into both
/// outputs (reduce_into_two, or reduce_both_in_place in place); with
/// `nontemporal`, out of place on both ranks only, a line at a time from
/// registers (reduce_into_two_nontemporal; the caller fences). f16 and bf16
/// take only the non-temporal case, on their vector loops
/// (half_into_two_nontemporal): their portable loops combine through f32
/// one element at a time, and reduce_host's vector paths through the
/// caller's block serve the other cases better. Returns false when it does
/// not apply (the caller stages through a block).
template <element T>
bool direct_two_ranks_fused(const T* const* ins, T* const* outs, std::size_t b, std::size_t e, reduce_op op,
                            bool nontemporal) noexcept {
  if (op == reduce_op::avg) return false;
  const bool ip0 = static_cast<const void*>(ins[0]) == static_cast<const void*>(outs[0]);
  const bool ip1 = static_cast<const void*>(ins[1]) == static_cast<const void*>(outs[1]);
  if (ip0 != ip1 || (nontemporal && ip0)) return false;
  if constexpr (is_half_v<T>)
    if (!nontemporal) return false;
  auto run = [&]<reduce_op Op>() {
    if constexpr (is_half_v<T>) {
      return half_into_two_nontemporal<Op>(outs[0] + b, outs[1] + b, ins[0] + b, ins[1] + b, e - b);
    } else {
      if (nontemporal) return reduce_into_two_nontemporal<Op>(outs[0] + b, outs[1] + b, ins[0] + b, ins[1] + b, e - b);
      if (ip0) reduce_both_in_place<Op>(outs[0] + b, outs[1] + b, e - b);
      else reduce_into_two<Op>(outs[0] + b, outs[1] + b, ins[0] + b, ins[1] + b, e - b);
      return true;
    }
  };
  switch (op) {
  case reduce_op::sum: return run.template operator()<reduce_op::sum>();
  case reduce_op::prod: return run.template operator()<reduce_op::prod>();
  case reduce_op::min: return run.template operator()<reduce_op::min>();
  case reduce_op::max: return run.template operator()<reduce_op::max>();
  case reduce_op::avg: break;
  }
  return false;
}

/// The direct all-reduce over symmetric memory (collectives/symmetric_memory.hpp),
/// tried by the two-shot mode once the segment has had a window: every rank
/// publishes which elements of its input and output lie in a window (window
/// id, offset, element range) and takes one step. When every rank's input
/// lies in one same window and every rank's output in one same window, over
/// a common range [lo, hi) of elements (all of them for buffers from
/// allocate_symmetric; the whole pages inside the buffer for
/// register_memory), rank r reduces slice r of that range reading every
/// rank's input where it lies (rank order, so the bits are the two-shot's)
/// and writes it into every rank's output, then one more step: one pass over
/// memory per rank, no copy through the segment (the floor model's "direct",
/// benchmarks/common/bench_floor.hpp). Returns {lo, hi}: the caller runs the
/// two-shot on [0, lo) and [hi, count). Returns nullopt, after the step, when
/// the ranks' buffers do not all qualify (the caller then runs the two-shot
/// on everything); the decision is the same on every rank (it reads the same
/// published words). Outputs out of place are written with non-temporal
/// stores from shm_direct_nontemporal_min_bytes_default (16 MiB;
/// DPKIT_SHM_NT_BYTES overrides it): on two ranks a line at a time from
/// registers (reduce_into_two_nontemporal), otherwise through an 8 KiB block.
template <element T, class Steps>
std::optional<std::pair<std::size_t, std::size_t>> allreduce_shm_direct(Steps& st, const shm_segment& seg,
                                                                        const op_context& ctx, const T* in, T* out,
                                                                        std::size_t count, reduce_op op) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t bytes = count * sizeof(T);
  shm_window_registry& reg = *seg.windows();
  const shm_cover ci = reg.cover(in, bytes, r, sizeof(T));
  const shm_cover co = reg.cover(out, bytes, r, sizeof(T));
  auto& word = seg.control(r).window;
  word[0].store(ci.id, std::memory_order_relaxed);
  word[1].store(ci.offset, std::memory_order_relaxed);
  word[2].store(co.id, std::memory_order_relaxed);
  word[3].store(co.offset, std::memory_order_relaxed);
  word[4].store(ci.begin / sizeof(T), std::memory_order_relaxed);
  word[5].store(ci.end / sizeof(T), std::memory_order_relaxed);
  word[6].store(co.begin / sizeof(T), std::memory_order_relaxed);
  word[7].store(co.end / sizeof(T), std::memory_order_relaxed);
  st.step(); // releases the words; every peer's input is complete from here
  const std::uint64_t want_in = seg.control(0).window[0].load(std::memory_order_relaxed);
  const std::uint64_t want_out = seg.control(0).window[2].load(std::memory_order_relaxed);
  if (want_in == 0 || want_out == 0) return std::nullopt;
  // every rank's buffers, at this process's addresses (small n: on the stack
  // up to 64 ranks)
  constexpr int max_ranks = 64;
  if (n > max_ranks) return std::nullopt;
  // the elements that lie in the windows on every rank
  std::size_t lo = 0, hi = count;
  for (int p = 0; p < n; ++p) {
    const auto& w = seg.control(p).window;
    if (w[0].load(std::memory_order_relaxed) != want_in || w[2].load(std::memory_order_relaxed) != want_out)
      return std::nullopt;
    lo = std::max<std::size_t>({lo, w[4].load(std::memory_order_relaxed), w[6].load(std::memory_order_relaxed)});
    hi = std::min<std::size_t>({hi, w[5].load(std::memory_order_relaxed), w[7].load(std::memory_order_relaxed)});
  }
  if (lo >= hi) return std::nullopt;
  const std::size_t m = hi - lo;
  const T* ins[max_ranks];
  T* outs[max_ranks];
  bool nt_to[max_ranks];
  for (int p = 0; p < n; ++p) {
    const auto& w = seg.control(p).window;
    // rank p's offsets of element lo (it published those of its own first element in the window)
    const std::uint64_t pio = w[1].load(std::memory_order_relaxed) +
                              (lo - w[4].load(std::memory_order_relaxed)) * sizeof(T);
    const std::uint64_t poo = w[3].load(std::memory_order_relaxed) +
                              (lo - w[6].load(std::memory_order_relaxed)) * sizeof(T);
    ins[p] = reinterpret_cast<const T*>(reg.address(want_in, p, pio, m * sizeof(T)));
    outs[p] = reinterpret_cast<T*>(reg.address(want_out, p, poo, m * sizeof(T)));
    nt_to[p] = static_cast<const void*>(ins[p]) != static_cast<const void*>(outs[p]);
  }
  // Every rank named the same windows, so every rank holds them: the
  // addresses exist (a null one would be a peer's range outside its region,
  // which its own cover() never gives).
  const bool big = m * sizeof(T) >= shm_nontemporal_min_bytes(shm_direct_nontemporal_min_bytes_default);
  const auto own = chunk_range(m, n, r);
  const auto done = std::make_optional(std::make_pair(lo, hi));
  // two ranks: reduce straight into both outputs (non-temporal stores a line
  // at a time from registers where the outputs are out of place and big)
  const bool two_nt = big && (nt_to[0] || nt_to[1]);
  if (n == 2 && direct_two_ranks_fused<T>(ins, outs, own.first, own.second, op, two_nt)) {
    if (two_nt) store_fence();
    st.step();
    return done;
  }
  constexpr std::size_t block = std::max<std::size_t>(1, (std::size_t{8} << 10) / sizeof(T));
  alignas(64) std::byte tmp_bytes[block * sizeof(T)];
  T* tmp = reinterpret_cast<T*>(tmp_bytes);
  bool any_nt = false;
  for (std::size_t q = own.first; q < own.second; q += block) {
    const std::size_t len = std::min(block, own.second - q);
    shm_reduce_ranks<T>(tmp, [&](int p) { return ins[p] + q; }, n, len, op);
    for (int p = 0; p < n; ++p) {
      if (big && nt_to[p]) {
        copy_nontemporal(static_cast<void*>(outs[p] + q), static_cast<const void*>(tmp), len * sizeof(T), false);
        any_nt = true;
      } else {
        std::memcpy(static_cast<void*>(outs[p] + q), static_cast<const void*>(tmp), len * sizeof(T));
      }
    }
  }
  if (any_nt) store_fence();
  st.step(); // every output is complete once every rank passed it
  return done;
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
/// two_shot first tries the direct path over symmetric memory
/// (allreduce_shm_direct) once the segment has had a window.
template <class C, element T>
void allreduce_shm_raw(C& comm, const op_context& ctx, shm_segment& seg, const T* in, T* out, std::size_t count,
                       reduce_op op, const collective_options& o, shm_mode mode) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t cap = shm_chunk_elems<T>(seg, ctx);
  shm_claim claim(seg, ctx);
  collective_scope<C> S(comm, ctx, coll_kind::allreduce, mode == shm_mode::one_shot ? "shm1" : "shm2",
                        element_type_of_v<T>, count, op, -1, o);
  if (count == 0) return shm_zero_count_check(comm, seg, S, ctx);
  if (n == 1) return shm_single_rank(in, out, count);
  shm_steps<C> st(comm, seg, S, ctx);
  // the two-shot runs on elements [0, head) and [tail, count): all of them,
  // or what the direct path left (the parts of registered buffers outside
  // their whole pages)
  std::size_t head = count, tail = count;
  if (mode == shm_mode::two_shot && seg.windows()->created() > 0)
    if (const auto direct = allreduce_shm_direct<T>(st, seg, ctx, in, out, count, op)) {
      head = direct->first;
      tail = direct->second;
      if (head == 0 && tail == count) return;
    }
  // Two-shot writes a large output (out of place, from
  // shm_nontemporal_min_bytes_default or DPKIT_SHM_NT_BYTES) with
  // non-temporal stores: ordinary stores read each of its lines first. In
  // place the output's lines are cached by the reads before.
  const bool nt = in != out && count * sizeof(T) >= shm_nontemporal_min_bytes(shm_nontemporal_min_bytes_default);
  // len elements, with non-temporal stores (unfenced: one fence per chunk
  // below) or memcpy
  auto copy = [](T* dst, const T* src, std::size_t len, bool nontemporal) {
    if (nontemporal) copy_nontemporal(static_cast<void*>(dst), static_cast<const void*>(src), len * sizeof(T), false);
    else std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), len * sizeof(T));
  };
  auto to_out = [&](T* dst, const T* src, std::size_t len) { copy(dst, src, len, nt); };
  // What the peers read from the segment: ordinary or non-temporal stores,
  // chosen per chunk by rank 0's tuner from the chunks' times (the faster
  // kind depends on how the cores pass lines now: segment_store_tuner). Rank
  // 0 publishes the next chunk's kind in its control line before the chunk's
  // second step; every rank reads it when the chunk starts (rank 0 cannot
  // publish again before every peer's first step of that chunk).
  segment_store_tuner& tuner = seg.store_tuner();
  std::atomic<std::uint32_t>& store_mode = seg.control(0).store_mode;
  const std::pair<std::size_t, std::size_t> parts[2] = {{0, head}, {tail, count}};
  for (const auto& part : parts) {
    for (std::size_t off = part.first; off < part.second; off += cap) {
      const std::size_t m = std::min(cap, part.second - off);
      const int b = st.next_buffer();
      if (mode == shm_mode::one_shot) {
        std::memcpy(static_cast<void*>(st.mine(b)), static_cast<const void*>(in + off), m * sizeof(T));
        st.step();
        shm_reduce_ranks<T>(out + off, [&](int p) { return reinterpret_cast<const T*>(st.of(p, b)); }, n, m, op);
        continue;
      }
      const std::size_t chunk_bytes = m * sizeof(T);
      const bool tuned = chunk_bytes >= segment_store_tuner::min_bytes;
      const bool seg_nt = tuned && store_mode.load(std::memory_order_acquire) != 0;
      const auto t0 = std::chrono::steady_clock::now();
      auto to_seg = [&](T* dst, const T* src, std::size_t len) { copy(dst, src, len, seg_nt); };
      for (int p = 0; p < n; ++p) {
        const auto [pb, pe] = chunk_range(m, n, p);
        if (p != r && pe > pb) to_seg(reinterpret_cast<T*>(st.mine(b)) + pb, in + off + pb, pe - pb);
      }
      if (seg_nt) store_fence();
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
      // with non-temporal segment stores a block is reduced into tmp (L1),
      // then streamed to red and copied to out
      alignas(64) std::byte tmp_bytes[block * sizeof(T)];
      T* tmp = reinterpret_cast<T*>(tmp_bytes);
      for (std::size_t q = sb; q < se; q += block) {
        const std::size_t len = std::min(block, se - q);
        T* dst = seg_nt ? tmp : red + q;
        shm_reduce_ranks<T>(
            dst, [&](int p) { return p == r ? in + off + q : reinterpret_cast<const T*>(st.of(p, b)) + q; }, n, len,
            op);
        if (seg_nt) to_seg(red + q, dst, len);
        to_out(out + off + q, dst, len);
      }
      if (seg_nt) store_fence();
      if (r == 0 && tuned) store_mode.store(tuner.choose() ? 1u : 0u, std::memory_order_relaxed); // the step releases it
      st.step();
      for (int p = 0; p < n; ++p) {
        const auto [pb, pe] = chunk_range(m, n, p);
        if (p != r && pe > pb) to_out(out + off + pb, reinterpret_cast<const T*>(st.of(p, b2)) + pb, pe - pb);
      }
      // out is this rank's alone: one fence per chunk, not per block, orders
      // its non-temporal stores before whatever the caller stores next
      if (nt) store_fence();
      if (r == 0 && tuned)
        tuner.record(seg_nt, chunk_bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
}
template <class C, tensor In, tensor Out>
void allreduce_shm_entry(C& comm, const In& in, Out& out, reduce_op op, const collective_options& o, const char* name,
                         std::optional<shm_mode> mode /* nullopt: by size */, std::size_t one_shot_max,
                         std::size_t one_shot_max_two_ranks) {
  using T = tensor_value_t<In>;
  const auto ctx = make_context(comm, name);
  const auto [ip, outp] = resolve_inout(comm, ctx, in, out, size_of(in));
  if (space_of(in) != memory_space::host) ctx.invalid("shared-memory all-reduce needs host tensors");
  if constexpr (shared_memory_transport<C>) {
    shm_segment& seg = shm_of(comm, ctx);
    const std::size_t bytes = size_of(in) * sizeof(T);
    const std::size_t limit = ctx.size == 2 ? one_shot_max_two_ranks : one_shot_max;
    const shm_mode m = mode ? *mode : bytes <= limit ? shm_mode::one_shot : shm_mode::two_shot;
    allreduce_shm_raw<C, T>(comm, ctx, seg, ip, outp, size_of(in), op, o, m);
  } else {
    (void)ip, (void)outp, (void)op, (void)o, (void)mode, (void)one_shot_max, (void)one_shot_max_two_ranks;
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}
} // namespace detail

/// Out-of-place shared-memory all-reduce: out[i] = op over all ranks of in[i],
/// one-shot up to `one_shot_max_bytes` bytes (`one_shot_max_bytes_two_ranks`
/// on two ranks), two-shot above. Per rank, one-shot copies m bytes in and
/// reduces (n-1) x m read from the shared buffers; two-shot copies (n-1)/n x m
/// in, reduces (n-1) x m/n and copies (n-1)/n x m out: less traffic, one more
/// synchronization (crossovers measured in docs/tuning.md).
///
/// @param comm a shared_memory_transport whose shm() is available (dpkit::mpi
///             with every rank on one node, dpkit::inproc).
/// @param in   host tensor of `count` elements of any dpkit element type.
/// @param out  host tensor of the same element type and count (may alias in).
/// @param op   sum, prod, min, max, or avg (sum, then divided by the world size).
/// @param o    timeout, tag (the stream in the fingerprint), check level.
/// Every rank must call with the same count, op, options and thresholds
/// (bytes).
/// @throws dpkit::invalid_argument (sizes differ, device tensors, no shared
///         segment, another shm collective running on this transport);
///         dpkit::timeout_error (a peer did not take part before the deadline);
///         dpkit::peer_error (a peer failed); dpkit::mismatch_error (a peer
///         runs another collective).
template <transport C, tensor In, tensor Out>
void allreduce_shm(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum, const collective_options& o = {},
                   std::size_t one_shot_max_bytes = shm_one_shot_max_bytes_default,
                   std::size_t one_shot_max_bytes_two_ranks = shm_one_shot_max_bytes_two_ranks_default) {
  detail::allreduce_shm_entry(comm, in, out, op, o, "allreduce_shm", std::nullopt, one_shot_max_bytes,
                              one_shot_max_bytes_two_ranks);
}
/// In-place shared-memory all-reduce of tensor t (see the out-of-place overload).
template <transport C, tensor Tn>
void allreduce_shm(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {},
                   std::size_t one_shot_max_bytes = shm_one_shot_max_bytes_default,
                   std::size_t one_shot_max_bytes_two_ranks = shm_one_shot_max_bytes_two_ranks_default) {
  detail::allreduce_shm_entry(comm, t, t, op, o, "allreduce_shm", std::nullopt, one_shot_max_bytes,
                              one_shot_max_bytes_two_ranks);
}

/// allreduce_shm forced to the one-shot algorithm at every size (for
/// measurement and tests; same parameters and errors).
template <transport C, tensor In, tensor Out>
void allreduce_shm_one_shot(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                            const collective_options& o = {}) {
  detail::allreduce_shm_entry(comm, in, out, op, o, "allreduce_shm_one_shot", detail::shm_mode::one_shot, 0, 0);
}
/// In-place allreduce_shm_one_shot.
template <transport C, tensor Tn>
void allreduce_shm_one_shot(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  detail::allreduce_shm_entry(comm, t, t, op, o, "allreduce_shm_one_shot", detail::shm_mode::one_shot, 0, 0);
}
/// allreduce_shm forced to the two-shot algorithm at every size (for
/// measurement and tests; same parameters and errors).
template <transport C, tensor In, tensor Out>
void allreduce_shm_two_shot(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                            const collective_options& o = {}) {
  detail::allreduce_shm_entry(comm, in, out, op, o, "allreduce_shm_two_shot", detail::shm_mode::two_shot, 0, 0);
}
/// In-place allreduce_shm_two_shot.
template <transport C, tensor Tn>
void allreduce_shm_two_shot(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  detail::allreduce_shm_entry(comm, t, t, op, o, "allreduce_shm_two_shot", detail::shm_mode::two_shot, 0, 0);
}

} // namespace dpkit
