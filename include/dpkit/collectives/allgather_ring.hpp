/// @file allgather_ring.hpp
/// @brief Ring all-gather (semantics of ncclAllGather / MPI_Allgather): every
/// rank ends with the concatenation of all ranks' inputs, in rank order.
///
/// n-1 steps; each segment is forwarded to the right neighbour as soon as it
/// arrives, received straight into the output (no scratch).
#pragma once

#include "detail/allgather_ring.hpp"

#include <vector>

namespace dpkit {

/// Out-of-place ring all-gather.
/// @param in  count elements on every rank.
/// @param out count x n elements: out[k * count + i] = rank k's in[i].
/// @throws dpkit::invalid_argument if out.size() != in.size() x n, spaces
///         differ or the transport cannot move them; dpkit::timeout_error.
template <transport C, tensor In, tensor Out>
void allgather_ring(C& comm, const In& in, Out&& out, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "allgather_ring");
  const std::size_t count = size_of(in);
  const auto [ip, outp] = detail::resolve_inout(comm, ctx, in, out, count * static_cast<std::size_t>(ctx.size));
  detail::allgather_ring_raw<C, T>(comm, ctx, ip, outp, count, o, detail::make_local<C, T>(comm, ctx, space_of(in)));
}

/// In-place ring all-gather (NCCL's convention): t holds count x n elements;
/// this rank's contribution is already in t[rank * count, (rank + 1) * count).
/// @throws dpkit::invalid_argument if t.size() is not a multiple of n.
template <transport C, tensor Tn>
void allgather_ring(C& comm, Tn&& t, const collective_options& o = {}) {
  using T = tensor_value_t<Tn>;
  const auto ctx = detail::make_context(comm, "allgather_ring");
  const auto [p, count] = detail::resolve_chunked_inplace(comm, ctx, t);
  detail::allgather_ring_raw<C, T>(comm, ctx, p + static_cast<std::size_t>(ctx.rank) * count, p, count, o,
                                   detail::make_local<C, T>(comm, ctx, space_of(t)));
}

} // namespace dpkit
