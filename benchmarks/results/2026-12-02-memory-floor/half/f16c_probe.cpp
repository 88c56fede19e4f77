// f16c_probe: dpkit's scalar f16 sum (core/reduce_op.hpp) against an F16C+AVX loop (a target attribute;
// a library version would check __builtin_cpu_supports("f16c") first), 32 Mi halves, one core; and float at
// the same bytes. Not built by meson: g++ -std=c++20 -O3 -Iinclude f16c_probe.cpp -o f16c_probe
#include <dpkit/core/reduce_op.hpp>
#include <immintrin.h>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <vector>
__attribute__((target("f16c,avx"))) void sum_f16c(std::uint16_t* d, const std::uint16_t* a, const std::uint16_t* b, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) d[i] = _cvtss_sh(_cvtsh_ss(a[i]) + _cvtsh_ss(b[i]), 0);
}
int main() {
  const std::size_t n = 32u << 20;
  std::vector<dpkit::f16> a(n), b(n), d(n), e(n);
  for (std::size_t i = 0; i < n; ++i) { a[i] = dpkit::f16(static_cast<float>(i % 1000) * 0.37f); b[i] = dpkit::f16(static_cast<float>(i % 777) * -0.11f); }
  std::vector<float> fa(n), fb(n), fd(n);
  auto t = [](auto f) { f(); auto t0 = std::chrono::steady_clock::now(); for (int k = 0; k < 5; ++k) f(); return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5 * 1e3; };
  double s = t([&] { dpkit::reduce_host(d.data(), a.data(), b.data(), n, dpkit::reduce_op::sum); });
  double v = t([&] { sum_f16c(reinterpret_cast<std::uint16_t*>(e.data()), reinterpret_cast<const std::uint16_t*>(a.data()), reinterpret_cast<const std::uint16_t*>(b.data()), n); });
  double f = t([&] { dpkit::reduce_host(fd.data(), fa.data(), fb.data(), n / 2, dpkit::reduce_op::sum); });
  std::size_t diff = 0;
  for (std::size_t i = 0; i < n; ++i) diff += std::memcmp(&d[i], &e[i], 2) != 0;
  std::printf("64 MiB of f16: dpkit scalar %.1f ms, F16C %.1f ms; float (same bytes) %.1f ms; bitwise differences %zu of %zu\n", s, v, f, diff, n);
}
