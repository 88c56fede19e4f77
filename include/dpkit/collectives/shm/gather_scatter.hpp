/// @file gather_scatter.hpp
/// @brief Shared-memory gather and scatter on one node for small blocks
/// (what gather and scatter run when the transport has a shared segment,
/// the buffers are host memory and a rank's block is at most
/// shm_rooted_max_bytes): one step per chunk instead of a message per rank
/// and the acknowledgements of the linear forms. Gather: every rank copies
/// its block into its buffer, one step, root copies every block out.
/// Scatter: root copies every rank's block into its buffer, one step, every
/// rank copies its block out. The step waits for every rank, so every rank
/// of a mismatched call throws in it, as the linear forms' acknowledgements
/// make them do (gather.hpp). Steps, buffers and waits: steps.hpp.
#pragma once

#include "steps.hpp"

#include <algorithm>
#include <cstring>

namespace dpkit::detail {

/// The largest block per rank (bytes) that gather and scatter move through
/// the shared segment; larger blocks go linear, one message per rank (which
/// a node's transport reads once, process_vm_readv, from 64 KiB).
inline constexpr std::size_t shm_rooted_max_bytes = std::size_t{16} << 10;

/// True when gather/scatter of `count` elements of T per rank run through
/// the transport's shared segment: more than one rank, host memory, a block
/// of at most shm_rooted_max_bytes, and buffers that hold at least one
/// element per share (`shares`: scatter puts every rank's part of a chunk in
/// root's buffer). The same answer on every rank of a call (same count, one
/// node, one segment size).
template <class T, class C>
bool rooted_uses_shm(C& comm, memory_space space, std::size_t count, std::size_t shares) noexcept {
  if (comm.size() == 1 || space != memory_space::host || count > shm_rooted_max_bytes / sizeof(T)) return false;
  if constexpr (shared_memory_transport<C>) {
    const shm_segment* s = comm.shm();
    return s != nullptr && s->slot_bytes() / sizeof(T) / shares > 0;
  } else {
    return false;
  }
}

/// The frame gather and scatter share: claim the segment, open the call's
/// scope, then per chunk of at most one buffer's `shares`-th part (m
/// elements at offset off, buffer b): fill(st, off, m, b), one step,
/// drain(st, off, m, b).
template <class C, element T, class Fill, class Drain>
void rooted_shm_chunks(C& comm, const op_context& ctx, shm_segment& seg, coll_kind kind, std::size_t count,
                       std::size_t shares, int root, const collective_options& o, Fill&& fill, Drain&& drain) {
  const std::size_t cap = shm_chunk_elems<T>(seg, ctx, shares);
  shm_claim claim(seg, ctx);
  collective_scope<C> S(comm, ctx, kind, "shm", element_type_of_v<T>, count, std::nullopt, root, o);
  if (count == 0) return shm_zero_count_check(comm, seg, S, ctx);
  shm_steps<C> st(comm, seg, S, ctx);
  for (std::size_t off = 0; off < count; off += cap) {
    const std::size_t m = std::min(cap, count - off);
    const int b = st.next_buffer();
    fill(st, off, m, b);
    st.step();
    drain(st, off, m, b);
  }
}

/// Gather of `count` elements per rank through segment `seg`: rank p's block
/// to root's out_of(p), in chunks of one buffer.
template <class C, element T, class OutOf>
void gather_shm_raw(C& comm, const op_context& ctx, shm_segment& seg, const T* in, std::size_t count, int root,
                    const collective_options& o, OutOf&& out_of) {
  const bool at_root = ctx.rank == root;
  rooted_shm_chunks<C, T>(
      comm, ctx, seg, coll_kind::gather, count, 1, root, o,
      [&](shm_steps<C>& st, std::size_t off, std::size_t m, int b) {
        if (!at_root) std::memcpy(static_cast<void*>(st.mine(b)), static_cast<const void*>(in + off), m * sizeof(T));
      },
      [&](shm_steps<C>& st, std::size_t off, std::size_t m, int b) {
        if (!at_root) return;
        for (int p = 0; p < ctx.size; ++p) {
          T* dst = out_of(p) + off;
          const T* src = p == root ? in + off : reinterpret_cast<const T*>(st.of(p, b));
          if (dst != src) std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), m * sizeof(T));
        }
      });
}

/// Scatter of `count` elements per rank through segment `seg`: root's
/// in_of(p) to rank p's `out`, in chunks of one buffer's n-th part (rank p's
/// part of a chunk at p x m in root's buffer).
template <class C, element T, class InOf>
void scatter_shm_raw(C& comm, const op_context& ctx, shm_segment& seg, T* out, std::size_t count, int root,
                     const collective_options& o, InOf&& in_of) {
  const bool at_root = ctx.rank == root;
  rooted_shm_chunks<C, T>(
      comm, ctx, seg, coll_kind::scatter, count, static_cast<std::size_t>(ctx.size), root, o,
      [&](shm_steps<C>& st, std::size_t off, std::size_t m, int b) {
        if (!at_root) return;
        for (int p = 0; p < ctx.size; ++p)
          if (p != root)
            std::memcpy(static_cast<void*>(reinterpret_cast<T*>(st.mine(b)) + static_cast<std::size_t>(p) * m),
                        static_cast<const void*>(in_of(p) + off), m * sizeof(T));
      },
      [&](shm_steps<C>& st, std::size_t off, std::size_t m, int b) {
        const T* src = at_root ? in_of(root) + off
                               : reinterpret_cast<const T*>(st.of(root, b)) + static_cast<std::size_t>(ctx.rank) * m;
        if (out + off != src) std::memcpy(static_cast<void*>(out + off), static_cast<const void*>(src), m * sizeof(T));
      });
}

} // namespace dpkit::detail
