/// @file barrier.hpp
/// @brief Dissemination barrier (Hensgen, Finkel & Manber): ceil(log2 n)
/// rounds of zero-byte messages; no rank leaves before every rank entered.
#pragma once

#include "../detail/collective.hpp"

namespace dpkit {

/// Blocks until every rank of comm called barrier.
/// @throws dpkit::timeout_error if some rank does not arrive before the deadline.
template <transport C>
void barrier(C& comm, const collective_options& o = {}) {
  const auto ctx = detail::make_context(comm, "barrier");
  const deadline dl = deadline_after(o.timeout);
  const int n = ctx.size, r = ctx.rank;
  for (int k = 1; k < n; k <<= 1) {
    auto rq = comm.irecv(std::span<std::byte>{}, detail::mod(r - k, n), o.tag + 7);
    auto sq = comm.isend(std::span<const std::byte>{}, detail::mod(r + k, n), o.tag + 7);
    detail::wait_ctx(rq, dl, ctx);
    detail::wait_ctx(sq, dl, ctx);
  }
}

} // namespace dpkit
