/// @file gather.hpp
/// @brief `gather(comm, in, out, root)`: every rank's block into root's
/// output, in rank order. Semantics of MPI_Gather (and of
/// torch.distributed.gather on one tensor per rank: ProcessGroupGloo's
/// gather). Linear, as Gloo's: each rank sends its block to root in one
/// message and root posts one receive per rank, so every byte crosses once,
/// straight to root (a tree would copy blocks through intermediate ranks; the
/// root's link or memory bounds the time either way). Checked like every
/// dpkit collective: numbered, its fingerprint in the tags (a peer running
/// another collective at the same sequence number is a mismatch_error naming
/// both calls), under the deadline. On checked transports root then sends
/// each rank an empty acknowledgement that the rank waits for: a rank whose
/// part only sends would otherwise return before root saw that it runs
/// another collective (its message eager-sized), and learn of it only at
/// its next call; with it every rank of a mismatched call throws in it (one
/// message latency more on the other ranks). Blocks of at most
/// shm_rooted_max_bytes in host memory on a transport with a shared segment
/// go through it instead (shm/gather_scatter.hpp: one step, no
/// acknowledgement). Root's output is one tensor (MPI_Gather's) or a list of
/// world size tensors (torch's gather_list), the same collective either way.
#pragma once

#include "detail/common.hpp"
#include "shm/gather_scatter.hpp"

#include <vector>

namespace dpkit {

namespace detail {
// The gather of both forms: every rank's `count` elements at `ip`; root
// stores rank p's block at out_of(p) (host or device memory `space`).
// Through the shared segment for small host blocks (shm/gather_scatter.hpp),
// else linear.
template <class C, element T, class OutOf>
void gather_blocks(C& comm, const op_context& ctx, memory_space space, const T* ip, std::size_t count, int root,
                   const collective_options& o, OutOf&& out_of) {
  if constexpr (shared_memory_transport<C>) {
    if (rooted_uses_shm<T>(comm, space, count, 1))
      return gather_shm_raw<C, T>(comm, ctx, shm_of(comm, ctx), ip, count, root, o, out_of);
  }
  collective_scope<C> S(comm, ctx, coll_kind::gather, "linear", element_type_of_v<T>, count, std::nullopt, root, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  const auto L = make_local<C, T>(comm, ctx, space);
  const int tag = S.tag(tag_offset::gather), ack = S.tag(tag_offset::rooted_ack);
  const bool acked = is_checked_tag(S.tag_base());
  if (ctx.rank != root) {
    L.sync();
    auto s = comm.isend(bytes_of(ip, count), root, tag);
    if (acked) {
      auto a = comm.irecv(std::span<std::byte>{}, root, ack);
      S.wait(a);
    }
    S.wait(s);
    return;
  }
  using req = request_t<C>;
  std::vector<req> rs;
  rs.reserve(static_cast<std::size_t>(ctx.size - 1));
  for (int k = 1; k < ctx.size; ++k) {
    const int p = mod(root + k, ctx.size);
    rs.push_back(comm.irecv(bytes_of(out_of(p), count), p, tag));
  }
  L.copy(out_of(root), ip, count);
  S.wait_all(rs);
  if (!acked) return;
  for (int k = 1; k < ctx.size; ++k) rs.push_back(comm.isend(std::span<const std::byte>{}, mod(root + k, ctx.size), ack));
  S.wait_all(rs);
}
} // namespace detail

/// Gathers `in` (count elements on every rank) into root's `out`: rank r's
/// block at out[r * count, (r + 1) * count).
/// @param in   count elements, the same count on every rank (the fingerprint
///             carries it: a rank with another count is a mismatch).
/// @param out  on root: world size x count elements (in may alias its block
///             `root`); elsewhere unused (may be empty).
/// @param root rank in [0, world size).
/// @throws dpkit::invalid_argument (root out of range, a non-contiguous
///         tensor, root's out of the wrong size or memory space: naming the
///         value and the rank); dpkit::timeout_error, mismatch_error,
///         peer_error, communicator_error as every collective.
template <transport C, tensor In, tensor Out>
void gather(C& comm, const In& in, Out&& out, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  static_assert(std::is_same_v<T, tensor_value_t<Out>>, "dpkit: input and output tensors must have the same element type");
  const auto ctx = detail::make_context(comm, "gather");
  detail::check_root(ctx, root, comm);
  const std::size_t count = size_of(in);
  const T* ip = nullptr;
  T* op = nullptr;
  if (ctx.rank == root) {
    const auto p = detail::resolve_inout(comm, ctx, in, out, count * static_cast<std::size_t>(ctx.size));
    ip = p.first;
    op = p.second;
  } else {
    detail::static_check_space<C, In>();
    detail::check_tensor(ctx, in, "input");
    detail::check_space(comm, ctx, space_of(in), "input");
    ip = as_span(in).data();
  }
  detail::gather_blocks(comm, ctx, space_of(in), ip, count, root, o,
                        [op, count](int p) { return op + static_cast<std::size_t>(p) * count; });
}

/// Gathers `in` (count elements on every rank) into root's list `outs`:
/// rank r's block into outs[r], each its own tensor (torch.distributed.gather's
/// gather_list; ProcessGroupGloo's gather). The same collective as the
/// contiguous form (same fingerprint: a rank may call either), without a
/// staging buffer on root.
/// @param in   count elements, the same count on every rank.
/// @param outs on root: world size tensors of count elements each, of in's
///             element type and memory space (outs[root] may alias in);
///             elsewhere unused (may be empty).
/// @param root rank in [0, world size).
/// @throws dpkit::invalid_argument (root out of range, a list of the wrong
///         length, a block of the wrong size, space or layout: naming the
///         block, the value and the rank); the errors of every collective.
template <transport C, tensor In, tensor_list Outs>
void gather(C& comm, const In& in, Outs&& outs, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  static_assert(std::is_same_v<T, tensor_value_t<std::ranges::range_reference_t<Outs>>>,
                "dpkit: input and output tensors must have the same element type");
  const auto ctx = detail::make_context(comm, "gather");
  detail::check_root(ctx, root, comm);
  const std::size_t count = size_of(in);
  detail::static_check_space<C, In>();
  detail::check_tensor(ctx, in, "input");
  detail::check_space(comm, ctx, space_of(in), "input");
  std::vector<T*> blocks;
  if (ctx.rank == root) blocks = detail::list_blocks<T*>(comm, ctx, outs, count, space_of(in), "output");
  detail::gather_blocks(comm, ctx, space_of(in), as_span(in).data(), count, root, o,
                        [&blocks](int p) { return blocks[static_cast<std::size_t>(p)]; });
}

} // namespace dpkit
