#include <dpkit/core/reduce_op.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
int main() {
  const std::size_t n = 32u << 20;
  std::vector<dpkit::bf16> a(n), b(n), d(n);
  for (std::size_t i = 0; i < n; ++i) { a[i] = dpkit::bf16(float(i % 1000) * 0.37f); b[i] = dpkit::bf16(float(i % 777) * -0.11f); }
  std::vector<float> fa(n / 2, 1.f), fb(n / 2, 2.f), fd(n / 2);
  auto t = [](auto f) { f(); auto t0 = std::chrono::steady_clock::now(); for (int k = 0; k < 5; ++k) f(); return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5 * 1e3; };
  for (int r = 0; r < 3; ++r) {
  double s = t([&] { dpkit::reduce_host(d.data(), a.data(), b.data(), n, dpkit::reduce_op::sum); });
  double s2 = t([&] { dpkit::reduce_host(a.data(), a.data(), b.data(), n, dpkit::reduce_op::sum); });
  double f = t([&] { dpkit::reduce_host(fd.data(), fa.data(), fb.data(), n / 2, dpkit::reduce_op::sum); });
  std::printf("bf16 64 MiB oop %.1f ms ip %.1f ms, float %.1f ms\n", s, s2, f);
  }
}
