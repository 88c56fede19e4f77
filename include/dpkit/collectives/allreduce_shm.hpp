/// @file allreduce_shm.hpp
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

#include "detail/allreduce_shm.hpp"
#include "policy.hpp"

#include <optional>

namespace dpkit {

namespace detail {
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
