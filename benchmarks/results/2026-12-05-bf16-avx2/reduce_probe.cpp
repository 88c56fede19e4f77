// One core, no communication: dpkit::reduce_host over 64 MiB per operand in
// float, bf16 and f16 (out of place: dst = a + b; in place: a = a + b),
// median of 9 timed runs after 2 untimed ones. Run once with the vector
// paths on and once with DPKIT_BF16_AVX2=0 (and DPKIT_F16C=0) to time the
// portable loops: each is read once per process.
//   g++ -std=c++20 -O2 -Iinclude reduce_probe.cpp -o /tmp/reduce_probe
#include <dpkit/core/reduce_op.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

template <class T>
double time_ms(std::size_t bytes, bool in_place) {
  const std::size_t n = bytes / sizeof(T);
  std::vector<T> a(n), b(n), d(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = T(static_cast<float>(i % 1000) * 0.25f);
    b[i] = T(static_cast<float>(i % 777) * 0.5f);
  }
  std::vector<double> ms;
  for (int k = 0; k < 11; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    if (in_place) dpkit::reduce_host(a.data(), a.data(), b.data(), n, dpkit::reduce_op::sum);
    else dpkit::reduce_host(d.data(), a.data(), b.data(), n, dpkit::reduce_op::sum);
    const auto t1 = std::chrono::steady_clock::now();
    if (k >= 2) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

int main() {
  const std::size_t bytes = std::size_t{64} << 20;
  std::printf("# reduce_host, 64 MiB per operand, one core, median of 9 (ms); bf16 AVX2 %s, f16 F16C %s\n",
              dpkit::detail::bf16_avx2_enabled() ? "on" : "off", dpkit::detail::f16c_enabled() ? "on" : "off");
  std::printf("%-8s %12s %12s\n", "type", "out of place", "in place");
  std::printf("%-8s %12.2f %12.2f\n", "float", time_ms<float>(bytes, false), time_ms<float>(bytes, true));
  std::printf("%-8s %12.2f %12.2f\n", "bf16", time_ms<dpkit::bf16>(bytes, false), time_ms<dpkit::bf16>(bytes, true));
  std::printf("%-8s %12.2f %12.2f\n", "f16", time_ms<dpkit::f16>(bytes, false), time_ms<dpkit::f16>(bytes, true));
}
