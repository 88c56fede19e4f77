/// @file reduce_scatter_ring.hpp
/// @brief Ring reduce-scatter (semantics of ncclReduceScatter /
/// MPI_Reduce_scatter_block): rank r receives chunk r of the element-wise
/// reduction of every rank's input.
///
/// n-1 steps; in step t rank r sends its partial sum of chunk (r-t-1) to the
/// right and reduces chunk (r-t-2) from the left, so it ends holding chunk r.
/// Pipelined in segments; scratch is 2 x pipeline_depth segments.
#pragma once

#include "../detail/collective.hpp"

#include <vector>

namespace dpkit {

namespace detail {

template <transport C, element T>
void reduce_scatter_ring_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count, reduce_op op,
                             const collective_options& o, const local_ops<T>& L) {
  const int n = ctx.size, r = ctx.rank;
  if (count == 0) return;
  if (n == 1) {
    L.copy(out, in, count);
    return;
  }
  const deadline dl = deadline_after(o.timeout);
  const std::size_t seg = segment_elems<T>(o), slot = std::min(seg, count);
  const std::size_t depth = static_cast<std::size_t>(std::max(1, o.pipeline_depth));
  const std::size_t nseg = ceil_div(count, seg);
  const int right = mod(r + 1, n), left = mod(r - 1, n), tag = o.tag + 4;
  const std::size_t items = static_cast<std::size_t>(n - 1) * nseg;
  auto len = [&](std::size_t j) { return std::min(seg, count - j * seg); };
  auto chunk = [&](int c) { return static_cast<std::size_t>(c) * count; };

  scratch_arena::lease lease(arena_of(comm));
  scratch<T> recv_slots(depth * slot, L, &lease, 0), stage(depth * slot, L, &lease, 1);
  using req = request_t<C>;
  std::vector<req> recvs(items), stage_send(items), first_sends;
  // Items are processed segment-major, i = j * (n-1) + t for segment j and
  // step t: a staged send is then consumed by the right neighbour within
  // `depth` items. (Step-major order deadlocks once a chunk has more than
  // about 2 x depth segments: every rank waits for its right neighbour to
  // consume a whole step before reusing a stage slot.)
  const std::size_t steps = static_cast<std::size_t>(n - 1);
  std::size_t posted = 0, staged = 0;
  auto post_one = [&](std::size_t i) {
    recvs[i] = comm.irecv(bytes_of(recv_slots.data() + (i % depth) * slot, len(i / steps)), left, tag);
  };
  for (; posted < items && posted < depth; ++posted) post_one(posted);
  for (std::size_t i = 0; i < items; ++i) {
    const int t = static_cast<int>(i % steps);
    const std::size_t j = i / steps;
    const int c = mod(r - t - 2, n);
    // Step 0 sends chunk r-1 straight from the input, just before this
    // segment's later steps, so sends leave in the receiver's item order.
    if (t == 0) first_sends.push_back(comm.isend(bytes_of(in + chunk(mod(r - 1, n)) + j * seg, len(j)), right, tag));
    wait_ctx(recvs[i], dl, ctx);
    const T* mine = in + chunk(c) + j * seg;
    const T* got = recv_slots.data() + (i % depth) * slot;
    if (t == n - 2) {
      L.reduce(out + j * seg, mine, got, len(j), op);
      if (op == reduce_op::avg) L.divide(out + j * seg, len(j), static_cast<std::size_t>(n));
      L.sync();
      if (posted < items) post_one(posted++);
    } else {
      // The k-th staged item uses stage slot k % depth (final-step items
      // skip the stage, so k counts staged items, not i).
      if (staged >= depth) wait_ctx(stage_send[staged - depth], dl, ctx);
      T* st = stage.data() + (staged % depth) * slot;
      L.reduce(st, mine, got, len(j), op);
      L.sync();
      if (posted < items) post_one(posted++);
      stage_send[staged++] = comm.isend(bytes_of(static_cast<const T*>(st), len(j)), right, tag);
    }
  }
  wait_all_ctx(first_sends, dl, ctx);
  wait_all_ctx(stage_send, dl, ctx);
}

} // namespace detail

/// Out-of-place ring reduce-scatter.
/// @param in  count x n elements (n = world size) on every rank.
/// @param out count elements: chunk `rank` of the reduction, i.e. out[i] = op
///            over ranks of in[rank * count + i].
/// @param op  sum, prod, min, max or avg.
/// @throws dpkit::invalid_argument if in.size() != out.size() x n, spaces
///         differ or the transport cannot move them; dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void reduce_scatter_ring(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                         const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "reduce_scatter_ring");
  const std::size_t total = size_of(in), n = static_cast<std::size_t>(ctx.size);
  if (total % n != 0)
    ctx.invalid("input has " + std::to_string(total) + " elements, not a multiple of the world size " +
                std::to_string(n));
  const auto [ip, outp] = detail::resolve_inout(comm, ctx, in, out, total / n);
  detail::reduce_scatter_ring_raw<C, T>(comm, ctx, ip, outp, total / n, op, o,
                                        detail::make_local<C, T>(comm, ctx, space_of(in)));
}

/// In-place ring reduce-scatter (NCCL's in-place convention): t holds count x
/// n elements; the result lands in t[rank * count, (rank + 1) * count); the
/// rest of t is left unchanged.
/// @throws dpkit::invalid_argument if t.size() is not a multiple of n.
template <transport C, tensor Tn>
void reduce_scatter_ring(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  const auto ctx = detail::make_context(comm, "reduce_scatter_ring");
  const auto [p, count] = detail::resolve_chunked_inplace(comm, ctx, t);
  detail::reduce_scatter_ring_raw<C, T>(comm, ctx, p, p + static_cast<std::size_t>(ctx.rank) * count, count, op, o,
                                        detail::make_local<C, T>(comm, ctx, space_of(t)));
}

} // namespace dpkit
