/// @file scatter.hpp
/// @brief `scatter(comm, in, out, root)`: block r of root's input to rank r.
/// Semantics of MPI_Scatter (and of torch.distributed.scatter:
/// ProcessGroupGloo's scatter). Linear, as Gloo's: root sends each rank its
/// block in one message (each block crosses once, straight from root).
/// Checked like every dpkit collective: numbered, its fingerprint in the
/// tags, under the deadline. On checked transports every rank then sends
/// root an empty acknowledgement that root waits for, so a root whose sends
/// are eager-sized does not return before a peer running another collective
/// is found (gather.hpp says why). Small host blocks on a transport with a
/// shared segment go through it instead (shm/gather_scatter.hpp). Root's
/// input is one tensor (MPI_Scatter's) or a list of world size tensors
/// (torch's scatter_list), the same collective either way.
#pragma once

#include "detail/common.hpp"
#include "shm/gather_scatter.hpp"

#include <vector>

namespace dpkit {

namespace detail {
// The scatter of both forms: root's block in_of(p) (`count` elements) to
// rank p's `op`. Through the shared segment for small host blocks
// (shm/gather_scatter.hpp), else linear: root sends each block.
template <class C, element T, class InOf>
void scatter_blocks(C& comm, const op_context& ctx, memory_space space, T* op, std::size_t count, int root,
                    const collective_options& o, InOf&& in_of) {
  if constexpr (shared_memory_transport<C>) {
    if (rooted_uses_shm<T>(comm, space, count, static_cast<std::size_t>(ctx.size)))
      return scatter_shm_raw<C, T>(comm, ctx, shm_of(comm, ctx), op, count, root, o, in_of);
  }
  collective_scope<C> S(comm, ctx, coll_kind::scatter, "linear", element_type_of_v<T>, count, std::nullopt, root, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  const auto L = make_local<C, T>(comm, ctx, space);
  const int tag = S.tag(tag_offset::scatter), ack = S.tag(tag_offset::rooted_ack);
  const bool acked = is_checked_tag(S.tag_base());
  if (ctx.rank != root) {
    auto r = comm.irecv(bytes_of(op, count), root, tag);
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
    const int p = mod(root + k, ctx.size);
    ss.push_back(comm.isend(bytes_of(in_of(p), count), p, tag));
  }
  if (acked)
    for (int k = 1; k < ctx.size; ++k) ss.push_back(comm.irecv(std::span<std::byte>{}, mod(root + k, ctx.size), ack));
  L.copy(op, in_of(root), count);
  S.wait_all(ss);
}
} // namespace detail

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
  detail::static_check_space<C, Out>();
  detail::check_tensor(ctx, out, "output");
  detail::check_space(comm, ctx, space_of(out), "output");
  T* op = as_span(out).data();
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
  detail::scatter_blocks(comm, ctx, space_of(out), op, count, root, o,
                         [ip, count](int p) { return ip + static_cast<std::size_t>(p) * count; });
}

/// Scatters root's list `ins` (world size tensors of count elements each)
/// into every rank's `out`: ins[r] to rank r (torch.distributed.scatter's
/// scatter_list; ProcessGroupGloo's scatter). The same collective as the
/// contiguous form (same fingerprint), without a staging copy on root:
/// each block is sent from where it lies.
/// @param ins  on root: world size tensors of out's element type, count
///             elements each, in out's memory space (out may alias
///             ins[root]); elsewhere unused (may be empty).
/// @param out  count elements, the same count on every rank.
/// @param root rank in [0, world size).
/// @throws dpkit::invalid_argument (root out of range, a list of the wrong
///         length, a block of the wrong size, space or layout: naming the
///         block, the value and the rank); the errors of every collective.
template <transport C, tensor_list Ins, tensor Out>
void scatter(C& comm, const Ins& ins, Out&& out, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<Out>;
  static_assert(std::is_same_v<T, tensor_value_t<std::ranges::range_reference_t<const Ins&>>>,
                "dpkit: input and output tensors must have the same element type");
  const auto ctx = detail::make_context(comm, "scatter");
  detail::check_root(ctx, root, comm);
  const std::size_t count = size_of(out);
  detail::static_check_space<C, Out>();
  detail::check_tensor(ctx, out, "output");
  detail::check_space(comm, ctx, space_of(out), "output");
  std::vector<const T*> blocks;
  if (ctx.rank == root) blocks = detail::list_blocks<const T*>(comm, ctx, ins, count, space_of(out), "input");
  detail::scatter_blocks(comm, ctx, space_of(out), as_span(out).data(), count, root, o,
                         [&blocks](int p) { return blocks[static_cast<std::size_t>(p)]; });
}

} // namespace dpkit
