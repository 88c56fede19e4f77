/// @file allreduce_ring.hpp
/// @brief Ring all-reduce: ring reduce-scatter followed by ring all-gather,
/// pipelined in segments (Patarasuk & Yuan; the algorithm of NCCL's and Gloo's
/// ring all-reduce).
///
/// Cost: 2(n-1) steps, each moving count/n elements per rank: bandwidth-optimal
/// (busbw = algbw * 2(n-1)/n approaches the link bandwidth), latency grows with
/// n. Each chunk of count/n elements is cut into segments of
/// options.segment_bytes; a segment is forwarded to the right neighbour as soon
/// as it is reduced (or received), so every link is busy while ranks reduce.
/// Scratch: options.pipeline_depth segments per rank, never a full-size
/// temporary. Out-of-place needs no copy of the input: the first step sends
/// from `in`, reductions write `out`.
///
/// Every rank ends with bitwise-identical results: each chunk's final value is
/// computed by exactly one rank and copied to the others.
#pragma once

#include "detail/allreduce_ring.hpp"

#include <vector>

namespace dpkit {

/// Out-of-place ring all-reduce: out[i] = op over all ranks of in[i].
///
/// @param comm a transport (dpkit::mpi, dpkit::inproc, dpkit::nccl, or yours).
/// @param in   tensor of `count` elements of any dpkit element type.
/// @param out  tensor of the same element type, the same count and memory space.
/// @param op   sum, prod, min, max, or avg (sum, then divided by the world size).
/// @param o    segment size (bytes), pipeline depth, timeout, tag.
/// Every rank must call with the same count, op and options.
/// @throws dpkit::invalid_argument (sizes differ, wrong memory space, bad world size)
/// @throws dpkit::timeout_error if a peer does not take part before the deadline.
template <transport C, tensor In, tensor Out>
void allreduce_ring(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                    const collective_options& o = {}) {
  using T = tensor_value_t<In>;
  const auto ctx = detail::make_context(comm, "allreduce_ring");
  const auto [ip, op_] = detail::resolve_inout(comm, ctx, in, out, size_of(in));
  detail::allreduce_ring_raw<C, T>(comm, ctx, ip, op_, size_of(in), op,
                                   o, detail::make_local<C, T>(comm, ctx, space_of(in)));
}

/// In-place ring all-reduce of tensor t (see the out-of-place overload).
template <transport C, tensor Tn>
void allreduce_ring(C& comm, Tn&& t, reduce_op op = reduce_op::sum, const collective_options& o = {}) {
  allreduce_ring(comm, t, t, op, o);
}

} // namespace dpkit
