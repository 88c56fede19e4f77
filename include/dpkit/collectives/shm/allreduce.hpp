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
#include <cstring>
#include <optional>

namespace dpkit {

namespace detail {
/// Which shared-memory all-reduce runs.
enum class shm_mode : std::uint8_t { one_shot, two_shot };

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
  if (count == 0) return shm_zero_count_check(comm, seg, S, ctx);
  if (n == 1) return shm_single_rank(in, out, count);
  shm_steps<C> st(comm, seg, S, ctx);
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
  for (std::size_t off = 0; off < count; off += cap) {
    const std::size_t m = std::min(cap, count - off);
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
