// prefetch_probe: the direct all-reduce's out-of-place loop on one core
// (out0[i] = out1[i] = a[i] + b[i] over half of an S-byte buffer, as each
// of two ranks does it), with and without software prefetch of the inputs
// PF bytes ahead, against a memcpy of S bytes (the floor's copy). The
// question (issue 53): why the two-rank direct path out of place at 1-8 MiB
// took 1.16-1.30x the floor while in place took 0.50-1.01x.
//
//   g++ -O3 -o prefetch_probe prefetch_probe.cpp && for s in 1 2 4 8; do echo "== $s MiB"; ./prefetch_probe $s; done
//
// Prints the median of 400 repetitions, us: memcpy, pf0 (no prefetch),
// pf256, pf320, pf192 (prefetch 256, 320, 192 bytes ahead).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cstdlib>
#include <cstdint>
using clk = std::chrono::steady_clock;
template <std::size_t PFB, class T>
__attribute__((noinline)) void two(T* __restrict c, T* __restrict d, const T* __restrict a, const T* __restrict b, size_t n) {
  constexpr size_t L = 64 / sizeof(T), P = PFB / sizeof(T);
  size_t i = 0;
  if (n >= P + L) for (; i + L + P <= n; i += L) {
    if (PFB) { __builtin_prefetch(a + i + P, 0, 3); __builtin_prefetch(b + i + P, 0, 3); }
    for (size_t k = 0; k < L; ++k) { T v = a[i+k] + b[i+k]; c[i+k] = v; d[i+k] = v; }
  }
  for (; i < n; ++i) { T v = a[i] + b[i]; c[i] = v; d[i] = v; }
}
int main(int argc, char** argv) {
  size_t bytes = (argc > 1 ? atof(argv[1]) : 1) * (1 << 20);
  size_t n = bytes / 4;
  std::vector<float> A(n, 1), B(n, 2), C(n), D(n);
  float *a = A.data(), *b = B.data(), *c = C.data(), *d = D.data();
  auto t = [&](const char* name, auto f) {
    std::vector<double> v;
    for (int i = 0; i < 400; ++i) { auto t0 = clk::now(); f(); v.push_back(std::chrono::duration<double>(clk::now() - t0).count()); }
    std::sort(v.begin(), v.end());
    printf("%-8s %7.1f  ", name, v[v.size() / 2] * 1e6);
  };
  t("memcpy", [&] { memcpy(c, a, bytes); });
  t("pf0", [&] { two<0>(c, d, a, b, n/2); });
  t("pf256", [&] { two<256>(c, d, a, b, n/2); });
  t("pf320", [&] { two<320>(c, d, a, b, n/2); });
  t("pf192", [&] { two<192>(c, d, a, b, n/2); });
  printf("\n");
}
