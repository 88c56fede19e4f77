// seg_phase: how fast two cores pass data through shared memory right now.
// Two processes pinned to cpus 0 and 1 (as mpirun binds two ranks) pass
// 2 MiB blocks through a shared segment (each block first touched by its
// writer after the fork, as dpkit's): per iteration each writes its 2 MiB
// block (memcpy, or with NT=1 set non-temporal stores), a step, each reads
// the peer's block (from the peer's cache, or memory), a step: "x" is that
// exchange's time. "p" is a private 2 MiB memcpy on the same core (the
// control: no other core involved). Mean over 190 iterations per segment;
// the argument is the number of fresh segments (default 4).
//
//   g++ -std=c++20 -O2 -o seg_phase seg_phase.cpp && ./seg_phase 4 && NT=1 ./seg_phase 4
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <emmintrin.h>
static void ntcopy(char* d, const char* s, std::size_t n) { for (std::size_t i = 0; i < n; i += 16) _mm_stream_si128((__m128i*)(d + i), _mm_loadu_si128((const __m128i*)(s + i))); _mm_sfence(); }
using clk = std::chrono::steady_clock;
constexpr std::size_t B = 2 << 20;
struct flags { alignas(64) std::atomic<long> w[2]; };
int main(int argc, char** argv) {
  const int K = argc > 1 ? atoi(argv[1]) : 4, iters = 200;
  auto* f = static_cast<flags*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (f) flags{};
  std::vector<char*> seg(K);
  for (auto& s : seg) s = static_cast<char*>(mmap(nullptr, 2 * B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  const pid_t child = fork();
  const int r = child == 0 ? 1 : 0;
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(r, &cs); sched_setaffinity(0, sizeof cs, &cs);
  std::vector<char> mine(B, 1 + r), got(B), priv(B);
  long e = 0;
  auto step = [&] { ++e; f->w[r].store(e, std::memory_order_release); while (f->w[1 - r].load(std::memory_order_acquire) < e) {} };
  for (int k = 0; k < K; ++k) std::memset(seg[k] + r * B, 0, B); // first touch by the writer
  step();
  for (int k = 0; k < K; ++k) {
    double t_x = 0, t_p = 0;
    for (int it = 0; it < iters; ++it) {
      auto t0 = clk::now();
      if (getenv("NT")) ntcopy(seg[k] + r * B, mine.data(), B); else std::memcpy(seg[k] + r * B, mine.data(), B);
      step();
      std::memcpy(got.data(), seg[k] + (1 - r) * B, B); // read the peer's (in its cache)
      step();
      auto t1 = clk::now();
      std::memcpy(priv.data(), mine.data(), B);         // control: private copy
      auto t2 = clk::now();
      if (it >= 10) t_x += std::chrono::duration<double>(t1 - t0).count(), t_p += std::chrono::duration<double>(t2 - t1).count();
    }
    step();
    if (r == 0) std::printf(" seg%d x %.0f us p %.0f us |", k, t_x / (iters - 10) * 1e6, t_p / (iters - 10) * 1e6);
    step();
  }
  if (r == 0) { std::printf("\n"); waitpid(child, nullptr, 0); }
}
