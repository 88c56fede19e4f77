/// @file allreduce.hpp
/// @brief `allreduce(comm, tensor, op, policy)`: dispatch to ring, tree or the
/// transport's native all-reduce, plus asynchronous variants of every
/// collective (`*_async`) that run on the transport's communication thread.
#pragma once

#include "allgather_ring.hpp"
#include "allreduce_ring.hpp"
#include "allreduce_tree.hpp"
#include "barrier.hpp"
#include "broadcast_tree.hpp"
#include "policy.hpp"
#include "reduce_scatter_ring.hpp"
#include "reduce_tree.hpp"

#include "../core/async.hpp"

namespace dpkit {

namespace detail {
template <class C>
[[noreturn]] void no_native(const op_context& ctx) {
  ctx.invalid("algorithm::native requested but this transport has no native collectives");
}
} // namespace detail

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
  switch (policy.choose(size_of(in) * sizeof(T), n)) {
  case algorithm::tree: allreduce_tree(comm, in, out, op, o); return;
  case algorithm::native: {
    const auto ctx = detail::make_context(comm, "allreduce_native");
    const auto [ip, outp] = detail::resolve_inout(comm, ctx, in, out, size_of(in));
    if constexpr (native_collectives<C>) comm.native_allreduce(ip, outp, size_of(in), element_type_of_v<T>, op);
    else detail::no_native<C>(ctx);
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

/// Asynchronous in-place all-reduce: enqueues the collective on comm's
/// communication thread and returns at once. t's memory must stay valid and
/// untouched until the handle's wait() returns; comm must outlive it.
/// Collectives submitted to one transport run in submission order.
template <async_transport C, tensor Tn>
collective_handle allreduce_async(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const allreduce_policy& policy = {},
                                  const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  tensor_view<T> v{as_span(t).data(), size_of(t), space_of(t)};
  return comm.progress().submit([&comm, v, op, policy, o] { allreduce(comm, v, v, op, policy, o); });
}

/// Asynchronous out-of-place all-reduce (see the in-place overload).
template <async_transport C, tensor In, tensor Out>
collective_handle allreduce_async(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                                  const allreduce_policy& policy = {}, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  tensor_view<const T> vi{as_span(in).data(), size_of(in), space_of(in)};
  tensor_view<T> vo{as_span(out).data(), size_of(out), space_of(out)};
  return comm.progress().submit([&comm, vi, vo, op, policy, o] { allreduce(comm, vi, vo, op, policy, o); });
}

/// Asynchronous out-of-place ring reduce-scatter (see reduce_scatter_ring).
template <async_transport C, tensor In, tensor Out>
collective_handle reduce_scatter_async(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                                       const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  tensor_view<const T> vi{as_span(in).data(), size_of(in), space_of(in)};
  tensor_view<T> vo{as_span(out).data(), size_of(out), space_of(out)};
  return comm.progress().submit([&comm, vi, vo, op, o] { reduce_scatter_ring(comm, vi, vo, op, o); });
}

/// Asynchronous out-of-place ring all-gather (see allgather_ring).
template <async_transport C, tensor In, tensor Out>
collective_handle allgather_async(C& comm, const In& in, Out&& out, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  tensor_view<const T> vi{as_span(in).data(), size_of(in), space_of(in)};
  tensor_view<T> vo{as_span(out).data(), size_of(out), space_of(out)};
  return comm.progress().submit([&comm, vi, vo, o] { allgather_ring(comm, vi, vo, o); });
}

/// Asynchronous in-place tree broadcast from root (see broadcast_tree).
template <async_transport C, tensor Tn>
collective_handle broadcast_async(C& comm, Tn&& t, int root = 0, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  tensor_view<T> v{as_span(t).data(), size_of(t), space_of(t)};
  return comm.progress().submit([&comm, v, root, o] { broadcast_tree(comm, v, v, root, o); });
}

} // namespace dpkit
