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
/// message latency more on the other ranks).
#pragma once

#include "detail/common.hpp"

#include <vector>

namespace dpkit {

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
  detail::collective_scope<C> S(comm, ctx, detail::coll_kind::gather, "linear", element_type_of_v<T>, count, std::nullopt,
                                root, o);
  if (count == 0) return detail::zero_count_check(comm, S, ctx);
  const auto L = detail::make_local<C, T>(comm, ctx, space_of(in));
  const int tag = S.tag(detail::tag_offset::gather), ack = S.tag(detail::tag_offset::rooted_ack);
  const bool acked = detail::is_checked_tag(S.tag_base());
  if (ctx.rank != root) {
    L.sync();
    auto s = comm.isend(detail::bytes_of(ip, count), root, tag);
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
    const int p = detail::mod(root + k, ctx.size);
    rs.push_back(comm.irecv(detail::bytes_of(op + static_cast<std::size_t>(p) * count, count), p, tag));
  }
  L.copy(op + static_cast<std::size_t>(root) * count, ip, count);
  S.wait_all(rs);
  if (!acked) return;
  for (int k = 1; k < ctx.size; ++k) rs.push_back(comm.isend(std::span<const std::byte>{}, detail::mod(root + k, ctx.size), ack));
  S.wait_all(rs);
}

} // namespace dpkit
