// out[i] = a[i] + b[i] over S bytes with ordinary stores, with CLZERO on each output line first, and memcpy
// of the same S: one core, buffers reused (in cache below L3), median of 51 runs.
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <cstdlib>
__attribute__((target("clzero"))) static void clz(void* p) { _mm_clzero(p); }
template <bool Z> void run(float* __restrict o, const float* __restrict a, const float* __restrict b, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    if constexpr (Z) clz(o + i);
    for (int k = 0; k < 16; ++k) o[i + k] = a[i + k] + b[i + k];
  }
}
template <class F> double med(F f) {
  std::vector<double> t;
  for (int k = 0; k < 51; ++k) { auto t0 = std::chrono::steady_clock::now(); f(); auto t1 = std::chrono::steady_clock::now(); t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count()); }
  std::nth_element(t.begin(), t.begin() + 25, t.end()); return t[25];
}
int main() {
  for (size_t S : {size_t(1) << 20, size_t(2) << 20, size_t(4) << 20, size_t(64) << 20}) {
    size_t n = S / 4;
    float* a = (float*)aligned_alloc(64, S); float* b = (float*)aligned_alloc(64, S); float* o = (float*)aligned_alloc(64, S); float* c = (float*)aligned_alloc(64, 2 * S);
    for (size_t i = 0; i < n; ++i) { a[i] = i; b[i] = 2 * i; o[i] = 0; }
    memset(c, 1, 2 * S);
    double t0 = med([&] { run<false>(o, a, b, n); });
    double t1 = med([&] { run<true>(o, a, b, n); });
    float chk = o[n - 1];
    double t2 = med([&] { memcpy(c, c + n, S); });
    printf("%5zu KiB: reduce ordinary %8.1f us, clzero first %8.1f us (%.2fx), memcpy S %8.1f us (check %g)\n", S >> 10, t0, t1, t1 / t0, t2, chk);
  }
}
