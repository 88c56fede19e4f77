/// @file reduce_op.hpp
/// @brief Reduction operators (sum prod min max avg) and the host reduction
/// loops every algorithm uses.
///
/// Semantics follow NCCL's ncclRedOp_t: avg is a sum followed by a division by
/// the world size (integer division, truncating, for integer types). f16 and
/// bf16 are computed in f32 and rounded once per pairwise step (round to
/// nearest even). The loops are written so g++/clang vectorize them at -O2
/// (contiguous, __restrict, no early exits; check with -fopt-info-vec).
#pragma once

#include "detail/reduce_bf16_avx2.hpp"
#include "detail/reduce_f16c.hpp"
#include "element.hpp"
#include "errors.hpp"

#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

namespace dpkit {

/// A reduction operator. avg = sum, then divide by the world size.
enum class reduce_op : std::uint8_t { sum, prod, min, max, avg };

/// nccl-tests' name of an op: "sum", "prod", "min", "max", "avg".
inline constexpr std::string_view reduce_op_name(reduce_op op) noexcept {
  switch (op) {
  case reduce_op::sum: return "sum";
  case reduce_op::prod: return "prod";
  case reduce_op::min: return "min";
  case reduce_op::max: return "max";
  case reduce_op::avg: return "avg";
  }
  return "?";
}

/// Prints reduce_op_name(op).
inline std::ostream& operator<<(std::ostream& os, reduce_op op) { return os << reduce_op_name(op); }

/// Parses "sum" | "prod" | "min" | "max" | "avg".
/// @throws dpkit::invalid_argument naming the string otherwise.
inline reduce_op parse_reduce_op(std::string_view s) {
  for (auto op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg})
    if (reduce_op_name(op) == s) return op;
  throw invalid_argument("unknown reduce op '" + std::string(s) + "' (expected sum, prod, min, max or avg)");
}

namespace detail {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<std::remove_cv_t<T>, f16> || std::is_same_v<std::remove_cv_t<T>, bf16>;

// Pairwise combine of two values of the (non-16-bit) type T.
template <reduce_op Op, class T>
inline T combine(T a, T b) noexcept {
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) return static_cast<T>(a + b);
  else if constexpr (Op == reduce_op::prod) return static_cast<T>(a * b);
  else if constexpr (Op == reduce_op::min) return b < a ? b : a;
  else return a < b ? b : a;
}

// Elements per block: the inner loops below have this compile-time trip
// count, which g++'s -O2 "very cheap" vectorizer accepts (it rejects loops
// that need a scalar epilogue); the tail is a separate scalar loop.
template <class T>
inline constexpr std::size_t block_elems = 128 / sizeof(T);

template <reduce_op Op, class T>
inline T combine_any(T a, T b) noexcept {
  if constexpr (is_half_v<T>) {
    using U = std::remove_cv_t<T>;
    return U::from_bits(U::from_float(combine<Op>(U::to_float(a.bits), U::to_float(b.bits))));
  } else {
    return combine<Op>(a, b);
  }
}

template <reduce_op Op, class T>
inline void reduce_loop(T* __restrict dst, const T* __restrict a, const T* __restrict b, std::size_t n) noexcept {
  constexpr std::size_t B = block_elems<T>;
  const std::size_t nb = n / B;
  for (std::size_t blk = 0; blk < nb; ++blk) {
    T* __restrict d = dst + blk * B;
    const T* __restrict x = a + blk * B;
    const T* __restrict y = b + blk * B;
    for (std::size_t k = 0; k < B; ++k) d[k] = combine_any<Op>(x[k], y[k]);
  }
  for (std::size_t i = nb * B; i < n; ++i) dst[i] = combine_any<Op>(a[i], b[i]);
}

// In-place variant (dst may alias a): dst[i] = dst[i] op b[i].
template <reduce_op Op, class T>
inline void reduce_inplace_loop(T* __restrict dst, const T* __restrict b, std::size_t n) noexcept {
  constexpr std::size_t B = block_elems<T>;
  const std::size_t nb = n / B;
  for (std::size_t blk = 0; blk < nb; ++blk) {
    T* __restrict d = dst + blk * B;
    const T* __restrict y = b + blk * B;
    for (std::size_t k = 0; k < B; ++k) d[k] = combine_any<Op>(d[k], y[k]);
  }
  for (std::size_t i = nb * B; i < n; ++i) dst[i] = combine_any<Op>(dst[i], b[i]);
}

// The raw bits of an f16 or bf16 array (each is a struct of one std::uint16_t).
inline std::uint16_t* f16_bits(f16* p) noexcept { return reinterpret_cast<std::uint16_t*>(p); }
inline const std::uint16_t* f16_bits(const f16* p) noexcept { return reinterpret_cast<const std::uint16_t*>(p); }
inline std::uint16_t* f16_bits(bf16* p) noexcept { return reinterpret_cast<std::uint16_t*>(p); }
inline const std::uint16_t* f16_bits(const bf16* p) noexcept { return reinterpret_cast<const std::uint16_t*>(p); }

/// The vector loops' reduction for op (avg sums; its division is separate).
constexpr lane_op lane_op_of(reduce_op op) noexcept {
  return op == reduce_op::prod ? lane_op::prod
         : op == reduce_op::min ? lane_op::min
         : op == reduce_op::max ? lane_op::max
                                : lane_op::sum;
}

/// dst[i] = a[i] op b[i] for f16 (F16C) or bf16 (AVX2) on the vector loop,
/// for as many leading elements as it takes (a multiple of its lanes);
/// returns that count, 0 where the loop is off (no such CPU, DPKIT_F16C=0,
/// DPKIT_BF16_AVX2=0) or not compiled. The portable loop's bits.
template <class U>
std::size_t reduce_half_vector(lane_op op, U* dst, const U* a, const U* b, std::size_t n) noexcept {
#ifdef DPKIT_REDUCE_F16C
  if constexpr (std::is_same_v<U, f16>)
    if (f16c_enabled()) return reduce_f16c(op, f16_bits(dst), f16_bits(a), f16_bits(b), n);
#endif
#ifdef DPKIT_REDUCE_BF16_AVX2
  if constexpr (std::is_same_v<U, bf16>)
    if (bf16_avx2_enabled()) return reduce_bf16_avx2(op, f16_bits(dst), f16_bits(a), f16_bits(b), n);
#endif
  (void)op, (void)dst, (void)a, (void)b, (void)n;
  return 0;
}

/// data[i] = data[i] / divisor (f32, rounded once) on the vector loop, as
/// reduce_half_vector; returns the count done.
template <class U>
std::size_t divide_half_vector(U* data, std::size_t n, float divisor) noexcept {
#ifdef DPKIT_REDUCE_F16C
  if constexpr (std::is_same_v<U, f16>)
    if (f16c_enabled()) return divide_f16c(f16_bits(data), n, divisor);
#endif
#ifdef DPKIT_REDUCE_BF16_AVX2
  if constexpr (std::is_same_v<U, bf16>)
    if (bf16_avx2_enabled()) return divide_bf16_avx2(f16_bits(data), n, divisor);
#endif
  (void)data, (void)n, (void)divisor;
  return 0;
}

/// out0[i] = out1[i] = a[i] op b[i] on the vector loop, each 64-byte line
/// streamed to both outputs with non-temporal stores (unfenced), for the
/// leading n - n % 32 elements; returns that count, or -1 (size_t) where the
/// loop is off or not compiled. out0 and out1 16-byte aligned; the four
/// ranges must not overlap.
template <class U>
std::size_t half_into_two_nt_vector(lane_op op, U* out0, U* out1, const U* a, const U* b, std::size_t n) noexcept {
#ifdef DPKIT_REDUCE_F16C
  if constexpr (std::is_same_v<U, f16>)
    if (f16c_enabled()) return reduce_f16c_into_two_nt(op, f16_bits(out0), f16_bits(out1), f16_bits(a), f16_bits(b), n);
#endif
#ifdef DPKIT_REDUCE_BF16_AVX2
  if constexpr (std::is_same_v<U, bf16>)
    if (bf16_avx2_enabled())
      return reduce_bf16_avx2_into_two_nt(op, f16_bits(out0), f16_bits(out1), f16_bits(a), f16_bits(b), n);
#endif
  (void)op, (void)out0, (void)out1, (void)a, (void)b, (void)n;
  return static_cast<std::size_t>(-1);
}

} // namespace detail

/// Host reduction: dst[i] = a[i] op b[i] for i in [0, n), n in elements.
/// dst may equal a (in place) or b; otherwise the ranges must not overlap.
/// For reduce_op::avg this is the sum step (the division is finalize_avg's).
/// f16/bf16 are combined in f32 and rounded to nearest even. f16 runs on
/// F16C+AVX where the CPU has them (detail/reduce_f16c.hpp), bf16 on AVX2
/// (detail/reduce_bf16_avx2.hpp); same bits as the portable loops.
template <element T>
inline void reduce_host(T* dst, const T* a, const T* b, std::size_t n, reduce_op op) noexcept {
  if constexpr (detail::is_half_v<T>) {
    // dst == b runs as dst = b op a, the portable in-place loop's operand order (min/max with a NaN
    // return their first operand).
    const bool swap = dst == b && dst != a;
    const std::size_t done = detail::reduce_half_vector(detail::lane_op_of(op), dst, swap ? b : a, swap ? a : b, n);
    dst += done;
    a += done;
    b += done;
    n -= done;
  }
  auto run = [&]<reduce_op Op>() {
    if (dst == a) detail::reduce_inplace_loop<Op>(dst, b, n);
    else if (dst == b) detail::reduce_inplace_loop<Op>(dst, a, n); // all ops commute
    else detail::reduce_loop<Op>(dst, a, b, n);
  };
  switch (op) {
  case reduce_op::sum: case reduce_op::avg: run.template operator()<reduce_op::sum>(); break;
  case reduce_op::prod: run.template operator()<reduce_op::prod>(); break;
  case reduce_op::min: run.template operator()<reduce_op::min>(); break;
  case reduce_op::max: run.template operator()<reduce_op::max>(); break;
  }
}

/// Host: divides n elements in place by `divisor` (the world size) to finish an
/// avg reduction. Integer types truncate (as ncclAvg); floats multiply by
/// nothing else, f16/bf16 divide in f32 and round once (f16 on F16C+AVX and
/// bf16 on AVX2 where the CPU has them, same bits).
template <element T>
inline void divide_host(T* data, std::size_t n, std::size_t divisor) noexcept {
  if (divisor <= 1) return;
  using U = std::remove_cv_t<T>;
  if constexpr (detail::is_half_v<U>) {
    const std::size_t done = detail::divide_half_vector(data, n, static_cast<float>(divisor));
    data += done;
    n -= done;
  }
  constexpr std::size_t B = detail::block_elems<U>;
  auto one = [divisor](U x) noexcept -> U {
    if constexpr (detail::is_half_v<U>) return U::from_bits(U::from_float(U::to_float(x.bits) / static_cast<float>(divisor)));
    else return static_cast<U>(x / static_cast<U>(divisor));
  };
  const std::size_t nb = n / B;
  for (std::size_t blk = 0; blk < nb; ++blk) {
    U* __restrict d = data + blk * B;
    for (std::size_t k = 0; k < B; ++k) d[k] = one(d[k]);
  }
  for (std::size_t i = nb * B; i < n; ++i) data[i] = one(data[i]);
}

} // namespace dpkit
