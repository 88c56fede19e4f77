/// @file allreduce_hierarchical.hpp
/// @brief Hierarchical (node-aware) all-reduce and broadcast across nodes, on
/// a hierarchical_transport (dpkit::mpi across hosts, dpkit::inproc with
/// virtual nodes): the shape of NCCL's and Horovod's hierarchical
/// all-reduce and of Open MPI's coll/han.
///
/// All-reduce, uniform layout (every node has L ranks) with host tensors:
/// per chunk (hier_chunk_max_bytes_default, 1 MiB, at most the node's shared
/// buffer), the node's ranks reduce-scatter the chunk through shared memory (local rank l reduces slice l, in local rank
/// order), each local rank all-reduces its slice with the ranks of the same
/// local rank on the other nodes (cross_transport(): recursive doubling or
/// tree for small slices, ring for large), and the node's ranks all-gather
/// the slices through shared memory; one chunk's stages overlap the next's. Each node then sends 2(N-1)/N of the message over the
/// network (N nodes), the minimum for an all-reduce, where a flat ring over
/// the N x L ranks sends 2(NL-1)/(NL) of it through each node's link. Other
/// layouts (nodes of different sizes) and device tensors go through one
/// leader per node: reduce to local rank 0, all-reduce among the leaders,
/// broadcast inside the node.
///
/// Results are bitwise identical on every rank: each slice's final value is
/// computed by one cross all-reduce (itself bitwise identical on its ranks)
/// and copied to the node's ranks.
#pragma once

#include "allreduce_ring.hpp"
#include "shm/allreduce.hpp"
#include "allreduce_tree.hpp"
#include "detail/hierarchical.hpp"
#include "policy.hpp"

namespace dpkit {

namespace detail {
template <class C, tensor In, tensor Out>
void allreduce_hierarchical_entry(C& comm, const In& in, Out& out, reduce_op op, const collective_options& o,
                                  const allreduce_policy& flat) {
  using T = tensor_value_t<In>;
  const auto ctx = make_context(comm, "allreduce_hierarchical");
  const auto [ip, outp] = resolve_inout(comm, ctx, in, out, size_of(in));
  if constexpr (hierarchical_transport<C>) {
    const memory_space space = space_of(in);
    if (comm.topology().hierarchical()) {
      allreduce_hierarchical_raw<C, T>(comm, ctx, ip, outp, size_of(in), op, space, o, flat,
                                       make_local<C, T>(comm, ctx, space));
      return;
    }
    // One node, or one rank per node: the flat algorithm is the hierarchy.
    const node_topology& t = comm.topology();
    const tuning_key key{comm.size(), t.nodes(), t.max_local_size()};
    const tuning_availability avail{space == memory_space::host && shm_available(comm), false, false};
    switch (flat.choose(size_of(in) * sizeof(T), key, avail)) {
    case algorithm::shm: allreduce_shm(comm, in, out, op, o); break;
    case algorithm::shm_one_shot: allreduce_shm_one_shot(comm, in, out, op, o); break;
    case algorithm::shm_two_shot: allreduce_shm_two_shot(comm, in, out, op, o); break;
    case algorithm::tree: allreduce_tree(comm, in, out, op, o); break;
    default: allreduce_ring(comm, in, out, op, o); break;
    }
  } else {
    (void)ip, (void)outp, (void)op, (void)o, (void)flat;
    ctx.invalid("algorithm::hierarchical requested but this transport does not know its nodes "
                "(not a hierarchical_transport)");
  }
}
} // namespace detail

/// Out-of-place hierarchical all-reduce: out[i] = op over all ranks of in[i]
/// (see the file comment for the stages). On one node, or with one rank per
/// node, it runs the flat algorithm `flat` picks (shm, tree or ring).
///
/// @param comm a hierarchical_transport (dpkit::mpi, dpkit::inproc).
/// @param in   tensor of `count` elements of any dpkit element type (host or
///             device memory; device tensors take the leader path).
/// @param out  tensor of the same element type, count and memory space (may
///             alias in).
/// @param op   sum, prod, min, max, or avg (sum over every rank, then divided
///             by the world size once).
/// @param o    timeout (for the whole collective: each stage gets what is
///             left of it), tag, check level, segment size and pipeline
///             depth of the stages.
/// @param flat the policy of the stages' algorithms (tree or ring between
///             nodes, chosen by its tuning table for N nodes of one rank;
///             on one node the flat algorithm it picks).
/// Every rank must call with the same count, op, options and policy.
/// @throws dpkit::invalid_argument (sizes, spaces, not a
///         hierarchical_transport); dpkit::timeout_error, dpkit::peer_error,
///         dpkit::mismatch_error from any stage, on every rank (a failed
///         stage fails the transport and tells every rank).
template <transport C, tensor In, tensor Out>
void allreduce_hierarchical(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                            const collective_options& o = {}, const allreduce_policy& flat = {}) {
  detail::allreduce_hierarchical_entry(comm, in, out, op, o, flat);
}
/// In-place hierarchical all-reduce of tensor t (see the out-of-place overload).
template <transport C, tensor Tn>
void allreduce_hierarchical(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {},
                            const allreduce_policy& flat = {}) {
  detail::allreduce_hierarchical_entry(comm, t, t, op, o, flat);
}

} // namespace dpkit
