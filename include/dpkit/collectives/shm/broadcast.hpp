/// @file broadcast.hpp
/// @brief Shared-memory broadcast on one node (also dpkit::broadcast with
/// algorithm::shm; ncclBroadcast's semantics): per chunk of one buffer, root
/// copies the chunk into its buffer, one step, every other rank copies it
/// out (root moves 2m bytes, the others m).///
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
  if (count == 0) return shm_zero_count_check(comm, seg, S, ctx);
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

} // namespace detail

/// Out-of-place shared-memory broadcast: out = root's in on every rank.
/// @param in   count elements, read on root only (may be empty elsewhere).
/// @param out  count elements on every rank (on root: in's size; may alias in).
/// @param root rank in [0, world size).
/// Every rank must pass the same count, root and options.
/// @throws dpkit::invalid_argument (root, sizes, device tensors, no shared
///         segment, another shm collective running on this transport);
///         dpkit::timeout_error; dpkit::peer_error; dpkit::mismatch_error.
template <transport C, tensor In, tensor Out>
void broadcast_shm(C& comm, const In& in, Out&& out, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<Out>;
  const auto ctx = detail::make_context(comm, "broadcast_shm");
  const auto ip_outp = detail::resolve_broadcast(comm, ctx, in, out, root);
  if constexpr (shared_memory_transport<C>) {
    detail::shm_segment& seg = detail::shm_for(comm, ctx, space_of(out));
    detail::broadcast_shm_raw<C, T>(comm, ctx, seg, ip_outp.first, ip_outp.second, size_of(out), root, o);
  } else {
    (void)ip_outp, (void)o;
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}
/// In-place shared-memory broadcast of t from root.
template <transport C, tensor Tn>
void broadcast_shm(C& comm, Tn&& t, int root = 0, const collective_options& o = {}) {
  broadcast_shm(comm, t, t, root, o);
}

} // namespace dpkit
