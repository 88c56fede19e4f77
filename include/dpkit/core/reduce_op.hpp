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

} // namespace detail

/// Host reduction: dst[i] = a[i] op b[i] for i in [0, n), n in elements.
/// dst may equal a (in place) or b; otherwise the ranges must not overlap.
/// For reduce_op::avg this is the sum step (the division is finalize_avg's).
/// f16/bf16 are combined in f32 and rounded to nearest even. f16 runs on
/// F16C+AVX where the CPU has them (detail/reduce_f16c.hpp), bf16 on AVX2
/// (detail/reduce_bf16_avx2.hpp); same bits as the portable loops.
template <element T>
inline void reduce_host(T* dst, const T* a, const T* b, std::size_t n, reduce_op op) noexcept {
#ifdef DPKIT_REDUCE_F16C
  if constexpr (std::is_same_v<std::remove_cv_t<T>, f16>) {
    if (n >= 8 && detail::f16c_enabled()) {
      const detail::f16c_op fop = op == reduce_op::prod  ? detail::f16c_op::prod
                                  : op == reduce_op::min ? detail::f16c_op::min
                                  : op == reduce_op::max ? detail::f16c_op::max
                                                         : detail::f16c_op::sum;
      // dst == b runs as dst = b op a, the portable in-place loop's operand order (min/max with a NaN
      // return their first operand).
      const bool swap = dst == b && dst != a;
      const std::size_t done = detail::reduce_f16c(fop, detail::f16_bits(dst), detail::f16_bits(swap ? b : a),
                                                   detail::f16_bits(swap ? a : b), n);
      dst += done;
      a += done;
      b += done;
      n -= done;
    }
  }
#endif
#ifdef DPKIT_REDUCE_BF16_AVX2
  if constexpr (std::is_same_v<std::remove_cv_t<T>, bf16>) {
    if (n >= 16 && detail::bf16_avx2_enabled()) {
      const detail::bf16_avx2_op bop = op == reduce_op::prod  ? detail::bf16_avx2_op::prod
                                       : op == reduce_op::min ? detail::bf16_avx2_op::min
                                       : op == reduce_op::max ? detail::bf16_avx2_op::max
                                                              : detail::bf16_avx2_op::sum;
      // dst == b runs as dst = b op a, as for f16 above.
      const bool swap = dst == b && dst != a;
      const std::size_t done = detail::reduce_bf16_avx2(bop, detail::f16_bits(dst), detail::f16_bits(swap ? b : a),
                                                        detail::f16_bits(swap ? a : b), n);
      dst += done;
      a += done;
      b += done;
      n -= done;
    }
  }
#endif
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
#ifdef DPKIT_REDUCE_F16C
  if constexpr (std::is_same_v<U, f16>) {
    if (n >= 8 && detail::f16c_enabled()) {
      const std::size_t done = detail::divide_f16c(detail::f16_bits(data), n, static_cast<float>(divisor));
      data += done;
      n -= done;
    }
  }
#endif
#ifdef DPKIT_REDUCE_BF16_AVX2
  if constexpr (std::is_same_v<U, bf16>) {
    if (n >= 16 && detail::bf16_avx2_enabled()) {
      const std::size_t done = detail::divide_bf16_avx2(detail::f16_bits(data), n, static_cast<float>(divisor));
      data += done;
      n -= done;
    }
  }
#endif
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
