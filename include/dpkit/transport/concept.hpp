/// @file concept.hpp
/// @brief The transport concept and its refinements (docs/design.md,
/// "Transports"; docs/concepts.md, "Transports").
///
/// A transport is a group of `size()` ranks; this object is rank `rank()`.
/// It moves byte spans point-to-point without blocking: `isend(bytes, peer,
/// tag)` and `irecv(bytes, peer, tag)` return requests; messages between one
/// pair of ranks with one tag are matched in posting order (MPI's
/// non-overtaking rule), and a receive must be exactly as long as the matching
/// send. A request's `wait(deadline)` throws dpkit::timeout_error past the
/// deadline instead of hanging; `test()` polls.
#pragma once

#include "../core/element.hpp"
#include "../core/options.hpp"
#include "../core/reduce_op.hpp"
#include "../core/tensor.hpp"
#include "../core/device_ops.hpp"
#include "detail/health.hpp"
#include "detail/scratch_arena.hpp"
#include "detail/shm_segment.hpp"
#include "topology.hpp"

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

namespace dpkit {

/// A pending point-to-point operation. `wait(d)` blocks until it completes
/// (throws dpkit::timeout_error past deadline d, dpkit::error on a transport
/// failure); `test()` returns true once complete. Destroying an incomplete
/// request cancels it (the buffer is no longer touched afterwards).
template <class R>
concept request = std::movable<R> && requires(R& r, deadline d) {
  r.wait(d);
  { r.test() } -> std::convertible_to<bool>;
};

/// A transport: rank(), size(), isend/irecv of byte spans with a tag, and the
/// memory spaces it can move (`accepts(space)`, constexpr where possible).
template <class C>
concept transport = requires(C& c, const C& cc, std::span<const std::byte> sb, std::span<std::byte> rb,
                             int peer, int tag, memory_space m) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { c.isend(sb, peer, tag) } -> request;
  { c.irecv(rb, peer, tag) } -> request;
  { cc.accepts(m) } -> std::convertible_to<bool>;
};

/// The request type of transport C.
template <transport C>
using request_t = decltype(std::declval<C&>().isend(std::span<const std::byte>{}, 0, 0));

/// Refinement: the transport has native collectives (MPI_Allreduce,
/// ncclAllReduce, ...) that algorithm::native calls. Buffers are raw pointers
/// to `count` elements of `type` in the transport's memory space; in == out is
/// in place. For reduce_scatter `count` is the per-rank output count; for
/// allgather it is the per-rank input count.
template <class C>
concept native_collectives = transport<C> && requires(C& c, const void* in, void* out, std::size_t count,
                                                      element_type t, reduce_op op, int root) {
  c.native_allreduce(in, out, count, t, op);
  c.native_reduce_scatter(in, out, count, t, op);
  c.native_allgather(in, out, count, t);
  c.native_broadcast(in, out, count, t, root);
  c.native_reduce(in, out, count, t, op, root);
  c.native_barrier();
};

/// Refinement: the transport moves device memory with a table of device
/// primitives (`device()` returns it, or nullptr when this instance is host
/// only); ring and tree then run unchanged on device tensors.
template <class C>
concept device_transport = transport<C> && requires(const C& cc) {
  { cc.device() } -> std::convertible_to<const device_ops*>;
};

/// Refinement: the transport owns a cache of host scratch that its
/// collectives reuse from call to call (`scratch()`), instead of allocating
/// and faulting in fresh pages on every call.
template <class C>
concept scratch_transport = transport<C> && requires(C& c) {
  { c.scratch() } -> std::same_as<detail::scratch_arena&>;
};

/// Refinement: the transport checks its collectives (docs/reliability.md):
/// `health()` numbers every collective per stream and remembers the first
/// failure (later calls throw communicator_error); messages carry the
/// collective's sequence number and fingerprint hash in their tags so a peer
/// running another collective is detected (mismatch_error) rather than
/// matched; `report_failure(what)` fails the transport and tells the peers.
template <class C>
concept checked_transport = transport<C> && requires(C& c, const std::string& what) {
  { c.health() } -> std::same_as<detail::comm_health&>;
  c.report_failure(what);
};

/// Refinement: the transport splits into sub-transports by color and key, as
/// MPI_Comm_split: a collective call of every rank; the ranks that pass the
/// same color (>= 0) form a new transport, ranked by (key, rank). The result
/// is a transport of its own (its messages never match the parent's).
template <class C>
concept splittable_transport = transport<C> && requires(C& c, int color, int key) {
  { c.split(color, key) } -> transport;
};

/// Refinement: the transport receives from whichever rank sends first with
/// a tag (MPI_ANY_SOURCE: MPI's and Gloo's recv from any source): the
/// request's source() names the sender once complete (-1 before). Messages
/// of one sender and tag still match in order. What torch's recv without a
/// source runs on (mpi, gloo_transport).
template <class C>
concept any_source_transport = transport<C> && requires(C& c, std::span<std::byte> rb, int tag) {
  { c.irecv_any(rb, tag) } -> request;
  { c.irecv_any(rb, tag).source() } -> std::convertible_to<int>;
};

/// Refinement: the transport knows which node each of its ranks runs on
/// (topology(): MPI_COMM_TYPE_SHARED on MPI, a declared layout on inproc) and
/// owns the sub-transports the hierarchical collectives run on when
/// topology().hierarchical(): node_transport() (the ranks of this rank's
/// node, with its shared segment) and cross_transport() (on a uniform layout
/// the ranks with this rank's local rank on every node; otherwise the nodes'
/// leaders, local rank 0, and nullptr on the other ranks). Both are nullptr
/// when the topology is not hierarchical.
template <class C>
concept hierarchical_transport = transport<C> && requires(C& c, const C& cc) {
  { cc.topology() } -> std::same_as<const node_topology&>;
  requires transport<std::remove_pointer_t<decltype(c.node_transport())>>;
  requires transport<std::remove_pointer_t<decltype(c.cross_transport())>>;
  requires std::is_pointer_v<decltype(c.node_transport())>;
  requires std::is_pointer_v<decltype(c.cross_transport())>;
};

/// Refinement: the ranks can map one shared segment (docs/algorithms.md
/// "Shared memory"): a POSIX shared-memory object every rank of the node
/// maps (mpi, when every rank is on one node) or a block owned by the
/// inproc_world.
/// `shm()` returns this rank's view of the segment, or nullptr when it is
/// unavailable at run time (ranks on several nodes, DPKIT_SHM_BYTES=0);
/// the shm algorithms then refuse (invalid_argument) and the automatic
/// policy does not choose them. `shm_poll(peer, tag)` looks for a failure of
/// the transport or of rank `peer` (a fault notice, a rank that returned) and
/// for a message that carries another collective at the sequence number of
/// `tag` (the waiting collective's checked tag base; a plain tag checks
/// nothing), and throws peer_error / mismatch_error; waits on the segment
/// call it about every millisecond. One shm collective at a time per
/// transport (the segment has one step counter per rank).
template <class C>
concept shared_memory_transport = transport<C> && requires(C& c, int peer, int tag) {
  { c.shm() } -> std::same_as<detail::shm_segment*>;
  c.shm_poll(peer, tag);
};

/// Refinement: the transport owns a communication thread that runs
/// asynchronous collectives in submission order (see async.hpp).
template <class C>
concept async_transport = transport<C> && requires(C& c) { c.progress(); };

} // namespace dpkit
