// dpkit benchmarks: what the five *_perf programs know about their
// collective (name, busbw factor, buffer counts), the algorithms -A can pick
// (one table, in -A all order), and the one call that runs a collective with
// an algorithm. Everything a *_perf program needs is its `collective` value.
#pragma once

#include "bench_options.hpp"

#include <dpkit/dpkit.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dpkit_bench {

/// "allreduce", "reduce_scatter", ... (the program is name + "_perf").
inline constexpr std::string_view collective_name(collective k) noexcept {
  switch (k) {
  case collective::allreduce: return "allreduce";
  case collective::reduce_scatter: return "reduce_scatter";
  case collective::allgather: return "allgather";
  case collective::broadcast: return "broadcast";
  case collective::reduce: return "reduce";
  }
  return "?";
}

/// nccl-tests' bus-bandwidth factor as printed in the header: all-reduce
/// "2(n-1)/n", reduce-scatter and all-gather "(n-1)/n", broadcast and reduce "1".
inline constexpr std::string_view busbw_formula(collective k) noexcept {
  switch (k) {
  case collective::allreduce: return "2(n-1)/n";
  case collective::reduce_scatter: case collective::allgather: return "(n-1)/n";
  case collective::broadcast: case collective::reduce: break;
  }
  return "1";
}

/// busbw = algbw x busbw_factor(k, n) (nccl-tests' getBw), for n >= 1 ranks.
inline constexpr double busbw_factor(collective k, int n) noexcept {
  switch (k) {
  case collective::allreduce: return 2.0 * (n - 1) / n;
  case collective::reduce_scatter: case collective::allgather: return static_cast<double>(n - 1) / n;
  case collective::broadcast: case collective::reduce: break;
  }
  return 1.0;
}

/// True for the collectives that reduce (take -o).
inline constexpr bool reduces(collective k) noexcept {
  return k == collective::allreduce || k == collective::reduce_scatter || k == collective::reduce;
}
/// True for the collectives with a root (take -r).
inline constexpr bool rooted(collective k) noexcept { return k == collective::broadcast || k == collective::reduce; }

/// Element counts of a collective at total element count `total` (size /
/// typesize) on n ranks, as nccl-tests' getCollByteCount: send and receive
/// buffer lengths and the count the collective's API takes.
struct coll_counts {
  std::size_t send, recv, param;
};
/// See coll_counts; n >= 1.
inline coll_counts counts_for(collective k, std::size_t total, int n) {
  const std::size_t nn = static_cast<std::size_t>(n);
  switch (k) {
  case collective::reduce_scatter: return {(total / nn) * nn, total / nn, total / nn};
  case collective::allgather: return {total / nn, (total / nn) * nn, total / nn};
  case collective::allreduce: case collective::broadcast: case collective::reduce: break;
  }
  return {total, total, total};
}

/// What a transport must offer for an algorithm to run on it.
enum class transport_need {
  nothing,           ///< any dpkit transport (point-to-point algorithms)
  native_collectives ///< dpkit::native_collectives<C> (MPI's own collectives)
};

/// True when transport C offers `need`.
template <class C>
inline constexpr bool transport_has(transport_need need) noexcept {
  return need == transport_need::nothing || dpkit::native_collectives<C>;
}

/// One algorithm the *_perf programs can measure.
struct algorithm_entry {
  dpkit::algorithm algo;   ///< what is passed to the collective
  std::string_view label;  ///< -A spelling and the "# Algorithm:" line
  transport_need need;     ///< what the transport must offer
  unsigned collectives;    ///< bit (1 << collective) set when that collective has it
};

/// Bit of collective k in algorithm_entry::collectives.
inline constexpr unsigned bit(collective k) noexcept { return 1u << static_cast<unsigned>(k); }
/// Every collective.
inline constexpr unsigned all_collectives = bit(collective::allreduce) | bit(collective::reduce_scatter) |
                                            bit(collective::allgather) | bit(collective::broadcast) |
                                            bit(collective::reduce);

/// The algorithms, in -A all order (each size is measured for all of them
/// back to back). A new algorithm is one line here plus, until dpkit has one
/// dispatcher per collective, its case in run_collective below.
inline constexpr std::array algorithm_table{
    algorithm_entry{dpkit::algorithm::ring, "ring", transport_need::nothing,
                    bit(collective::allreduce) | bit(collective::reduce_scatter) | bit(collective::allgather)},
    algorithm_entry{dpkit::algorithm::tree, "tree", transport_need::nothing,
                    bit(collective::allreduce) | bit(collective::broadcast) | bit(collective::reduce)},
    algorithm_entry{dpkit::algorithm::native, "native", transport_need::native_collectives, all_collectives},
    algorithm_entry{dpkit::algorithm::automatic, "auto", transport_need::nothing, all_collectives},
};

/// The table entry of `a` (every dpkit::algorithm the table knows), or nullopt.
inline constexpr std::optional<algorithm_entry> find_algorithm(dpkit::algorithm a) noexcept {
  for (const auto& e : algorithm_table)
    if (e.algo == a) return e;
  return std::nullopt;
}

/// The -A label of `a` ("auto" for automatic).
inline constexpr std::string_view algorithm_label(dpkit::algorithm a) noexcept {
  const auto e = find_algorithm(a);
  return e ? e->label : dpkit::algorithm_name(a);
}

/// What one collective call gets. Spans point into buffers allocated once.
template <class T>
struct op_args {
  std::span<T> in;   ///< out-of-place input (send count elements)
  std::span<T> out;  ///< out-of-place output (receive count elements)
  std::span<T> buf;  ///< in-place buffer (the larger of the two counts)
  std::size_t count; ///< the per-rank count the collective's API takes (nccl-tests' count column)
  dpkit::reduce_op op;
  int root; ///< -1 for rootless collectives
  dpkit::collective_options opts;
  bool in_place;
};

/// Where rank `rank`'s in-place result starts in op_args::buf. NCCL's
/// convention puts a reduce-scatter result at rank x count of the big buffer;
/// MPI_Reduce_scatter_block with MPI_IN_PLACE (what mpi::native_reduce_scatter
/// does for in == out) leaves it at offset 0. Everything else starts at 0.
inline std::size_t inplace_result_offset(collective k, dpkit::algorithm a, int rank, std::size_t count) noexcept {
  if (k != collective::reduce_scatter || a == dpkit::algorithm::native) return 0;
  return static_cast<std::size_t>(rank) * count;
}

namespace detail {

/// The transport's native collective k on x (MPI_Allreduce, ...).
template <class C, class T>
void run_native(collective k, C& c, const op_args<T>& x) {
  constexpr auto t = dpkit::element_type_of_v<T>;
  T* out = x.in_place ? x.buf.data() : x.out.data();
  const T* in = x.in_place ? out : x.in.data();
  switch (k) {
  case collective::allreduce: c.native_allreduce(in, out, x.count, t, x.op); return;
  case collective::reduce_scatter: c.native_reduce_scatter(in, out, x.count, t, x.op); return;
  case collective::allgather:
    // in place: the rank's chunk already sits at offset rank x count (NCCL's convention)
    if (x.in_place) in = x.buf.data() + static_cast<std::size_t>(c.rank()) * x.count;
    c.native_allgather(in, out, x.count, t);
    return;
  case collective::broadcast: c.native_broadcast(in, out, x.count, t, x.root); return;
  case collective::reduce: c.native_reduce(in, out, x.count, t, x.op, x.root); return;
  }
}

} // namespace detail

/// Runs collective k once with algorithm a on x (in place or not, as x says).
/// `automatic` is dpkit::allreduce's default policy for all-reduce and the
/// collective's only dpkit algorithm for the others. Throws std::logic_error
/// for an (algorithm, collective, transport) the table does not offer (the
/// driver never selects one).
template <class C, class T>
void run_collective(collective k, C& comm, dpkit::algorithm a, const op_args<T>& x) {
  using dpkit::algorithm;
  if (a == algorithm::native) {
    if constexpr (dpkit::native_collectives<C>) detail::run_native(k, comm, x);
    else throw std::logic_error("run_collective: this transport has no native collectives");
    return;
  }
  // In place, the one buffer is both input and output (dpkit's one-buffer
  // overloads forward to exactly that), except for reduce-scatter and
  // all-gather, whose in-place layout (NCCL's) has its own overloads.
  const std::span<const T> in = x.in_place ? std::span<const T>(x.buf) : std::span<const T>(x.in);
  const std::span<T> out = x.in_place ? x.buf : x.out;
  switch (k) {
  case collective::allreduce:
    if (a == algorithm::ring) dpkit::allreduce_ring(comm, in, out, x.op, x.opts);
    else if (a == algorithm::tree) dpkit::allreduce_tree(comm, in, out, x.op, x.opts);
    else dpkit::allreduce(comm, in, out, x.op, dpkit::allreduce_policy{}, x.opts);
    return;
  case collective::reduce_scatter:
    if (x.in_place) dpkit::reduce_scatter_ring(comm, x.buf, x.op, x.opts);
    else dpkit::reduce_scatter_ring(comm, in, out, x.op, x.opts);
    return;
  case collective::allgather:
    if (x.in_place) dpkit::allgather_ring(comm, x.buf, x.opts);
    else dpkit::allgather_ring(comm, in, out, x.opts);
    return;
  case collective::broadcast: dpkit::broadcast_tree(comm, in, out, x.root, x.opts); return;
  case collective::reduce: dpkit::reduce_tree(comm, in, out, x.op, x.root, x.opts); return;
  }
}

} // namespace dpkit_bench
