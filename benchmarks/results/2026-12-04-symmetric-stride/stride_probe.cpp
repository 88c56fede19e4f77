// stride_probe: the direct all-reduce's two-rank in-place kernel
// (reduce_both_in_place) over S MiB, two threads (thread r does half r, as
// rank r), the two buffers D bytes apart in one shared mapping; median and
// minimum of 9 (thread 0's time, between two barriers). One line per D.
//   g++ -std=c++20 -O2 -I include stride_probe.cpp -o stride_probe -pthread
//   ./stride_probe S D...
#include <dpkit/collectives/shm/allreduce.hpp>
#include <sys/mman.h>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using clk = std::chrono::steady_clock;
int main(int argc, char** argv) {
  const size_t S = size_t(atoi(argv[1])) << 20;
  const size_t n = S / 4, h = n / 2;
  for (int i = 2; i < argc; ++i) {
    const size_t D = strtoull(argv[i], nullptr, 0);
    auto* base = (std::byte*)mmap(nullptr, D + S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float* x0 = (float*)base; float* x1 = (float*)(base + D);
    memset(x0, 0, S); memset(x1, 0, S);
    std::barrier bar(2);
    std::vector<double> t;
    auto body = [&](int r) {
      for (int k = 0; k < 9; ++k) {
        bar.arrive_and_wait();
        auto s = clk::now();
        dpkit::detail::reduce_both_in_place<dpkit::reduce_op::sum>(x0 + r * h, x1 + r * h, h);
        bar.arrive_and_wait();
        if (r == 0) t.push_back(std::chrono::duration<double>(clk::now() - s).count() * 1e3);
      }
    };
    std::thread a(body, 0), b(body, 1); a.join(); b.join();
    std::sort(t.begin(), t.end());
    printf("S %zu MiB D %#zx (%.4f MiB): median %.2f ms min %.2f\n", S >> 20, D, D / 1048576.0, t[4], t[0]);
    munmap(base, D + S);
  }
}
