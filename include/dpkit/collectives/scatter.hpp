/// @file scatter.hpp
/// @brief `scatter(comm, in, out, root)`: block r of root's input to rank r.
/// Semantics of MPI_Scatter (and of torch.distributed.scatter:
/// ProcessGroupGloo's scatter). Linear, as Gloo's: root sends each rank its
/// block in one message (each block crosses once, straight from root).
/// Checked like every dpkit collective: numbered, its fingerprint in the
/// tags, under the deadline. On checked transports every rank then sends
/// root an empty acknowledgement that root waits for, so a root whose sends
/// are eager-sized does not return before a peer running another collective
/// is found (gather.hpp says why).
#pragma once

#include "detail/common.hpp"

#include <vector>

namespace dpkit {

/// Scatters root's `in` (world size x count elements, rank r's block at
/// in[r * count, (r + 1) * count)) into every rank's `out` (count elements).
/// @param in   on root: world size x count elements (out may alias its block
///             `root`); elsewhere unused (may be empty).
/// @param out  count elements, the same count on every rank.
/// @param root rank in [0, world size).
/// @throws dpkit::invalid_argument (root out of range, a non-contiguous
///         tensor, root's in of the wrong size or memory space: naming the
///         value and the rank); dpkit::timeout_error, mismatch_error,
///         peer_error, communicator_error as every collective.
template <transport C, tensor In, tensor Out>
void scatter(C& comm, const In& in, Out&& out, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<Out>;
  static_assert(std::is_same_v<T, tensor_value_t<In>>, "dpkit: input and output tensors must have the same element type");
  const auto ctx = detail::make_context(comm, "scatter");
  detail::check_root(ctx, root, comm);
  const std::size_t count = size_of(out);
  const T* ip = nullptr;
  T* op = nullptr;
  detail::static_check_space<C, Out>();
  detail::check_tensor(ctx, out, "output");
  detail::check_space(comm, ctx, space_of(out), "output");
  op = as_span(out).data();
  if (ctx.rank == root) {
    // root's input holds world size blocks of its output's size
    detail::static_check_space<C, In>();
    detail::check_tensor(ctx, in, "input");
    detail::check_space(comm, ctx, space_of(in), "input");
    if (size_of(in) != count * static_cast<std::size_t>(ctx.size))
      ctx.invalid("input has " + std::to_string(size_of(in)) + " elements, expected world size x output = " +
                  std::to_string(count * static_cast<std::size_t>(ctx.size)));
    if (space_of(in) != space_of(out))
      ctx.invalid("input is in " + std::string(memory_space_name(space_of(in))) + " memory but output is in " +
                  std::string(memory_space_name(space_of(out))) + " memory");
    ip = as_span(in).data();
  }
  detail::collective_scope<C> S(comm, ctx, detail::coll_kind::scatter, "linear", element_type_of_v<T>, count,
                                std::nullopt, root, o);
  if (count == 0) return detail::zero_count_check(comm, S, ctx);
  const auto L = detail::make_local<C, T>(comm, ctx, space_of(out));
  const int tag = S.tag(detail::tag_offset::scatter), ack = S.tag(detail::tag_offset::rooted_ack);
  const bool acked = detail::is_checked_tag(S.tag_base());
  if (ctx.rank != root) {
    auto r = comm.irecv(detail::bytes_of(op, count), root, tag);
    S.wait(r);
    if (acked) {
      auto a = comm.isend(std::span<const std::byte>{}, root, ack);
      S.wait(a);
    }
    return;
  }
  L.sync();
  using req = request_t<C>;
  std::vector<req> ss;
  ss.reserve(static_cast<std::size_t>(ctx.size - 1));
  for (int k = 1; k < ctx.size; ++k) {
    const int p = detail::mod(root + k, ctx.size);
    ss.push_back(comm.isend(detail::bytes_of(ip + static_cast<std::size_t>(p) * count, count), p, tag));
  }
  if (acked)
    for (int k = 1; k < ctx.size; ++k)
      ss.push_back(comm.irecv(std::span<std::byte>{}, detail::mod(root + k, ctx.size), ack));
  L.copy(op, ip + static_cast<std::size_t>(root) * count, count);
  S.wait_all(ss);
}

} // namespace dpkit
