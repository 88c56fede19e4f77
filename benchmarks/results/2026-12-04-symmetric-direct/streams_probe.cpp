// streams_probe: one core, the same bytes (256 MiB read, 256 MiB written)
// in five patterns of memory streams: A the floor's non-temporal copy (one
// read, one write stream), B the direct all-reduce out of place (two inputs,
// two non-temporal outputs, through an 8 KiB block), C in place (two inputs
// written back), D one input copied to two outputs, E two inputs copied to
// one output. Median and minimum of 5.
//   g++ -std=c++20 -O2 -I include streams_probe.cpp -o streams_probe
#include <dpkit/core/copy_nontemporal.hpp>
#include <dpkit/core/reduce_op.hpp>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <vector>
using clk = std::chrono::steady_clock;
namespace dd = dpkit::detail;
float* alloc(size_t bytes) { void* p = mmap(nullptr, bytes + 4096 * 7, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0); std::memset(p, 1, bytes + 4096*7); return (float*)p + 1024 * (rand() % 7); }
int main() {
  const size_t S = size_t(256) << 20, N = S / 4, H = N / 2, B = 2048; // 8 KiB blocks
  float *a = alloc(S), *b = alloc(S), *c = alloc(S), *d = alloc(S);
  alignas(64) static float tmp[B];
  auto T = [](auto f) { auto t0 = clk::now(); f(); dd::store_fence(); return std::chrono::duration<double>(clk::now() - t0).count() * 1e3; };
  std::vector<double> r[5];
  for (int k = 0; k < 5; ++k) {
    r[0].push_back(T([&] { dd::copy_nontemporal(c, a, S, false); }));
    r[1].push_back(T([&] { for (size_t q = 0; q < H; q += B) { dpkit::reduce_host(tmp, a + q, b + q, B, dpkit::reduce_op::sum); dd::copy_nontemporal(c + q, tmp, B * 4, false); dd::copy_nontemporal(d + q, tmp, B * 4, false); } }));
    r[2].push_back(T([&] { for (size_t q = 0; q < H; q += B) { dpkit::reduce_host(tmp, a + q, b + q, B, dpkit::reduce_op::sum); std::memcpy(a + q, tmp, B * 4); std::memcpy(b + q, tmp, B * 4); } }));
    r[3].push_back(T([&] { for (size_t q = 0; q < H; q += B) { dd::copy_nontemporal(c + q, a + q, B * 4, false); dd::copy_nontemporal(d + q, a + H + q, B * 4, false); } }));
    r[4].push_back(T([&] { for (size_t q = 0; q < H; q += B) { dd::copy_nontemporal(c + 2 * q, a + q, B * 4, false); dd::copy_nontemporal(c + 2 * q + B, b + q, B * 4, false); } }));
  }
  const char* names[] = {"A nt-copy 1R1W", "B direct-oop 2R2W(nt)", "C direct-ip 2R(wb)", "D copy 1R2W(nt)", "E copy 2R1W(nt)"};
  for (int i = 0; i < 5; ++i) { std::sort(r[i].begin(), r[i].end()); printf("%-24s median %.2f ms (min %.2f)\n", names[i], r[i][2], r[i][0]); }
}
