// dpkit internals: the bodies of the hierarchical (node-aware) all-reduce and
// broadcast (collectives/allreduce_hierarchical.hpp and
// broadcast_hierarchical.hpp are their documented entry points). They run on
// a hierarchical_transport's sub-transports: node_transport() inside a node
// (its shared segment when it has one) and cross_transport() between nodes.
// Not for users.
#pragma once

#include "../allgather_ring.hpp"
#include "../allreduce_ring.hpp"
#include "../reduce_scatter_ring.hpp"
#include "../allreduce_tree.hpp"
#include "../../core/async.hpp"
#include "../broadcast_tree.hpp"
#include "../policy.hpp"
#include "../reduce_tree.hpp"
#include "common.hpp"
#include "../shm/allgather.hpp"
#include "../shm/allreduce.hpp"
#include "../shm/broadcast.hpp"
#include "../shm/reduce_scatter.hpp"
#include "../shm/reduce.hpp"
#include "../shm/steps.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace dpkit::detail {

/// Options for a stage of a hierarchical collective: the same stream and
/// check level, and what is left of the whole collective's deadline (at
/// least 1 ms, so a stage that starts late still names itself on timeout).
inline collective_options stage_options(const collective_options& o, deadline due) {
  collective_options s = o;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - clock::now());
  s.timeout = std::max(left, std::chrono::milliseconds(1));
  return s;
}

/// Recursive-doubling all-reduce in place of `count` host elements on a
/// transport of a power-of-two size n: log2(n) steps, in step k each rank
/// swaps its whole buffer with rank ^ 2^k and combines the two, the value of
/// the lower rank's half first, so every rank computes the same operations
/// in the same order (bitwise identical results). log2(n) latencies against
/// the tree's 2 log2(n) and the ring's 2(n-1), for log2(n) x count bytes
/// sent: the algorithm of small messages (MPICH's and Open MPI coll/tuned's
/// choice below a few KiB). The stage between nodes uses it where the tuning
/// table picks the tree.
template <class X, element T>
void allreduce_recursive_doubling(X& comm, T* data, std::size_t count, reduce_op op, const collective_options& o) {
  const auto ctx = make_context(comm, "allreduce (recursive doubling between nodes)");
  const local_ops<T> L = make_local<X, T>(comm, ctx, memory_space::host);
  collective_scope<X> S(comm, ctx, coll_kind::allreduce, "rd", element_type_of_v<T>, count, op, -1, o);
  if (count == 0 || ctx.size == 1) return;
  scratch_arena::lease lease(arena_of(comm)); // the transport's buffer, as ring and tree: no allocation per call
  scratch<T> got(count, L, &lease, 0);
  const int tag = S.tag(tag_offset::recursive_doubling);
  for (int mask = 1; mask < ctx.size; mask <<= 1) {
    const int peer = ctx.rank ^ mask; // one peer per step: the tag needs no step number
    auto rq = comm.irecv(bytes_of(got.data(), count), peer, tag);
    auto sq = comm.isend(bytes_of(static_cast<const T*>(data), count), peer, tag);
    S.wait(rq);
    S.wait(sq);
    if (ctx.rank < peer) {
      L.reduce(data, data, got.data(), count, op); // mine is the lower half's
    } else {
      L.reduce(got.data(), got.data(), data, count, op); // the peer's is
      L.copy(data, got.data(), count);
    }
  }
}

/// The all-reduce between nodes of one stage (on the cross-node transport of
/// N ranks, one per node): tree or ring, as the tuning table decides for N
/// nodes of one rank (no shared segment spans nodes); where it picks the
/// tree, N is a power of two and the data is in host memory, recursive
/// doubling (half the tree's latencies, the same results on every rank).
template <class X, element T>
void cross_allreduce(X& cross, T* data, std::size_t count, memory_space space, reduce_op op,
                     const collective_options& o, const allreduce_policy& flat) {
  tensor_view<T> v{data, count, space};
  const int n = cross.size();
  const std::size_t bytes = count * sizeof(T);
  const bool host = space == memory_space::host;
  // Two nodes: the ring's two steps of S/2 send what one swap of S sends, at
  // twice the latencies; up to 1 MiB (the ring's segments pipeline the
  // reduction with the transfer beyond) one swap does.
  if (host && n == 2 && bytes <= (std::size_t{1} << 20)) {
    allreduce_recursive_doubling(cross, data, count, op, o);
  } else if (flat.choose(bytes, tuning_key{n, n, 1}, tuning_availability{}) == algorithm::tree) {
    if (host && (n & (n - 1)) == 0) allreduce_recursive_doubling(cross, data, count, op, o);
    else allreduce_tree(cross, v, v, op, o);
  } else {
    allreduce_ring(cross, v, v, op, o);
  }
}

/// Reduce to local rank 0 of the node (shm when the node transport has a
/// segment and the buffers are host memory, else tree).
template <class N, element T>
void node_reduce(N& node, const T* in, T* out, std::size_t count, memory_space space, reduce_op op,
                 const collective_options& o) {
  if (space == memory_space::host && shm_available(node)) {
    const auto ctx = make_context(node, "reduce_shm");
    reduce_shm_raw<N, T>(node, ctx, shm_of(node, ctx), in, out, count, op, 0, o);
  } else {
    tensor_view<const T> vi{in, count, space};
    tensor_view<T> vo{out, node.rank() == 0 ? count : 0, space};
    if (node.rank() == 0) reduce_tree(node, vi, vo, op, 0, o);
    else reduce_tree(node, vi, tensor_view<T>{nullptr, 0, space}, op, 0, o);
  }
}

/// Broadcast from local rank `root` of the node (shm or tree, as node_reduce).
template <class N, element T>
void node_broadcast(N& node, T* data, std::size_t count, memory_space space, int root, const collective_options& o) {
  if (space == memory_space::host && shm_available(node)) {
    const auto ctx = make_context(node, "broadcast_shm");
    broadcast_shm_raw<N, T>(node, ctx, shm_of(node, ctx), data, data, count, root, o);
  } else {
    tensor_view<T> v{data, count, space};
    broadcast_tree(node, v, v, root, o);
  }
}

/// True when the cross-node transport can run a collective on its
/// communication thread while this thread runs the node's stages
/// (async_transport, and for MPI a library initialized with
/// MPI_THREAD_MULTIPLE).
template <class X>
bool can_overlap(X& cross) {
  if constexpr (!async_transport<X>) return false;
  else if constexpr (requires { cross.concurrent_calls(); }) return cross.concurrent_calls();
  else return true;
}

/// Hierarchical all-reduce through the nodes' shared segments (uniform
/// layout, host memory), in chunks of one buffer: for chunk t, every local
/// rank copies in the slices its node peers reduce, one step, local rank l
/// reduces slice l of the node's inputs (rank order) into its output, and
/// starts the all-reduce of that slice with the ranks of local rank l on the
/// other nodes (cross transport); then it finishes chunk t-1: waits for its
/// cross all-reduce, puts the slice in its buffer, one step, and copies every
/// peer's slice of chunk t-1 out. With a cross transport that has a
/// communication thread (can_overlap), chunk t's all-reduce between nodes
/// runs there while this thread prepares chunk t+1, so the network and the
/// node's memory work at once. Each node sends each element over the
/// network once per cross step, and the L cross all-reduces of a node run at
/// once.
template <class N, class X, element T>
void hier_allreduce_shm(N& node, X& cross, const T* in, T* out, std::size_t count, reduce_op op, int world_size,
                        const collective_options& o, deadline due, const allreduce_policy& flat) {
  const auto lctx = make_context(node, "allreduce_hierarchical (node stage)");
  shm_segment& seg = shm_of(node, lctx);
  const int n = lctx.size, r = lctx.rank;
  const std::size_t cap =
      std::max<std::size_t>(1, std::min(shm_chunk_elems<T>(seg, lctx), hier_chunk_max_bytes_default / sizeof(T)));
  shm_claim claim(seg, lctx);
  const reduce_op stage_op = op == reduce_op::avg ? reduce_op::sum : op;
  collective_scope<N> S(node, lctx, coll_kind::allreduce, "hier", element_type_of_v<T>, count, op, -1,
                        stage_options(o, due));
  shm_steps<N> st(node, seg, S, lctx);
  // one chunk: nothing to overlap, and a hand-off to the communication
  // thread and back costs more than it saves
  const bool overlap = count > cap && can_overlap(cross);
  struct chunk {
    std::size_t off = 0, m = 0;
    collective_handle h; // the cross all-reduce, when it runs on the cross transport's thread
    bool active = false;
  };
  // Waits for chunk c's all-reduce between nodes, then all-gathers it
  // inside the node through the shared buffer.
  auto finish = [&](chunk& c) {
    S.guard([&] { c.h.wait(); });
    const auto own = chunk_range(c.m, n, r);
    const std::size_t sb = own.first, se = own.second;
    T* mine = out + c.off + sb;
    if (op == reduce_op::avg) divide_host(mine, se - sb, static_cast<std::size_t>(world_size));
    const int b = st.next_buffer();
    if (se > sb)
      std::memcpy(static_cast<void*>(reinterpret_cast<T*>(st.mine(b)) + sb), static_cast<const void*>(mine),
                  (se - sb) * sizeof(T));
    st.step();
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(c.m, n, p);
      if (p != r && pe > pb)
        std::memcpy(static_cast<void*>(out + c.off + pb),
                    static_cast<const void*>(reinterpret_cast<const T*>(st.of(p, b)) + pb), (pe - pb) * sizeof(T));
    }
    c.active = false;
  };
  chunk prev;
  for (std::size_t off = 0; off < count; off += cap) {
    chunk cur;
    cur.off = off;
    cur.m = std::min(cap, count - off);
    const int b = st.next_buffer();
    for (int p = 0; p < n; ++p) {
      const auto [pb, pe] = chunk_range(cur.m, n, p);
      if (p != r && pe > pb)
        std::memcpy(static_cast<void*>(reinterpret_cast<T*>(st.mine(b)) + pb), static_cast<const void*>(in + off + pb),
                    (pe - pb) * sizeof(T));
    }
    st.step();
    const auto own = chunk_range(cur.m, n, r);
    const std::size_t sb = own.first, se = own.second;
    // slice r of the node's sum, in rank order, into this rank's output. In
    // place, ranks 0 and 1 may read their own input where they write (the
    // first reduction reads both before writing); from rank 2 on the first
    // reduction would overwrite it, so the own slice is read from a copy in
    // this rank's buffer, whose slice-r region no peer reads.
    T* mine = out + off + sb;
    const T* own_in = in + off + sb;
    if (in == out && r >= 2 && se > sb) {
      T* copy = reinterpret_cast<T*>(st.mine(b)) + sb;
      std::memcpy(static_cast<void*>(copy), static_cast<const void*>(own_in), (se - sb) * sizeof(T));
      own_in = copy;
    }
    shm_reduce_ranks<T>(
        mine, [&](int p) { return p == r ? own_in : reinterpret_cast<const T*>(st.of(p, b)) + sb; }, n, se - sb,
        stage_op);
    const std::size_t len = se - sb;
    if (overlap) {
      if constexpr (async_transport<X>) {
        const collective_options co = stage_options(o, due);
        cur.h = cross.progress().submit(
            [&cross, mine, len, stage_op, co, flat] { cross_allreduce(cross, mine, len, memory_space::host, stage_op, co, flat); });
      }
    } else {
      S.guard([&] { cross_allreduce(cross, mine, len, memory_space::host, stage_op, stage_options(o, due), flat); });
    }
    cur.active = true;
    if (prev.active) finish(prev);
    prev = std::move(cur);
  }
  if (prev.active) finish(prev);
}

/// Largest message (bytes) of the small-message path of the hierarchical
/// all-reduce (hier_allreduce_small): DPKIT_HIER_SMALL_BYTES (measuring; 0
/// turns the path off), else hier_small_max_bytes_default.
/// @throws dpkit::invalid_argument naming a malformed value.
inline std::size_t hier_small_max_bytes() {
  static const std::optional<std::size_t> v = []() -> std::optional<std::size_t> {
    const char* s = std::getenv("DPKIT_HIER_SMALL_BYTES");
    if (!s || !*s) return hier_small_max_bytes_default;
    char* end = nullptr;
    const unsigned long long b = std::strtoull(s, &end, 10);
    if (!end || *end != '\0' || s[0] == '-') return std::nullopt;
    return static_cast<std::size_t>(b);
  }();
  if (!v)
    throw invalid_argument(std::string("DPKIT_HIER_SMALL_BYTES: expected a byte count, got '") +
                           std::getenv("DPKIT_HIER_SMALL_BYTES") + "'");
  return *v;
}

/// Hierarchical all-reduce of a small message (uniform layout, host memory):
/// every local rank gets its node's result in one shared-memory step (the
/// one-shot all-reduce, rank order: the same bits on every local rank), then
/// all-reduces it with the ranks of its local rank on the other nodes (each
/// local rank the same values by the same algorithm, so the same bits); no
/// step inside the node after the network. One shared-memory step and the
/// exchange between nodes, where the chunked path takes two steps around it
/// (the count of synchronizations of Open MPI coll/tuned's recursive
/// doubling over the whole world); each node sends L copies of the message,
/// which is why it serves small messages only.
template <class N, class X, element T>
void hier_allreduce_small(N& node, X& cross, const T* in, T* out, std::size_t count, reduce_op op, int world_size,
                          const collective_options& o, deadline due, const allreduce_policy& flat) {
  const reduce_op stage_op = op == reduce_op::avg ? reduce_op::sum : op;
  tensor_view<const T> vi{in, count, memory_space::host};
  tensor_view<T> vo{out, count, memory_space::host};
  allreduce_shm_one_shot(node, vi, vo, stage_op, stage_options(o, due));
  cross_allreduce(cross, out, count, memory_space::host, stage_op, stage_options(o, due), flat);
  if (op == reduce_op::avg) divide_host(out, count, static_cast<std::size_t>(world_size));
}

/// Hierarchical all-reduce through one leader per node (any layout, any
/// memory space): reduce to local rank 0, all-reduce among the leaders,
/// broadcast from local rank 0.
template <class N, class X, element T>
void hier_allreduce_leader(N& node, X* cross, const T* in, T* out, std::size_t count, memory_space space,
                           reduce_op op, int world_size, const collective_options& o, deadline due,
                           const allreduce_policy& flat, const local_ops<T>& L) {
  const reduce_op stage_op = op == reduce_op::avg ? reduce_op::sum : op;
  node_reduce(node, in, out, count, space, stage_op, stage_options(o, due));
  if (node.rank() == 0) {
    cross_allreduce(*cross, out, count, space, stage_op, stage_options(o, due), flat);
    if (op == reduce_op::avg) {
      L.divide(out, count, static_cast<std::size_t>(world_size));
      L.sync();
    }
  }
  node_broadcast(node, out, count, space, 0, stage_options(o, due));
}

/// Hierarchical all-reduce of `count` elements on transport `comm` (see
/// allreduce_hierarchical): numbered and checked as one collective of comm;
/// a failure in any stage fails comm (its peers stop within milliseconds).
template <class C, element T>
void allreduce_hierarchical_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count,
                                reduce_op op, memory_space space, const collective_options& o,
                                const allreduce_policy& flat, const local_ops<T>& L) {
  collective_scope<C> S(comm, ctx, coll_kind::allreduce, "hier", element_type_of_v<T>, count, op, -1, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  const node_topology& topo = comm.topology();
  auto* node = comm.node_transport();
  auto* cross = comm.cross_transport();
  const bool through_shm = topo.uniform() && space == memory_space::host && shm_available(*node);
  S.guard([&] {
    if (through_shm && count * sizeof(T) <= hier_small_max_bytes())
      hier_allreduce_small(*node, *cross, in, out, count, op, ctx.size, o, S.due(), flat);
    else if (through_shm)
      hier_allreduce_shm(*node, *cross, in, out, count, op, ctx.size, o, S.due(), flat);
    else
      hier_allreduce_leader(*node, cross, in, out, count, space, op, ctx.size, o, S.due(), flat, L);
  });
}

/// Hierarchical broadcast from world rank `root`: inside root's node from
/// root, then between nodes among the ranks of root's local rank (uniform
/// layout; otherwise the leaders, after root's node reached its leader), then
/// inside every other node.
template <class C, element T>
void broadcast_hierarchical_raw(C& comm, const op_context& ctx, T* data, std::size_t count, int root,
                                memory_space space, const collective_options& o) {
  collective_scope<C> S(comm, ctx, coll_kind::broadcast, "hier", element_type_of_v<T>, count, std::nullopt, root, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  const node_topology& topo = comm.topology();
  auto* node = comm.node_transport();
  auto* cross = comm.cross_transport();
  const int root_node = topo.node_of(root);
  // root's local rank: its position among its node's ranks
  const auto root_members = topo.layout().ranks_of(root_node);
  const int root_local =
      static_cast<int>(std::find(root_members.begin(), root_members.end(), root) - root_members.begin());
  const int relay = topo.uniform() ? root_local : 0; // the local rank that crosses nodes
  S.guard([&] {
    if (topo.node() == root_node) node_broadcast(*node, data, count, space, root_local, stage_options(o, S.due()));
    if (topo.local_rank() == relay && cross) {
      tensor_view<T> v{data, count, space};
      broadcast_tree(*cross, v, v, root_node, stage_options(o, S.due()));
    }
    if (topo.node() != root_node) node_broadcast(*node, data, count, space, relay, stage_options(o, S.due()));
  });
}

/// All-gather inside a node (shared memory with a segment and host
/// buffers, else the ring); out holds node.size() parts of `count`.
template <class N, element T>
void node_allgather(N& node, const T* in, T* out, std::size_t count, memory_space space, const collective_options& o) {
  tensor_view<const T> vi{in, count, space};
  tensor_view<T> vo{out, count * static_cast<std::size_t>(node.size()), space};
  if (space == memory_space::host && shm_available(node)) allgather_shm(node, vi, vo, o);
  else allgather_ring(node, vi, vo, o);
}
/// Reduce-scatter inside a node (shm or ring, as node_allgather): in holds
/// node.size() parts of `count`, out one.
template <class N, element T>
void node_reduce_scatter(N& node, const T* in, T* out, std::size_t count, memory_space space, reduce_op op,
                         const collective_options& o) {
  tensor_view<const T> vi{in, count * static_cast<std::size_t>(node.size()), space};
  tensor_view<T> vo{out, count, space};
  if (space == memory_space::host && shm_available(node)) reduce_scatter_shm(node, vi, vo, op, o);
  else reduce_scatter_ring(node, vi, vo, op, o);
}

/// Hierarchical all-gather (uniform layout): every rank's `count` elements
/// land at out[rank * count]. Stage 1, between nodes: the ranks of local
/// rank l all-gather their parts (ring on the cross transport), so each holds
/// the parts of local rank l of every node; stage 2, inside the node: the
/// local ranks all-gather those N-part groups (shared memory); then every
/// part moves to its rank's place. Each node's link carries (N-1)/N of the
/// output, the minimum; a flat ring carries (n-1)/n of it through one link.
template <class C, element T>
void allgather_hierarchical_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count,
                                memory_space space, const collective_options& o, const local_ops<T>& L) {
  collective_scope<C> S(comm, ctx, coll_kind::allgather, "hier", element_type_of_v<T>, count, std::nullopt, -1, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  const node_topology& topo = comm.topology();
  const std::size_t N = static_cast<std::size_t>(topo.nodes()), Lsz = static_cast<std::size_t>(topo.local_size());
  scratch_arena::lease lease(arena_of(comm));
  // the arena has two slots: the own part (small) comes from the heap
  scratch<T> mine(count, L), cross_parts(N * count, L, &lease, 0), node_parts(Lsz * N * count, L, &lease, 1);
  L.copy(mine.data(), in, count); // in may alias out (in place)
  L.sync();
  S.guard([&] {
    tensor_view<const T> vi{mine.data(), count, space};
    tensor_view<T> vo{cross_parts.data(), N * count, space};
    allgather_ring(*comm.cross_transport(), vi, vo, stage_options(o, S.due()));
    node_allgather(*comm.node_transport(), cross_parts.data(), node_parts.data(), N * count, space,
                   stage_options(o, S.due()));
  });
  // node_parts[(l * N + k) * count] is the part of local rank l on node k
  for (std::size_t k = 0; k < N; ++k) {
    const auto members = topo.layout().ranks_of(static_cast<int>(k));
    for (std::size_t l = 0; l < Lsz; ++l)
      L.copy(out + static_cast<std::size_t>(members[l]) * count, node_parts.data() + (l * N + k) * count, count);
  }
  L.sync();
}

/// Hierarchical reduce-scatter (uniform layout): rank r's out is op over
/// ranks of their in[r * count]. The input's parts are first grouped by
/// local rank (the parts of local rank l of every node together); stage 1,
/// inside the node: reduce-scatter of those groups (shared memory), so local
/// rank l holds the node's sums of the N parts of local rank l; stage 2,
/// between nodes: the ranks of local rank l reduce-scatter them (ring on the
/// cross transport), each keeping its own part. Each node's link carries
/// (N-1)/N of the input, the minimum.
template <class C, element T>
void reduce_scatter_hierarchical_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count,
                                     reduce_op op, memory_space space, const collective_options& o,
                                     const local_ops<T>& L) {
  collective_scope<C> S(comm, ctx, coll_kind::reduce_scatter, "hier", element_type_of_v<T>, count, op, -1, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  const node_topology& topo = comm.topology();
  const std::size_t N = static_cast<std::size_t>(topo.nodes()), Lsz = static_cast<std::size_t>(topo.local_size());
  const reduce_op stage_op = op == reduce_op::avg ? reduce_op::sum : op;
  scratch_arena::lease lease(arena_of(comm));
  scratch<T> grouped(Lsz * N * count, L, &lease, 0), node_sums(N * count, L, &lease, 1);
  for (std::size_t k = 0; k < N; ++k) {
    const auto members = topo.layout().ranks_of(static_cast<int>(k));
    for (std::size_t l = 0; l < Lsz; ++l)
      L.copy(grouped.data() + (l * N + k) * count, in + static_cast<std::size_t>(members[l]) * count, count);
  }
  L.sync();
  S.guard([&] {
    node_reduce_scatter(*comm.node_transport(), grouped.data(), node_sums.data(), N * count, space, stage_op,
                        stage_options(o, S.due()));
    tensor_view<const T> vi{node_sums.data(), N * count, space};
    tensor_view<T> vo{out, count, space};
    reduce_scatter_ring(*comm.cross_transport(), vi, vo, stage_op, stage_options(o, S.due()));
  });
  if (op == reduce_op::avg) {
    L.divide(out, count, static_cast<std::size_t>(ctx.size));
    L.sync();
  }
}

} // namespace dpkit::detail
