// dpkit internals: the body of the ring all-gather (allgather_ring_raw), apart from its
// documented entry point in collectives/allgather_ring.hpp. Not for users.
#pragma once

#include "common.hpp"

#include <vector>

namespace dpkit::detail {
template <transport C, element T>
void allgather_ring_raw(C& comm, const op_context& ctx, const T* in, T* out, std::size_t count,
                        const collective_options& o, const local_ops<T>& L) {
  const int n = ctx.size, r = ctx.rank;
  collective_scope<C> S(comm, ctx, coll_kind::allgather, "ring", element_type_of_v<T>, count, std::nullopt, -1, o);
  if (count == 0) return zero_count_check(comm, S, ctx);
  auto chunk = [&](int c) { return static_cast<std::size_t>(c) * count; };
  L.copy(out + chunk(r), in, count);
  if (n == 1) return;
  L.sync();
  const std::size_t seg = segment_elems<T>(o);
  const std::size_t nseg = ceil_div(count, seg);
  const int right = mod(r + 1, n), left = mod(r - 1, n), tag = S.tag(tag_offset::allgather_ring);
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
    S.wait(recvs[i]);
    if (t + 1 < n - 1)
      sends.push_back(comm.isend(bytes_of(static_cast<const T*>(out + chunk(mod(r - t - 1, n)) + j * seg), len(j)),
                                 right, tag));
  }
  S.wait_all(sends);
}

} // namespace dpkit::detail
