/// @file barrier.hpp
/// @brief Dissemination barrier (Hensgen, Finkel & Manber): ceil(log2 n)
/// rounds of zero-byte messages; no rank leaves before every rank entered.
/// `barrier(comm, algorithm::native)` calls the transport's own barrier.
#pragma once

#include "detail/common.hpp"
#include "policy.hpp"

namespace dpkit {

/// Blocks until every rank of comm called barrier.
/// @throws dpkit::timeout_error if some rank does not arrive before the deadline.
template <transport C>
void barrier(C& comm, const collective_options& o = {}) {
  const auto ctx = detail::make_context(comm, "barrier");
  const deadline dl = deadline_after(o.timeout);
  const int n = ctx.size, r = ctx.rank;
  for (int k = 1; k < n; k <<= 1) {
    auto rq = comm.irecv(std::span<std::byte>{}, detail::mod(r - k, n), detail::tag_of(o, detail::tag_offset::barrier));
    auto sq = comm.isend(std::span<const std::byte>{}, detail::mod(r + k, n), detail::tag_of(o, detail::tag_offset::barrier));
    detail::wait_ctx(rq, dl, ctx);
    detail::wait_ctx(sq, dl, ctx);
  }
}

/// Barrier with the algorithm chosen by the caller: automatic (the
/// dissemination barrier above) or native (MPI_Barrier, ...).
/// @throws dpkit::invalid_argument for ring or tree, or native on a transport
///         without native collectives; dpkit::timeout_error.
template <transport C>
void barrier(C& comm, algorithm a, const collective_options& o = {}) {
  if (a == algorithm::automatic) return barrier(comm, o);
  const auto ctx = detail::make_context(comm, "barrier_native");
  if (a != algorithm::native) detail::no_such_algorithm(ctx, algorithm_name(a));
  detail::call_native(comm, ctx, [](auto& c) { c.native_barrier(); });
}

} // namespace dpkit
