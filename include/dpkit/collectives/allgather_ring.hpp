/// @file allgather_ring.hpp
/// @brief Ring all-gather (semantics of ncclAllGather / MPI_Allgather): every
/// rank ends with the concatenation of all ranks' inputs, in rank order.
///
/// n-1 steps; each segment is forwarded to the right neighbour as soon as it
/// arrives, received straight into the output (no scratch).
#pragma once

#include "../detail/collective.hpp"

#include <vector>

namespace dpkit {

namespace detail {

template <transport C, element T>
void allgather_ring_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count,
                        const collective_options& o, const local_ops<T>& L) {
  const int n = ctx.size, r = ctx.rank;
  if (count == 0) return;
  auto chunk = [&](int c) { return static_cast<std::size_t>(c) * count; };
  L.copy(out + chunk(r), in, count);
  if (n == 1) return;
  L.sync();
  const deadline dl = deadline_after(o.timeout);
  const std::size_t seg = segment_elems<T>(o);
  const std::size_t nseg = ceil_div(count, seg);
  const int right = mod(r + 1, n), left = mod(r - 1, n), tag = o.tag + 5;
  auto len = [&](std::size_t j) { return std::min(seg, count - j * seg); };
  using req = request_t<C>;
  const std::size_t items = static_cast<std::size_t>(n - 1) * nseg;
  std::vector<req> recvs(items), sends;
  sends.reserve(items);
  for (std::size_t i = 0; i < items; ++i) {
    const int t = static_cast<int>(i / nseg);
    const std::size_t j = i % nseg;
    recvs[i] = comm.irecv(bytes_of(out + chunk(mod(r - t - 1, n)) + j * seg, len(j)), left, tag);
  }
  for (std::size_t j = 0; j < nseg; ++j) sends.push_back(comm.isend(bytes_of(in + j * seg, len(j)), right, tag));
  for (std::size_t i = 0; i < items; ++i) {
    const int t = static_cast<int>(i / nseg);
    const std::size_t j = i % nseg;
    wait_ctx(recvs[i], dl, ctx);
    if (t + 1 < n - 1)
      sends.push_back(comm.isend(bytes_of(static_cast<const T*>(out + chunk(mod(r - t - 1, n)) + j * seg), len(j)),
                                 right, tag));
  }
  wait_all_ctx(sends, dl, ctx);
}

} // namespace detail

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
