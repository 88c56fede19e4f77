/// @file async.hpp
/// @brief Asynchronous variants of every collective (`*_async`): each enqueues
/// the collective on the transport's communication thread (an
/// async_transport, see core/async.hpp) and returns a collective_handle at
/// once. Collectives submitted to one transport run in submission order, so
/// ranks that submit the same sequence run the same sequence (as NCCL orders
/// work on a stream).
///
/// Lifetime: the tensors' memory must stay valid and untouched until the
/// handle's wait() returns, and comm must outlive the handle. Arguments and
/// errors are those of the blocking dispatchers (allreduce.hpp,
/// reduce_scatter.hpp, allgather.hpp, broadcast.hpp, reduce.hpp); errors are
/// rethrown by wait().
#pragma once

#include "allgather.hpp"
#include "allreduce.hpp"
#include "broadcast.hpp"
#include "reduce.hpp"
#include "reduce_scatter.hpp"

#include "../core/async.hpp"

namespace dpkit {

namespace detail {
/// A non-owning view of t that the communication thread can hold by value.
template <tensor Tn>
auto async_view(Tn&& t) {
  using T = tensor_value_t<Tn>;
  using V = std::conditional_t<std::is_const_v<std::remove_reference_t<decltype(*as_span(t).data())>>, const T, T>;
  return tensor_view<V>{as_span(t).data(), size_of(t), space_of(t)};
}
} // namespace detail

/// Asynchronous in-place all-reduce (see allreduce).
template <async_transport C, tensor Tn>
collective_handle allreduce_async(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const allreduce_policy& policy = {},
                                  const collective_options& o = {}) {
  auto v = detail::async_view(t);
  return comm.progress().submit([&comm, v, op, policy, o] { allreduce(comm, v, v, op, policy, o); });
}

/// Asynchronous out-of-place all-reduce (see allreduce).
template <async_transport C, tensor In, tensor Out>
collective_handle allreduce_async(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                                  const allreduce_policy& policy = {}, const collective_options& o = {}) {
  auto vi = detail::async_view(in);
  auto vo = detail::async_view(out);
  return comm.progress().submit([&comm, vi, vo, op, policy, o] { allreduce(comm, vi, vo, op, policy, o); });
}

/// Asynchronous out-of-place reduce-scatter (see reduce_scatter).
template <async_transport C, tensor In, tensor Out>
collective_handle reduce_scatter_async(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                                       algorithm a = algorithm::automatic, const collective_options& o = {}) {
  auto vi = detail::async_view(in);
  auto vo = detail::async_view(out);
  return comm.progress().submit([&comm, vi, vo, op, a, o] { reduce_scatter(comm, vi, vo, op, a, o); });
}

/// Asynchronous out-of-place all-gather (see allgather).
template <async_transport C, tensor In, tensor Out>
collective_handle allgather_async(C& comm, const In& in, Out&& out, algorithm a = algorithm::automatic,
                                  const collective_options& o = {}) {
  auto vi = detail::async_view(in);
  auto vo = detail::async_view(out);
  return comm.progress().submit([&comm, vi, vo, a, o] { allgather(comm, vi, vo, a, o); });
}

/// Asynchronous in-place broadcast from root (see broadcast).
template <async_transport C, tensor Tn>
collective_handle broadcast_async(C& comm, Tn&& t, int root = 0, algorithm a = algorithm::automatic,
                                  const collective_options& o = {}) {
  auto v = detail::async_view(t);
  return comm.progress().submit([&comm, v, root, a, o] { dpkit::broadcast(comm, v, v, root, a, o); });
}

/// Asynchronous out-of-place reduce to root (see reduce).
template <async_transport C, tensor In, tensor Out>
collective_handle reduce_async(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum, int root = 0,
                               algorithm a = algorithm::automatic, const collective_options& o = {}) {
  auto vi = detail::async_view(in);
  auto vo = detail::async_view(out);
  return comm.progress().submit([&comm, vi, vo, op, root, a, o] { dpkit::reduce(comm, vi, vo, op, root, a, o); });
}

} // namespace dpkit
