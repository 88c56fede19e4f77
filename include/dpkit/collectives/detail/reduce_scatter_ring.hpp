// dpkit internals: the body of the ring reduce-scatter (reduce_scatter_ring_raw), apart from its
// documented entry point in collectives/reduce_scatter_ring.hpp. Not for users.
#pragma once

#include "common.hpp"

#include <vector>

namespace dpkit::detail {
template <transport C, element T>
void reduce_scatter_ring_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count, reduce_op op,
                             const collective_options& o, const local_ops<T>& L) {
  const int n = ctx.size, r = ctx.rank;
  collective_scope<C> S(comm, ctx, coll_kind::reduce_scatter, "ring", element_type_of_v<T>, count, op, -1, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  if (n == 1) {
    L.copy(out, in, count);
    return;
  }
  const std::size_t seg = segment_elems<T>(o), slot = std::min(seg, count);
  const std::size_t depth = static_cast<std::size_t>(std::max(1, o.pipeline_depth));
  const std::size_t nseg = ceil_div(count, seg);
  const int right = mod(r + 1, n), left = mod(r - 1, n), tag = S.tag(tag_offset::reduce_scatter_ring);
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
    S.wait(recvs[i]);
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
      if (staged >= depth) S.wait(stage_send[staged - depth]);
      T* st = stage.data() + (staged % depth) * slot;
      L.reduce(st, mine, got, len(j), op);
      L.sync();
      if (posted < items) post_one(posted++);
      stage_send[staged++] = comm.isend(bytes_of(static_cast<const T*>(st), len(j)), right, tag);
    }
  }
  S.wait_all(first_sends);
  S.wait_all(stage_send);
}

} // namespace dpkit::detail
