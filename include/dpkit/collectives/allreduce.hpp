/// @file allreduce.hpp
/// @brief `allreduce(comm, tensor, op, policy)`: all-reduce with the algorithm
/// chosen by an allreduce_policy: ring, tree, shm (one node), hierarchical
/// (across nodes), or the transport's native all-reduce (MPI_Allreduce,
/// ncclAllReduce). Asynchronous variants of every
/// collective are in async.hpp.
#pragma once

#include "allreduce_hierarchical.hpp"
#include "allreduce_ring.hpp"
#include "shm/allreduce.hpp"
#include "allreduce_tree.hpp"
#include "policy.hpp"

namespace dpkit {

/// Out-of-place all-reduce with the algorithm chosen by `policy`:
/// out[i] = op over all ranks of in[i]. With algorithm::automatic the
/// tuning table decides (tuning.hpp) for the message's bytes and the
/// transport's shape (ranks, nodes, ranks per node) among what it can run
/// now: the shared-memory algorithms on one node (host tensors),
/// hierarchical across nodes, native where a tuning rule names it. Every
/// rank must pass the same count, op, policy and options and see the same
/// DPKIT_TUNING_FILE (so they choose the same algorithm; a rank that chose
/// another one is reported as a mismatch_error, not a wrong result).
/// @throws dpkit::invalid_argument (sizes, spaces, native unsupported),
///         dpkit::timeout_error, dpkit::format_error (a DPKIT_TUNING_FILE
///         that cannot be parsed).
template <transport C, tensor In, tensor Out>
void allreduce(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum, const allreduce_policy& policy = {},
               const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const int n = comm.size();
  algorithm a = policy.algo;
  if (a == algorithm::automatic) {
    const bool host = space_of(in) == memory_space::host && space_of(out) == memory_space::host;
    tuning_key key{n, 1, n};
    tuning_availability avail{host && detail::shm_available(comm), false, native_collectives<C>};
    if constexpr (hierarchical_transport<C>) {
      const node_topology& t = comm.topology();
      key = {n, t.nodes(), t.max_local_size()};
      avail.hierarchical = t.hierarchical();
    }
    a = policy.choose(size_of(in) * sizeof(T), key, avail);
  }
  switch (a) {
  case algorithm::tree: allreduce_tree(comm, in, out, op, o); return;
  case algorithm::hierarchical: {
    allreduce_policy flat = policy;
    flat.algo = algorithm::automatic;
    allreduce_hierarchical(comm, in, out, op, o, flat);
    return;
  }
  case algorithm::shm: allreduce_shm(comm, in, out, op, o); return;
  case algorithm::shm_one_shot: allreduce_shm_one_shot(comm, in, out, op, o); return;
  case algorithm::shm_two_shot: allreduce_shm_two_shot(comm, in, out, op, o); return;
  case algorithm::native: {
    const auto ctx = detail::make_context(comm, "allreduce_native");
    const auto ip_outp = detail::resolve_inout(comm, ctx, in, out, size_of(in));
    const auto ip = ip_outp.first;
    const auto outp = ip_outp.second;
    detail::call_native(comm, ctx, detail::coll_kind::allreduce, element_type_of_v<T>, size_of(in), op, -1, o,
                        [&](auto& c) { c.native_allreduce(ip, outp, size_of(in), element_type_of_v<T>, op); });
    return;
  }
  case algorithm::ring:
  case algorithm::automatic: break;
  }
  allreduce_ring(comm, in, out, op, o);
}

/// In-place all-reduce of tensor t with the algorithm chosen by `policy`.
template <transport C, tensor Tn>
void allreduce(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const allreduce_policy& policy = {},
               const collective_options& o = {}) {
  allreduce(comm, t, t, op, policy, o);
}

} // namespace dpkit
