/// @file reduce_bf16_avx2.hpp
/// @brief Internal: the bf16 (bfloat16) reduction and avg-division loops in
/// AVX2 (16 lanes per 256-bit register), chosen at run time when the CPU has
/// AVX2. Never include directly: core/reduce_op.hpp calls it.
///
/// Results are bit-for-bit those of the portable loops in reduce_op.hpp:
/// bf16 -> f32 exactly (the bits shifted up 16), one f32 operation, f32 ->
/// bf16 rounded to nearest, ties to even, as bf16::from_float does it in
/// integers (x + 0x7fff + lsb, then the high half; a NaN keeps its high half
/// with the quiet bit set). min and max keep the portable loop's operand
/// order (`b < a ? b : a`, `a < b ? b : a`), which is what vminps/vmaxps do
/// with (b, a). Where both inputs are NaN, x86 returns the first operand's
/// payload, and which operand is first in the portable loop is the
/// compiler's choice: both are quiet NaNs of one of the inputs.
///
/// Why: GCC vectorises the portable bf16 loop with 16-byte vectors at
/// baseline x86-64, and a bf16 all-reduce of 64 MiB took 1.4-1.9x float's
/// time at the same byte count (benchmarks/results/2026-12-02-f16c-reduction.md):
/// per byte bf16 has twice float's elements to convert and add.
#pragma once

#include "lane_op.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#include <cpuid.h>
#include <immintrin.h>
#define DPKIT_REDUCE_BF16_AVX2 1
#endif

namespace dpkit::detail {


#ifdef DPKIT_REDUCE_BF16_AVX2
/// True when the CPU has AVX2 and the OS saves the AVX registers (CPUID leaf
/// 7 EBX bit 5; leaf 1 ECX bits 28 and 27; XCR0 bits 1 and 2).
inline bool cpu_has_avx2() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  constexpr unsigned avx = 1u << 28, osxsave = 1u << 27;
  if ((c & (avx | osxsave)) != (avx | osxsave)) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x6u) != 0x6u) return false; // XMM and YMM state enabled
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & (1u << 5)) != 0;
}
#endif

/// True when the AVX2 bf16 loops run on this CPU (AVX2 present, and the
/// environment variable DPKIT_BF16_AVX2 is not "0", which tests and
/// benchmarks use to time or check the portable loop). Read once per process.
inline bool bf16_avx2_enabled() noexcept {
#ifdef DPKIT_REDUCE_BF16_AVX2
  static const bool on = [] {
    if (const char* env = std::getenv("DPKIT_BF16_AVX2"); env && env[0] == '0' && env[1] == '\0') return false;
    return cpu_has_avx2();
  }();
  return on;
#else
  return false;
#endif
}

#ifdef DPKIT_REDUCE_BF16_AVX2

// Eight f32 (as their bits) -> eight bf16 in the low half of each 32-bit
// lane: round to nearest even, a NaN lane kept with the quiet bit set
// (bf16::from_float's rules, in the same integer arithmetic).
__attribute__((target("avx2"))) inline __m256i bf16_avx2_round(__m256 v) noexcept {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i high = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  // magnitudes are at most 0x7fffffff: a signed compare is exact
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

// x op y on eight f32 lanes, in the portable loop's operand order.
template <lane_op Op>
__attribute__((target("avx2"))) inline __m256 bf16_avx2_apply(__m256 x, __m256 y) noexcept {
  if constexpr (Op == lane_op::sum) return _mm256_add_ps(x, y);
  else if constexpr (Op == lane_op::prod) return _mm256_mul_ps(x, y);
  // vminps(p, q) = p < q ? p : q; with (y, x): y < x ? y : x, the portable min's order (a NaN in either gives x).
  else if constexpr (Op == lane_op::min) return _mm256_min_ps(y, x);
  // vmaxps(p, q) = p > q ? p : q; with (y, x): x < y ? y : x, the portable max's order.
  else return _mm256_max_ps(y, x);
}

// Sixteen bf16 at a and b -> sixteen results a op b, in a register. Each
// 128-bit lane's eight bf16 are widened to f32 by interleaving with zeros
// (unpacklo: elements 0-3, unpackhi: 4-7 of the lane), and packed back in
// the same lane order (packus of values 0..0xffff is exact).
template <lane_op Op>
__attribute__((target("avx2"))) inline __m256i bf16_avx2_line16(const std::uint16_t* a, const std::uint16_t* b) noexcept {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256 lo = bf16_avx2_apply<Op>(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, va)),
                                        _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, vb)));
  const __m256 hi = bf16_avx2_apply<Op>(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, va)),
                                        _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, vb)));
  return _mm256_packus_epi32(bf16_avx2_round(lo), bf16_avx2_round(hi));
}

// One loop per op (a template so each op's loop has no branch inside).
template <lane_op Op>
__attribute__((target("avx2"))) inline void reduce_bf16_avx2_loop(std::uint16_t* dst, const std::uint16_t* a,
                                                                  const std::uint16_t* b, std::size_t m) noexcept {
  for (std::size_t i = 0; i < m; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_avx2_line16<Op>(a + i, b + i));
}

/// dst[i] = a[i] op b[i] for the first n - n % 16 elements (returns that
/// count; the caller does the tail with the portable loop). dst may equal a
/// or b; otherwise the ranges must not overlap.
inline std::size_t reduce_bf16_avx2(lane_op op, std::uint16_t* dst, const std::uint16_t* a,
                                    const std::uint16_t* b, std::size_t n) noexcept {
  const std::size_t m = n - n % 16;
  switch (op) {
  case lane_op::sum: reduce_bf16_avx2_loop<lane_op::sum>(dst, a, b, m); break;
  case lane_op::prod: reduce_bf16_avx2_loop<lane_op::prod>(dst, a, b, m); break;
  case lane_op::min: reduce_bf16_avx2_loop<lane_op::min>(dst, a, b, m); break;
  case lane_op::max: reduce_bf16_avx2_loop<lane_op::max>(dst, a, b, m); break;
  }
  return m;
}

template <lane_op Op>
__attribute__((target("avx2"))) inline void reduce_bf16_avx2_into_two_nt_loop(std::uint16_t* out0, std::uint16_t* out1,
                                                                              const std::uint16_t* a,
                                                                              const std::uint16_t* b,
                                                                              std::size_t m) noexcept {
  for (std::size_t i = 0; i < m; i += 32) {
    const __m256i r0 = bf16_avx2_line16<Op>(a + i, b + i);
    const __m256i r1 = bf16_avx2_line16<Op>(a + i + 16, b + i + 16);
    const __m128i v[4] = {_mm256_castsi256_si128(r0), _mm256_extracti128_si256(r0, 1), _mm256_castsi256_si128(r1),
                          _mm256_extracti128_si256(r1, 1)};
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
inline std::size_t reduce_bf16_avx2_into_two_nt(lane_op op, std::uint16_t* out0, std::uint16_t* out1,
                                                const std::uint16_t* a, const std::uint16_t* b,
                                                std::size_t n) noexcept {
  const std::size_t m = n - n % 32;
  switch (op) {
  case lane_op::sum: reduce_bf16_avx2_into_two_nt_loop<lane_op::sum>(out0, out1, a, b, m); break;
  case lane_op::prod: reduce_bf16_avx2_into_two_nt_loop<lane_op::prod>(out0, out1, a, b, m); break;
  case lane_op::min: reduce_bf16_avx2_into_two_nt_loop<lane_op::min>(out0, out1, a, b, m); break;
  case lane_op::max: reduce_bf16_avx2_into_two_nt_loop<lane_op::max>(out0, out1, a, b, m); break;
  }
  return m;
}

/// data[i] = data[i] / divisor in f32, rounded once, for the first n - n % 16
/// elements (returns that count). divisor > 1.
__attribute__((target("avx2"))) inline std::size_t divide_bf16_avx2(std::uint16_t* data, std::size_t n,
                                                                    float divisor) noexcept {
  const std::size_t m = n - n % 16;
  const __m256i zero = _mm256_setzero_si256();
  const __m256 d = _mm256_set1_ps(divisor);
  for (std::size_t i = 0; i < m; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i));
    const __m256 lo = _mm256_div_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), d);
    const __m256 hi = _mm256_div_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)), d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(data + i),
                        _mm256_packus_epi32(bf16_avx2_round(lo), bf16_avx2_round(hi)));
  }
  return m;
}

#endif // DPKIT_REDUCE_BF16_AVX2

} // namespace dpkit::detail
