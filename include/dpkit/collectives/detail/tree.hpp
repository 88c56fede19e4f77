// dpkit internals: the pipelined binary-tree engine behind allreduce_tree
// (reduce up + broadcast down), reduce_tree (up only) and broadcast_tree (down
// only). Not for users.
//
// Tree: ranks relabelled v = (rank - root) mod n; parent (v-1)/2, children
// 2v+1 and 2v+2 (a binary heap rooted at `root`). The buffer is cut into
// segments; a rank reduces segment j as soon as both children delivered it and
// sends it up at once, and forwards segment j down as soon as it arrives, so
// up- and down-traffic of different segments overlap. The loop never spins:
// when nothing is ready it blocks on a request that is guaranteed to complete
// (a child's next segment while reducing, else the parent's next segment).
#pragma once

#include "common.hpp"

#include <array>
#include <vector>

namespace dpkit::detail {

enum class tree_mode { allreduce, reduce, broadcast };

template <transport C, element T>
void tree_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count, reduce_op op, int root,
              tree_mode mode, const collective_options& o, const local_ops<T>& L) {
  const int n = ctx.size, r = ctx.rank;
  const coll_kind kind = mode == tree_mode::allreduce ? coll_kind::allreduce
                         : mode == tree_mode::reduce  ? coll_kind::reduce
                                                      : coll_kind::broadcast;
  collective_scope<C> S(comm, ctx, kind, "tree", element_type_of_v<T>, count,
                        mode == tree_mode::broadcast ? std::nullopt : std::optional<reduce_op>(op),
                        mode == tree_mode::allreduce ? -1 : root, o);
  if (mode != tree_mode::allreduce) S.agree_if(o.check); // send-only ranks cannot see a mismatch otherwise
  if (count == 0) return zero_count_check(comm, S, ctx);
  const bool is_root = r == root;
  if (n == 1) {
    L.copy(out, in, count);
    return;
  }
  const int v = mod(r - root, n);
  auto real = [&](int x) { return mod(x + root, n); };
  const int parent = v == 0 ? -1 : real((v - 1) / 2);
  std::array<int, 2> child{};
  int nchild = 0;
  for (int c : {2 * v + 1, 2 * v + 2})
    if (c < n) child[static_cast<std::size_t>(nchild++)] = real(c);

  const std::size_t seg = segment_elems<T>(o);
  const std::size_t depth = static_cast<std::size_t>(std::max(1, o.pipeline_depth));
  const std::size_t nseg = ceil_div(count, seg);
  const std::size_t slot = std::min(seg, count);
  const int tag_up = S.tag(tag_offset::tree_up), tag_down = S.tag(tag_offset::tree_down);
  const bool do_up = mode != tree_mode::broadcast, do_down = mode != tree_mode::reduce;
  auto len = [&](std::size_t j) { return std::min(seg, count - j * seg); };

  using req = request_t<C>;
  // All requests of the call live in one pool (one allocation per call):
  // [up_recv: 2 per segment][up_send][down_recv][down_send: 2 per segment].
  std::vector<req> pool(6 * nseg);
  auto up_recv = [&](std::size_t j, int c) -> req& { return pool[2 * j + static_cast<std::size_t>(c)]; };
  auto up_send = [&](std::size_t j) -> req& { return pool[2 * nseg + j]; };
  auto down_recv = [&](std::size_t j) -> req& { return pool[3 * nseg + j]; };
  auto down_send = [&](std::size_t j, int c) -> req& { return pool[4 * nseg + 2 * j + static_cast<std::size_t>(c)]; };
  // Up phase state.
  scratch_arena::lease lease(arena_of(comm));
  scratch<T> child_slots(do_up ? static_cast<std::size_t>(nchild) * depth * slot : 0, L, &lease, 0);
  const bool staging = mode == tree_mode::reduce && !is_root && nchild > 0;
  scratch<T> stage(staging ? depth * slot : 0, L, &lease, 1);
  std::size_t up_done = do_up ? 0 : nseg, up_posted = 0;
  auto child_slot = [&](int c, std::size_t j) {
    return child_slots.data() + (static_cast<std::size_t>(c) * depth + j % depth) * slot;
  };
  auto post_up = [&] {
    while (do_up && up_posted < nseg && up_posted < up_done + depth) {
      for (int c = 0; c < nchild; ++c)
        up_recv(up_posted, c) =
            comm.irecv(bytes_of(child_slot(c, up_posted), len(up_posted)), child[static_cast<std::size_t>(c)], tag_up);
      ++up_posted;
    }
  };
  // Down phase state.
  std::size_t down_done = do_down ? 0 : nseg, down_posted = 0;
  auto can_post_down = [&](std::size_t j) {
    if (mode == tree_mode::broadcast) return true;
    if (j >= up_done) return false;
    return up_send(j).test(); // out segment j must have left before it is overwritten
  };
  auto post_down = [&] {
    while (do_down && !is_root && down_posted < nseg && down_posted < down_done + depth && can_post_down(down_posted)) {
      down_recv(down_posted) = comm.irecv(bytes_of(out + down_posted * seg, len(down_posted)), parent, tag_down);
      ++down_posted;
    }
  };

  if (mode == tree_mode::broadcast && is_root) L.copy(out, in, count);
  post_up();
  post_down();

  while (up_done < nseg || down_done < nseg) {
    bool progressed = false;
    if (up_done < nseg) {
      const std::size_t j = up_done;
      bool ready = true;
      for (int c = 0; c < nchild && ready; ++c) ready = up_recv(j, c).test();
      if (ready) {
        for (int c = 0; c < nchild; ++c) S.wait(up_recv(j, c));
        const T* src = in + j * seg;
        const T* acc = src;
        if (nchild > 0) {
          T* dst;
          if (staging) {
            if (j >= depth) S.wait(up_send(j - depth));
            dst = stage.data() + (j % depth) * slot;
          } else {
            dst = out + j * seg;
          }
          L.reduce(dst, src, child_slot(0, j), len(j), op);
          if (nchild > 1) L.reduce(dst, dst, child_slot(1, j), len(j), op);
          acc = dst;
        } else if (is_root) {
          L.copy(out + j * seg, src, len(j));
          acc = out + j * seg;
        }
        if (is_root && op == reduce_op::avg) L.divide(out + j * seg, len(j), static_cast<std::size_t>(n));
        L.sync();
        if (!is_root) up_send(j) = comm.isend(bytes_of(acc, len(j)), parent, tag_up);
        ++up_done;
        post_up();
        progressed = true;
      }
    }
    if (down_done < nseg) {
      const std::size_t j = down_done;
      if (is_root) {
        if (j < up_done) {
          const T* src = (mode == tree_mode::broadcast ? in : out) + j * seg;
          for (int c = 0; c < nchild; ++c)
            down_send(j, c) = comm.isend(bytes_of(src, len(j)), child[static_cast<std::size_t>(c)], tag_down);
          ++down_done;
          progressed = true;
        }
      } else {
        post_down();
        if (j < down_posted && down_recv(j).test()) {
          S.wait(down_recv(j));
          for (int c = 0; c < nchild; ++c)
            down_send(j, c) = comm.isend(bytes_of(out + j * seg, len(j)), child[static_cast<std::size_t>(c)], tag_down);
          ++down_done;
          post_down();
          progressed = true;
        }
      }
    }
    if (!progressed) {
      // Block on something that must complete: children always finish their
      // up-phase independently of us, the parent its down-phase.
      if (up_done < nseg) {
        for (int c = 0; c < nchild; ++c) S.wait(up_recv(up_done, c));
      } else if (down_done < nseg && !is_root) {
        const std::size_t j = down_done;
        if (j < down_posted) S.wait(down_recv(j));
        else S.wait(up_send(j));
      }
    }
  }
  for (auto& q : pool) S.wait(q); // sends still in flight (completed ones return at once)
}

} // namespace dpkit::detail
