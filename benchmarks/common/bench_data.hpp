// dpkit benchmarks: deterministic input data and independent expected results
// for the -c data check.
//
// Every input element is a small non-negative integer computed from (rank,
// global index, seed), chosen so that every partial reduction any algorithm
// may form is exactly representable in every element type (half: integers up
// to 2048, bfloat16: up to 256, int8: up to 127). Results are then exact and
// order-independent, so the expected value is computed here with integer
// arithmetic and compared bit for bit.
//   sum, avg:  v in [0, m) with m = clamp(120 / nranks, 1, 8): sums <= 120;
//              avg then divides as ncclAvg / dpkit::divide_host do.
//   prod:      2 on exactly one rank per element, 1 elsewhere: product 2.
//   min, max:  v in [0, 100).
//   allgather, broadcast: v in [0, 100) (no arithmetic).
// prepare_inputs / expected_result / result_span apply this to one collective
// call's buffers (bench_collectives.hpp's op_args).
#pragma once

#include "bench_collectives.hpp"
#include "bench_options.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace dpkit_bench {

/// Byte every output element is set to before a checked run, so a collective
/// that leaves its output untouched is caught (0xA5.. is no small integer in
/// any element type).
inline constexpr unsigned char sentinel_byte = 0xA5;

/// The input value of element `index` on `rank` (see the file comment).
struct value_gen {
  dpkit::reduce_op op = dpkit::reduce_op::sum;
  bool reduces = true; // false: allgather / broadcast
  int nranks = 1;
  std::uint64_t seed = 0;

  std::int64_t operator()(int rank, std::size_t index) const noexcept {
    const std::uint64_t k = static_cast<std::uint64_t>(rank);
    const std::uint64_t mix = index + 3 * k + 7 * seed;
    if (!reduces) return static_cast<std::int64_t>(mix % 100);
    switch (op) {
    case dpkit::reduce_op::prod:
      return (index + k + seed) % static_cast<std::uint64_t>(nranks) == 0 ? 2 : 1;
    case dpkit::reduce_op::min:
    case dpkit::reduce_op::max:
      return static_cast<std::int64_t>(mix % 100);
    case dpkit::reduce_op::sum:
    case dpkit::reduce_op::avg:
      break;
    }
    std::int64_t m = 120 / nranks;
    m = m < 1 ? 1 : (m > 8 ? 8 : m);
    return static_cast<std::int64_t>(mix % static_cast<std::uint64_t>(m));
  }

  /// The exact reduction over all ranks of element `index` (before the avg division).
  std::int64_t reduced(std::size_t index) const noexcept {
    std::int64_t acc = (*this)(0, index);
    for (int r = 1; r < nranks; ++r) {
      const std::int64_t v = (*this)(r, index);
      switch (op) {
      case dpkit::reduce_op::sum: case dpkit::reduce_op::avg: acc += v; break;
      case dpkit::reduce_op::prod: acc *= v; break;
      case dpkit::reduce_op::min: acc = v < acc ? v : acc; break;
      case dpkit::reduce_op::max: acc = v > acc ? v : acc; break;
      }
    }
    return acc;
  }
};

/// A small integer as element type T (exact for the values value_gen makes).
template <class T>
inline T make_value(std::int64_t v) noexcept {
  if constexpr (std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

/// dst[i] = gen(rank, first + i).
template <class T>
inline void fill_input(std::span<T> dst, const value_gen& gen, int rank, std::size_t first = 0) {
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = make_value<T>(gen(rank, first + i));
}

/// dst[i] = reduction over ranks of element first + i (avg divided as dpkit does).
template <class T>
inline void fill_reduced(std::span<T> dst, const value_gen& gen, std::size_t first = 0) {
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = make_value<T>(gen.reduced(first + i));
  if (gen.op == dpkit::reduce_op::avg) dpkit::divide_host(dst.data(), dst.size(), static_cast<std::size_t>(gen.nranks));
}

/// Sets every byte of dst to sentinel_byte.
template <class T>
inline void fill_sentinel(std::span<T> dst) {
  if (!dst.empty()) std::memset(static_cast<void*>(dst.data()), sentinel_byte, dst.size_bytes());
}

/// Number of elements whose bit patterns differ.
template <class T>
inline std::int64_t count_wrong(std::span<const T> got, std::span<const T> want) {
  using U = std::conditional_t<sizeof(T) == 1, std::uint8_t,
                               std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
  static_assert(sizeof(U) == sizeof(T));
  std::int64_t wrong = 0;
  const std::size_t n = got.size() < want.size() ? got.size() : want.size();
  for (std::size_t i = 0; i < n; ++i) {
    U a, b;
    std::memcpy(&a, got.data() + i, sizeof(U));
    std::memcpy(&b, want.data() + i, sizeof(U));
    wrong += a != b;
  }
  return wrong + static_cast<std::int64_t>(got.size() > want.size() ? got.size() - want.size() : want.size() - got.size());
}

/// Writes rank `rank`'s input of collective k into x's buffers; with
/// `sentinel`, also poisons what the collective must write (a collective that
/// leaves its output untouched then shows as #wrong).
template <class T>
void prepare_inputs(collective k, const op_args<T>& x, const value_gen& g, int rank, bool sentinel) {
  const std::size_t cnt = x.count;
  switch (k) {
  case collective::allreduce:
  case collective::reduce:
  case collective::reduce_scatter:
    if (x.in_place) {
      fill_input(x.buf, g, rank);
    } else {
      fill_input(x.in, g, rank);
      if (sentinel) fill_sentinel(x.out);
    }
    break;
  case collective::allgather:
    if (x.in_place) {
      if (sentinel) fill_sentinel(x.buf);
      fill_input(x.buf.subspan(static_cast<std::size_t>(rank) * cnt, cnt), g, rank);
    } else {
      fill_input(x.in, g, rank);
      if (sentinel) fill_sentinel(x.out);
    }
    break;
  case collective::broadcast: {
    auto dst = x.in_place ? x.buf : x.in;
    if (rank == x.root) fill_input(dst, g, x.root);
    else if (sentinel) fill_sentinel(dst);
    if (!x.in_place && sentinel) fill_sentinel(x.out);
    break;
  }
  }
}

/// Writes rank `rank`'s expected result of collective k (count = x.count,
/// nranks = g.nranks) into `e`, which holds at least count x nranks elements;
/// returns its length (0: nothing to check on this rank, a reduce's non-root).
template <class T>
std::size_t expected_result(collective k, T* e, std::size_t count, int root, const value_gen& g, int rank) {
  switch (k) {
  case collective::allreduce: fill_reduced(std::span<T>(e, count), g); return count;
  case collective::reduce:
    if (rank != root) return 0;
    fill_reduced(std::span<T>(e, count), g);
    return count;
  case collective::reduce_scatter:
    fill_reduced(std::span<T>(e, count), g, static_cast<std::size_t>(rank) * count);
    return count;
  case collective::allgather:
    for (int r = 0; r < g.nranks; ++r) fill_input(std::span<T>(e + static_cast<std::size_t>(r) * count, count), g, r);
    return count * static_cast<std::size_t>(g.nranks);
  case collective::broadcast: fill_input(std::span<T>(e, count), g, root); return count;
  }
  return 0;
}

/// The `len` elements of x where rank `rank`'s result of collective k lies
/// (the output, or in place see inplace_result_offset).
template <class T>
std::span<const T> result_span(collective k, const op_args<T>& x, int rank, std::size_t len) {
  if (!x.in_place) return std::span<const T>(x.out.data(), len);
  return std::span<const T>(x.buf.data() + inplace_result_offset(k, rank, x.count), len);
}

} // namespace dpkit_bench
