/// @file alltoall.hpp
/// @brief `alltoall(comm, in, out)` and `alltoallv(comm, in, send_counts,
/// out, recv_counts)`: block p of every rank's input to rank p, which
/// stores rank r's block at its position r. Semantics of MPI_Alltoall and
/// MPI_Alltoallv with blocks packed in rank order (and of
/// torch.distributed.all_to_all_single with and without split sizes:
/// ProcessGroupGloo's alltoall and alltoallv), the exchange of a mixture of
/// experts' token dispatch. Pairwise, as Gloo's and Open MPI's for large
/// blocks: every receive is posted first, then the sends in the order
/// rank + 1, rank + 2, ... (so the ranks do not all send to rank 0 first);
/// each block crosses once, straight to its rank, and the own block is a
/// local copy. Checked like every dpkit collective: numbered, its
/// fingerprint in the tags, under the deadline. In the uneven form the
/// ranks' counts legitimately differ, so the fingerprint carries none:
/// on checked transports each pair of ranks first exchanges what it sends
/// and expects (two words per peer), and a pair that disagrees throws
/// mismatch_error on both ranks, naming both counts, before any data moves;
/// elsewhere the receiving rank fails (every dpkit transport requires a
/// receive as long as its send).
#pragma once

#include "detail/common.hpp"

#include <numeric>
#include <vector>

namespace dpkit {
namespace detail {
// The exchange of both forms: block p of `ip` (send_counts[p] elements at
// send_offsets[p]) to rank p; rank p's block into `op` at recv_offsets[p]
// (recv_counts[p] elements).
template <class C, element T>
void alltoall_pairwise(C& comm, const op_context& ctx, collective_scope<C>& S, const local_ops<T>& L, const T* ip,
                       const std::vector<std::size_t>& send_counts, const std::vector<std::size_t>& send_offsets,
                       T* op, const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_offsets) {
  const int n = ctx.size, r = ctx.rank;
  const auto ur = static_cast<std::size_t>(r);
  const int tag = S.tag(tag_offset::alltoall);
  using req = request_t<C>;
  std::vector<req> rs, ss;
  rs.reserve(static_cast<std::size_t>(n - 1));
  ss.reserve(static_cast<std::size_t>(n - 1));
  for (int k = 1; k < n; ++k) {
    const auto p = static_cast<std::size_t>(mod(r - k, n));
    rs.push_back(comm.irecv(bytes_of(op + recv_offsets[p], recv_counts[p]), static_cast<int>(p), tag));
  }
  L.sync();
  for (int k = 1; k < n; ++k) {
    const auto p = static_cast<std::size_t>(mod(r + k, n));
    ss.push_back(comm.isend(bytes_of(ip + send_offsets[p], send_counts[p]), static_cast<int>(p), tag));
  }
  L.copy(op + recv_offsets[ur], ip + send_offsets[ur], send_counts[ur]);
  S.wait_all(rs);
  S.wait_all(ss);
}

// Every pair of ranks compares its counts: rank r tells rank p how many
// elements it sends p and expects from p; a pair that disagrees throws
// mismatch_error on both ranks (naming both counts) before any data moves.
template <class C>
void alltoallv_agree(C& comm, const op_context& ctx, collective_scope<C>& S, const std::vector<std::size_t>& send_counts,
                     const std::vector<std::size_t>& recv_counts) {
  const int n = ctx.size, r = ctx.rank;
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::uint64_t> mine(2 * un), theirs(2 * un);
  for (std::size_t p = 0; p < un; ++p) mine[2 * p] = send_counts[p], mine[2 * p + 1] = recv_counts[p];
  const int tag = S.tag(tag_offset::alltoall_counts);
  using req = request_t<C>;
  std::vector<req> rs;
  rs.reserve(2 * un);
  for (int k = 1; k < n; ++k) {
    const auto p = static_cast<std::size_t>(mod(r - k, n));
    rs.push_back(comm.irecv(bytes_of(theirs.data() + 2 * p, 2), static_cast<int>(p), tag));
  }
  for (int k = 1; k < n; ++k) {
    const auto p = static_cast<std::size_t>(mod(r + k, n));
    rs.push_back(comm.isend(bytes_of(mine.data() + 2 * p, 2), static_cast<int>(p), tag));
  }
  S.wait_all(rs);
  for (std::size_t p = 0; p < un; ++p) {
    if (p == static_cast<std::size_t>(r)) continue;
    const std::string who = "rank " + std::to_string(p);
    std::string what;
    if (theirs[2 * p] != recv_counts[p])
      what = who + " sends " + std::to_string(theirs[2 * p]) + " elements to rank " + std::to_string(r) +
             ", which expects " + std::to_string(recv_counts[p]);
    else if (theirs[2 * p + 1] != send_counts[p])
      what = "rank " + std::to_string(r) + " sends " + std::to_string(send_counts[p]) + " elements to " + who +
             ", which expects " + std::to_string(theirs[2 * p + 1]);
    if (!what.empty()) S.guard([&] { throw mismatch_error("split sizes differ: " + what); });
  }
}

inline std::vector<std::size_t> prefix_offsets(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> off(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) off[i] = off[i - 1] + counts[i - 1];
  return off;
}
} // namespace detail

/// Even all-to-all: `in` and `out` hold world size blocks of count elements;
/// block p of in goes to rank p, which puts it at its block r (r the
/// sender). Not in place: in and out must not overlap.
/// @param in  world size x count elements (the same count on every rank).
/// @param out world size x count elements.
/// @throws dpkit::invalid_argument (sizes not a multiple of the world size,
///         in and out of different sizes or spaces, overlapping buffers, a
///         non-contiguous tensor: naming the value and the rank);
///         dpkit::timeout_error, mismatch_error, peer_error,
///         communicator_error as every collective.
template <transport C, tensor In, tensor Out>
void alltoall(C& comm, const In& in, Out&& out, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "alltoall");
  const auto [ip, op] = detail::resolve_inout(comm, ctx, in, out, size_of(in));
  const auto n = static_cast<std::size_t>(ctx.size);
  const std::size_t total = size_of(in);
  if (total % n != 0)
    ctx.invalid("input has " + std::to_string(total) + " elements, not a multiple of the world size " + std::to_string(n));
  if (total > 0 && ip < op + total && op < ip + total) ctx.invalid("input and output overlap (all-to-all is not in place)");
  const std::size_t count = total / n;
  detail::collective_scope<C> S(comm, ctx, detail::coll_kind::alltoall, "pairwise", element_type_of_v<T>, count,
                                std::nullopt, -1, o);
  if (count == 0) return detail::zero_count_check(comm, S, ctx);
  const auto L = detail::make_local<C, T>(comm, ctx, space_of(in));
  const std::vector<std::size_t> counts(n, count);
  const auto offsets = detail::prefix_offsets(counts);
  detail::alltoall_pairwise(comm, ctx, S, L, ip, counts, offsets, op, counts, offsets);
}

/// Uneven all-to-all: rank r sends send_counts[p] elements to rank p (its
/// blocks packed in rank order in `in`) and receives recv_counts[p] from
/// rank p (packed in rank order in `out`). Rank p's send_counts[r] must
/// equal rank r's recv_counts[p] (else the receiving rank fails naming
/// both counts, and its peers get peer_error). Not in place.
/// @param send_counts world size entries, summing to in's size.
/// @param recv_counts world size entries, summing to out's size.
/// @throws dpkit::invalid_argument (counts of the wrong length or sum, a
///         count to itself that differs from the one from itself,
///         overlapping buffers, a non-contiguous tensor, other memory
///         spaces: naming the value and the rank); dpkit::timeout_error,
///         mismatch_error, peer_error, communicator_error, dpkit::error (a
///         peer sent another count) as every collective.
template <transport C, tensor In, tensor Out>
void alltoallv(C& comm, const In& in, const std::vector<std::size_t>& send_counts, Out&& out,
               const std::vector<std::size_t>& recv_counts, const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  static_assert(std::is_same_v<T, tensor_value_t<Out>>, "dpkit: input and output tensors must have the same element type");
  const auto ctx = detail::make_context(comm, "alltoallv");
  const auto n = static_cast<std::size_t>(ctx.size);
  for (const auto* c : {&send_counts, &recv_counts})
    if (c->size() != n)
      ctx.invalid(std::string(c == &send_counts ? "send" : "receive") + " counts have " + std::to_string(c->size()) +
                  " entries, expected one per rank (" + std::to_string(n) + ")");
  const std::size_t sends = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
  const std::size_t recvs = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  if (sends != size_of(in))
    ctx.invalid("send counts sum to " + std::to_string(sends) + " elements but the input has " + std::to_string(size_of(in)));
  detail::static_check_space<C, In>();
  detail::static_check_space<C, Out>();
  detail::check_tensor(ctx, in, "input");
  detail::check_tensor(ctx, out, "output");
  detail::check_space(comm, ctx, space_of(in), "input");
  detail::check_space(comm, ctx, space_of(out), "output");
  if (space_of(in) != space_of(out)) ctx.invalid("input and output are in different memory spaces");
  if (recvs != size_of(out))
    ctx.invalid("receive counts sum to " + std::to_string(recvs) + " elements but the output has " +
                std::to_string(size_of(out)));
  const auto ur = static_cast<std::size_t>(ctx.rank);
  if (send_counts[ur] != recv_counts[ur])
    ctx.invalid("sends " + std::to_string(send_counts[ur]) + " elements to itself but expects " +
                std::to_string(recv_counts[ur]) + " from itself");
  const T* ip = as_span(in).data();
  T* op = as_span(out).data();
  if (sends > 0 && recvs > 0 && ip < op + recvs && op < ip + sends)
    ctx.invalid("input and output overlap (all-to-all is not in place)");
  // the count in the fingerprint is the world size: the ranks' totals differ
  detail::collective_scope<C> S(comm, ctx, detail::coll_kind::alltoallv, "pairwise", element_type_of_v<T>, n,
                                std::nullopt, -1, o);
  if (n == 1) {
    detail::make_local<C, T>(comm, ctx, space_of(in)).copy(op, ip, sends);
    return;
  }
  if (detail::is_checked_tag(S.tag_base())) detail::alltoallv_agree(comm, ctx, S, send_counts, recv_counts);
  const auto L = detail::make_local<C, T>(comm, ctx, space_of(in));
  detail::alltoall_pairwise(comm, ctx, S, L, ip, send_counts, detail::prefix_offsets(send_counts), op, recv_counts,
                            detail::prefix_offsets(recv_counts));
}

} // namespace dpkit
