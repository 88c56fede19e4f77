/// @file allreduce.hpp
/// @brief `allreduce(comm, tensor, op, policy)`: all-reduce with the algorithm
/// chosen by an allreduce_policy: ring, tree, or the transport's native
/// all-reduce (MPI_Allreduce, ncclAllReduce). Asynchronous variants of every
/// collective are in async.hpp.
#pragma once

#include "allreduce_ring.hpp"
#include "allreduce_shm.hpp"
#include "allreduce_tree.hpp"
#include "policy.hpp"

namespace dpkit {

/// Out-of-place all-reduce with the algorithm chosen by `policy`:
/// out[i] = op over all ranks of in[i]. Every rank must pass the same count,
/// op, policy and options (so they choose the same algorithm).
/// @throws dpkit::invalid_argument (sizes, spaces, native unsupported),
///         dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void allreduce(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum, const allreduce_policy& policy = {},
               const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const int n = comm.size();
  const bool shm_ok = policy.algo == algorithm::automatic && space_of(in) == memory_space::host &&
                      space_of(out) == memory_space::host && detail::shm_available(comm);
  switch (policy.choose(size_of(in) * sizeof(T), n, shm_ok)) {
  case algorithm::tree: allreduce_tree(comm, in, out, op, o); return;
  case algorithm::shm:
    allreduce_shm(comm, in, out, op, o, policy.shm_one_shot_max_bytes, policy.shm_one_shot_max_bytes_two_ranks);
    return;
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
