// utag_alias_probe: the direct all-reduce's two-rank in-place kernel
// (reduce_both_in_place) and the block-staged one (reduce into an L1 block,
// copy it to both buffers) on 1 MiB of floats in two buffers `stride` bytes
// apart in one shared mapping; best of 50. On AMD Zen, lines 2^28 bytes apart
// share the L1 way predictor's tag (linear address bits 12-27).
//   g++ -std=c++20 -O2 -I include utag_alias_probe.cpp -o utag_alias_probe
#include <dpkit/collectives/shm/allreduce.hpp>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
using clk = std::chrono::steady_clock;
int main() {
  const size_t big = size_t(1) << 30;
  auto* base = (std::byte*)mmap(nullptr, big, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
  memset(base, 0, big);
  const size_t len = (1 << 20) / 4; // 1 MiB of floats
  for (size_t stride : {size_t(256) << 20, (size_t(256) << 20) + 4096, (size_t(256) << 20) + 8192, (size_t(256) << 20) + 65536, (size_t(256) << 20) + (1<<21), (size_t(128) << 20), (size_t(64) << 20), (size_t(32) << 20), (size_t(16) << 20), (size_t(128) << 20) + 4096*3}) {
    float* x0 = (float*)base; float* x1 = (float*)(base + stride);
    double best_f = 1e9, best_t = 1e9;
    for (int k = 0; k < 50; ++k) {
      auto t0 = clk::now();
      dpkit::detail::reduce_both_in_place<dpkit::reduce_op::sum>(x0, x1, len);
      best_f = std::min(best_f, std::chrono::duration<double>(clk::now() - t0).count());
      t0 = clk::now();
      alignas(64) static float tmp[2048];
      for (size_t q = 0; q < len; q += 2048) {
        dpkit::reduce_host(tmp, x0 + q, x1 + q, 2048, dpkit::reduce_op::sum);
        memcpy(x0 + q, tmp, 8192); memcpy(x1 + q, tmp, 8192);
      }
      best_t = std::min(best_t, std::chrono::duration<double>(clk::now() - t0).count());
    }
    printf("stride %zu: fused %.1f us, tmp %.1f us\n", stride, best_f * 1e6, best_t * 1e6);
  }
}
