/// @file reduce_f16c.hpp
/// @brief Internal: the f16 (binary16) reduction and avg-division loops with
/// x86's F16C conversions (vcvtph2ps / vcvtps2ph, 8 lanes in an AVX register),
/// chosen at run time when the CPU has F16C and AVX. Never include directly:
/// core/reduce_op.hpp calls it.
///
/// Results are bit-for-bit those of the portable loops in reduce_op.hpp
/// (f16 -> f32 exactly, one f32 operation, f32 -> f16 rounded to nearest,
/// ties to even, overflow to infinity), NaN included: F16C keeps a NaN's
/// payload where dpkit's scalar conversion gives the canonical quiet NaN
/// 0x7e00 (with the sign), so every NaN lane is rewritten to that. min and
/// max keep the portable loop's operand order (`b < a ? b : a`,
/// `a < b ? b : a`), which is what vminps/vmaxps do with (b, a). Measured:
/// 64 MiB of f16 summed in 6.7-8.0 ms here against 67 ms for the portable
/// loop (benchmarks/results/2026-12-02-memory-floor.md).
#pragma once

#include "../element.hpp"

#include "lane_op.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#include <cpuid.h>
#include <immintrin.h>
#define DPKIT_REDUCE_F16C 1
#endif

namespace dpkit::detail {

#ifdef DPKIT_REDUCE_F16C
/// True when the CPU has F16C and AVX and the OS saves the AVX registers
/// (CPUID leaf 1 ECX bits 29, 28 and 27, XCR0 bits 1 and 2). Asked through
/// CPUID because clang 14's __builtin_cpu_supports does not know "f16c".
inline bool cpu_has_f16c_avx() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  constexpr unsigned f16c = 1u << 29, avx = 1u << 28, osxsave = 1u << 27;
  if ((c & (f16c | avx | osxsave)) != (f16c | avx | osxsave)) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6u) == 0x6u; // XMM and YMM state enabled
}
#endif

/// True when the F16C loops run on this CPU (F16C and AVX present, and the
/// environment variable DPKIT_F16C is not "0", which tests and benchmarks use
/// to time or check the portable loop). Read once per process.
inline bool f16c_enabled() noexcept {
#ifdef DPKIT_REDUCE_F16C
  static const bool on = [] {
    if (const char* env = std::getenv("DPKIT_F16C"); env && env[0] == '0' && env[1] == '\0') return false;
    return cpu_has_f16c_avx();
  }();
  return on;
#else
  return false;
#endif
}

#ifdef DPKIT_REDUCE_F16C

// Eight f16 -> eight f32 (exact).
__attribute__((target("f16c,avx"))) inline __m256 f16c_load8(const std::uint16_t* p) noexcept {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Eight f32 -> eight f16, rounded to nearest even, each NaN lane made the
// canonical quiet NaN (0x7e00 with its sign) as f16::from_float makes it.
__attribute__((target("f16c,avx"))) inline __m128i f16c_round8(__m256 v) noexcept {
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
  const __m128i nan = _mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7c00)); // magnitudes are <= 0x7fff: a signed compare is exact
  const __m128i canon = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000))), _mm_set1_epi16(0x7e00));
  return _mm_or_si128(_mm_and_si128(nan, canon), _mm_andnot_si128(nan, h));
}
__attribute__((target("f16c,avx"))) inline void f16c_store8(std::uint16_t* p, __m256 v) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), f16c_round8(v));
}

// Eight f16 at a and b -> eight results a op b, rounded, in a register.
template <lane_op Op>
__attribute__((target("f16c,avx"))) inline __m128i f16c_apply8(const std::uint16_t* a, const std::uint16_t* b) noexcept {
  const __m256 x = f16c_load8(a), y = f16c_load8(b);
  __m256 r;
  if constexpr (Op == lane_op::sum) r = _mm256_add_ps(x, y);
  else if constexpr (Op == lane_op::prod) r = _mm256_mul_ps(x, y);
  // vminps(p, q) = p < q ? p : q; with (y, x): y < x ? y : x, the portable min's order (a NaN in either gives x).
  else if constexpr (Op == lane_op::min) r = _mm256_min_ps(y, x);
  // vmaxps(p, q) = p > q ? p : q; with (y, x): x < y ? y : x, the portable max's order.
  else r = _mm256_max_ps(y, x);
  return f16c_round8(r);
}

// One block loop per op (a template so each op's loop has no branch inside).
template <lane_op Op>
__attribute__((target("f16c,avx"))) inline void reduce_f16c_loop(std::uint16_t* dst, const std::uint16_t* a,
                                                                 const std::uint16_t* b, std::size_t m) noexcept {
  for (std::size_t i = 0; i < m; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), f16c_apply8<Op>(a + i, b + i));
}

template <lane_op Op>
__attribute__((target("f16c,avx"))) inline void reduce_f16c_into_two_nt_loop(std::uint16_t* out0, std::uint16_t* out1,
                                                                             const std::uint16_t* a,
                                                                             const std::uint16_t* b,
                                                                             std::size_t m) noexcept {
  for (std::size_t i = 0; i < m; i += 32) {
    const __m128i v[4] = {f16c_apply8<Op>(a + i, b + i), f16c_apply8<Op>(a + i + 8, b + i + 8),
                          f16c_apply8<Op>(a + i + 16, b + i + 16), f16c_apply8<Op>(a + i + 24, b + i + 24)};
    auto* d0 = reinterpret_cast<__m128i*>(out0 + i);
    auto* d1 = reinterpret_cast<__m128i*>(out1 + i);
    for (int k = 0; k < 4; ++k) _mm_stream_si128(d0 + k, v[k]);
    for (int k = 0; k < 4; ++k) _mm_stream_si128(d1 + k, v[k]);
  }
}

/// out0[i] = out1[i] = a[i] op b[i] for the first n - n % 32 elements
/// (returns that count), each 64-byte line of results computed in registers
/// and written to both outputs with non-temporal stores, unfenced (the
/// caller fences: store_fence). The two-rank direct all-reduce out of place
/// (collectives/shm/allreduce.hpp). out0 and out1 16-byte aligned; the four
/// ranges must not overlap.
inline std::size_t reduce_f16c_into_two_nt(lane_op op, std::uint16_t* out0, std::uint16_t* out1,
                                           const std::uint16_t* a, const std::uint16_t* b, std::size_t n) noexcept {
  const std::size_t m = n - n % 32;
  switch (op) {
  case lane_op::sum: reduce_f16c_into_two_nt_loop<lane_op::sum>(out0, out1, a, b, m); break;
  case lane_op::prod: reduce_f16c_into_two_nt_loop<lane_op::prod>(out0, out1, a, b, m); break;
  case lane_op::min: reduce_f16c_into_two_nt_loop<lane_op::min>(out0, out1, a, b, m); break;
  case lane_op::max: reduce_f16c_into_two_nt_loop<lane_op::max>(out0, out1, a, b, m); break;
  }
  return m;
}

/// dst[i] = a[i] op b[i] for the first n - n % 8 elements (returns that count;
/// the caller does the tail with the portable loop). dst may equal a or b;
/// otherwise the ranges must not overlap.
inline std::size_t reduce_f16c(lane_op op, std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* b,
                               std::size_t n) noexcept {
  const std::size_t m = n - n % 8;
  switch (op) {
  case lane_op::sum: reduce_f16c_loop<lane_op::sum>(dst, a, b, m); break;
  case lane_op::prod: reduce_f16c_loop<lane_op::prod>(dst, a, b, m); break;
  case lane_op::min: reduce_f16c_loop<lane_op::min>(dst, a, b, m); break;
  case lane_op::max: reduce_f16c_loop<lane_op::max>(dst, a, b, m); break;
  }
  return m;
}

/// data[i] = data[i] / divisor in f32, rounded once, for the first n - n % 8
/// elements (returns that count). divisor > 1.
__attribute__((target("f16c,avx"))) inline std::size_t divide_f16c(std::uint16_t* data, std::size_t n, float divisor) noexcept {
  const std::size_t m = n - n % 8;
  const __m256 d = _mm256_set1_ps(divisor);
  for (std::size_t i = 0; i < m; i += 8) f16c_store8(data + i, _mm256_div_ps(f16c_load8(data + i), d));
  return m;
}

#endif // DPKIT_REDUCE_F16C

} // namespace dpkit::detail
