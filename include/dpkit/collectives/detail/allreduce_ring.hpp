// dpkit internals: the body of the ring all-reduce (allreduce_ring_raw), apart from its
// documented entry point in collectives/allreduce_ring.hpp. Not for users.
#pragma once

#include "common.hpp"

#include <vector>

namespace dpkit::detail {
/// Ring all-reduce of `count` elements from `in` to `out` (in == out: in place).
template <transport C, element T>
void allreduce_ring_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count, reduce_op op,
                        const collective_options& o, const local_ops<T>& L) {
  const int n = ctx.size, r = ctx.rank;
  collective_scope<C> S(comm, ctx, coll_kind::allreduce, "ring", element_type_of_v<T>, count, op, -1, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  if (n == 1) {
    L.copy(out, in, count);
    return;
  }
  const std::size_t seg = segment_elems<T>(o);
  const std::size_t depth = static_cast<std::size_t>(std::max(1, o.pipeline_depth));
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  const int steps = 2 * (n - 1); // 0..n-2 reduce-scatter, n-1..2n-3 all-gather
  const int tag = S.tag(tag_offset::allreduce_ring);

  auto recv_chunk = [&](int t) { return t < n - 1 ? mod(r - t - 1, n) : mod(r - (t - (n - 1)), n); };
  auto send_chunk = [&](int t) { return t < n - 1 ? mod(r - t, n) : mod(r + 1 - (t - (n - 1)), n); };

  // Receive items in processing order (step-major, then segment); item i of
  // step t is forwarded as a send of step t + 1 right after it is processed.
  struct item { int step; std::size_t begin, len; };
  std::vector<item> items;
  std::vector<std::size_t> step_end(static_cast<std::size_t>(steps)); // items of steps <= t end here
  {
    const auto [b0, e0] = chunk_range(count, n, 0);
    items.reserve(static_cast<std::size_t>(steps) * (ceil_div(e0 - b0, seg) + 1));
  }
  for (int t = 0; t < steps; ++t) {
    const auto [b, e] = chunk_range(count, n, recv_chunk(t));
    for (std::size_t p = b; p < e; p += seg) items.push_back({t, p, std::min(seg, e - p)});
    step_end[static_cast<std::size_t>(t)] = items.size();
  }
  const std::size_t max_chunk = chunk_range(count, n, 0).second;
  const std::size_t slot_elems = std::min(seg, max_chunk);
  scratch_arena::lease lease(arena_of(comm));
  scratch<T> slots(depth * slot_elems, L, &lease, 0);

  // Sends are appended in step order (step 0 up front, step t + 1 while
  // processing step t), so the sends of step t are sends[send_end[t-1], send_end[t]).
  using req = request_t<C>;
  const auto [s0b, s0e] = chunk_range(count, n, send_chunk(0));
  std::vector<req> sends;
  sends.reserve(ceil_div(s0e - s0b, seg) + items.size());
  std::vector<std::size_t> send_end(static_cast<std::size_t>(steps), 0);
  std::vector<req> recvs(items.size());
  std::size_t sends_done = 0; // sends[0, sends_done) are known complete

  for (std::size_t p = s0b; p < s0e; p += seg)
    sends.push_back(comm.isend(bytes_of(in + p, std::min(seg, s0e - p)), right, tag));
  send_end[0] = sends.size();

  std::size_t posted = 0, processed = 0;
  // Reduce-scatter receives land in the scratch ring. An all-gather receive
  // overwrites out's chunk r-k, which reduce-scatter step k sent: post it only
  // once every send of step k was posted (all of step k-1 processed) and
  // completed.
  auto try_post = [&]() -> bool {
    if (posted >= items.size() || posted >= processed + depth) return false;
    const item& it = items[posted];
    if (it.step < n - 1) {
      T* slot = slots.data() + (posted % depth) * slot_elems;
      recvs[posted] = comm.irecv(bytes_of(slot, it.len), left, tag);
    } else {
      const std::size_t k = static_cast<std::size_t>(it.step - (n - 1));
      if (k > 0 && processed < step_end[k - 1]) return false;
      for (; sends_done < send_end[k]; ++sends_done) S.wait(sends[sends_done]);
      recvs[posted] = comm.irecv(bytes_of(out + it.begin, it.len), left, tag);
    }
    ++posted;
    return true;
  };
  while (try_post()) {}

  for (std::size_t i = 0; i < items.size(); ++i) {
    const item& it = items[i];
    S.wait(recvs[i]);
    if (it.step < n - 1) {
      const T* slot = slots.data() + (i % depth) * slot_elems;
      L.reduce(out + it.begin, in + it.begin, slot, it.len, op);
      if (it.step == n - 2 && op == reduce_op::avg) L.divide(out + it.begin, it.len, static_cast<std::size_t>(n));
      L.sync();
    }
    processed = i + 1;
    // The slot is consumed: post further receives before forwarding, so the
    // left neighbour never waits on us.
    while (try_post()) {}
    if (it.step + 1 < steps) {
      sends.push_back(comm.isend(bytes_of(out + it.begin, it.len), right, tag));
      send_end[static_cast<std::size_t>(it.step + 1)] = sends.size();
    }
  }
  for (; sends_done < sends.size(); ++sends_done) S.wait(sends[sends_done]);
}

} // namespace dpkit::detail
