// dpkit benchmarks: what the five *_perf programs know about their
// collective (name, busbw factor, buffer counts), the algorithms -A can pick
// (one table, in -A all order), and the one call that runs a collective with
// an algorithm. Everything a *_perf program needs is its `collective` value.
#pragma once

#include "bench_options.hpp"

#include <dpkit/dpkit.hpp>

#include <array>
#include <cstdint>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

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
  nothing,            ///< any dpkit transport (point-to-point algorithms)
  native_collectives, ///< dpkit::native_collectives<C> (MPI's own collectives)
  shared_memory,      ///< dpkit::shared_memory_transport<C> with a segment (one node)
  several_nodes       ///< dpkit::hierarchical_transport<C> whose ranks span nodes, some with several ranks
};

/// True when transport type C can offer `need`.
template <class C>
inline constexpr bool transport_has(transport_need need) noexcept {
  switch (need) {
  case transport_need::nothing: return true;
  case transport_need::native_collectives: return dpkit::native_collectives<C>;
  case transport_need::shared_memory: return dpkit::shared_memory_transport<C>;
  case transport_need::several_nodes: return dpkit::hierarchical_transport<C>;
  }
  return false;
}

/// True when this transport object offers `need` now (a shared segment exists
/// only when every rank is on one node).
template <class C>
bool transport_ready(C& comm, transport_need need) {
  if (need == transport_need::several_nodes) {
    if constexpr (dpkit::hierarchical_transport<C>) return comm.topology().hierarchical();
    else return false;
  }
  if (need != transport_need::shared_memory) return transport_has<C>(need);
  if constexpr (dpkit::shared_memory_transport<C>) return dpkit::detail::shm_available(comm);
  else return false;
}

/// One algorithm the *_perf programs can measure.
struct algorithm_entry {
  dpkit::algorithm algo;   ///< what is passed to the collective
  std::string_view label;  ///< -A spelling and the "# Algorithm:" line
  transport_need need;     ///< what the transport must offer
  unsigned collectives;    ///< bit (1 << collective) set when that collective has it
  bool in_all = true;      ///< measured by -A all (the shm variants are asked for by name)
};

/// Bit of collective k in algorithm_entry::collectives.
inline constexpr unsigned bit(collective k) noexcept { return 1u << static_cast<unsigned>(k); }
/// Every collective.
inline constexpr unsigned all_collectives = bit(collective::allreduce) | bit(collective::reduce_scatter) |
                                            bit(collective::allgather) | bit(collective::broadcast) |
                                            bit(collective::reduce);

/// The algorithms, in -A all order (each size is measured for all of them
/// back to back). run_collective hands the algorithm to dpkit's dispatcher,
/// so a new dpkit::algorithm (e.g. shm) is one line here, plus a
/// transport_need and its case in transport_has when it needs a capability.
inline constexpr std::array algorithm_table{
    algorithm_entry{dpkit::algorithm::ring, "ring", transport_need::nothing,
                    bit(collective::allreduce) | bit(collective::reduce_scatter) | bit(collective::allgather)},
    algorithm_entry{dpkit::algorithm::tree, "tree", transport_need::nothing,
                    bit(collective::allreduce) | bit(collective::broadcast) | bit(collective::reduce)},
    algorithm_entry{dpkit::algorithm::shm, "shm", transport_need::shared_memory, all_collectives},
    algorithm_entry{dpkit::algorithm::shm_one_shot, "shm1", transport_need::shared_memory, bit(collective::allreduce),
                    false},
    algorithm_entry{dpkit::algorithm::shm_two_shot, "shm2", transport_need::shared_memory, bit(collective::allreduce),
                    false},
    algorithm_entry{dpkit::algorithm::hierarchical, "hier", transport_need::several_nodes,
                    bit(collective::allreduce) | bit(collective::broadcast) | bit(collective::allgather) |
                        bit(collective::reduce_scatter)},
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

/// Where rank `rank`'s in-place result starts in op_args::buf (NCCL's
/// convention, which dpkit's dispatchers follow for every algorithm): a
/// reduce-scatter's at rank x count of the big buffer, everything else at 0.
inline constexpr std::size_t inplace_result_offset(collective k, int rank, std::size_t count) noexcept {
  return k == collective::reduce_scatter ? static_cast<std::size_t>(rank) * count : 0;
}

/// One dpkit element type per element size (uint8, float16, uint32, uint64):
/// what the data-movement collectives (all-gather, broadcast) are run on.
/// They copy bytes and never look at a value, so T and bits_of<T> take the
/// same path through dpkit's dispatcher (same element size, so the same
/// chunks and segments), and the *_perf programs of those two instantiate
/// four element types instead of ten (compile time).
template <class T>
using bits_of = std::conditional_t<
    sizeof(T) == 1, std::uint8_t,
    std::conditional_t<sizeof(T) == 2, dpkit::f16, std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;

/// x's spans as bits_of<T> (same bytes, same counts).
template <class T>
op_args<bits_of<T>> as_bits(const op_args<T>& x) noexcept {
  static_assert(sizeof(bits_of<T>) == sizeof(T) && alignof(bits_of<T>) >= alignof(T));
  using U = bits_of<T>;
  const auto cast = [](std::span<T> s) { return std::span<U>(reinterpret_cast<U*>(s.data()), s.size()); };
  return op_args<U>{cast(x.in), cast(x.out), cast(x.buf), x.count, x.op, x.root, x.opts, x.in_place};
}

/// Runs collective K once with algorithm a on x (in place or not, as x says),
/// through dpkit's dispatcher for that collective (dpkit::allreduce with
/// allreduce_policy{a}, dpkit::reduce_scatter, allgather, broadcast, reduce
/// with a): `native` is the transport's own collective, `automatic` dpkit's
/// choice. Throws dpkit::invalid_argument for an algorithm the collective or
/// transport does not have (the driver never selects one). K is a template
/// argument: each *_perf program instantiates its own collective only (over
/// every element type and transport), not all five (a fifth of the compile
/// time).
template <collective K, class C, class T>
void run_collective_as(C& comm, dpkit::algorithm a, const op_args<T>& x) {
  const std::span<const T> in = x.in;
  if constexpr (K == collective::allreduce) {
    if (x.in_place) dpkit::allreduce(comm, x.buf, x.op, dpkit::allreduce_policy{.algo = a}, x.opts);
    else dpkit::allreduce(comm, in, x.out, x.op, dpkit::allreduce_policy{.algo = a}, x.opts);
  } else if constexpr (K == collective::reduce_scatter) {
    if (x.in_place) dpkit::reduce_scatter(comm, x.buf, x.op, a, x.opts);
    else dpkit::reduce_scatter(comm, in, x.out, x.op, a, x.opts);
  } else if constexpr (K == collective::allgather) {
    if (x.in_place) dpkit::allgather(comm, x.buf, a, x.opts);
    else dpkit::allgather(comm, in, x.out, a, x.opts);
  } else if constexpr (K == collective::broadcast) {
    if (x.in_place) dpkit::broadcast(comm, x.buf, x.root, a, x.opts);
    else dpkit::broadcast(comm, in, x.out, x.root, a, x.opts);
  } else {
    static_assert(K == collective::reduce);
    if (x.in_place) dpkit::reduce(comm, x.buf, x.op, x.root, a, x.opts);
    else dpkit::reduce(comm, in, x.out, x.op, x.root, a, x.opts);
  }
}

/// run_collective_as, with all-gather and broadcast on bits_of<T> (see
/// there): a float all-gather and a uint32 one are the same call.
template <collective K, class C, class T>
void run_collective(C& comm, dpkit::algorithm a, const op_args<T>& x) {
  if constexpr (K == collective::allgather || K == collective::broadcast) run_collective_as<K>(comm, a, as_bits(x));
  else run_collective_as<K>(comm, a, x);
}

} // namespace dpkit_bench
