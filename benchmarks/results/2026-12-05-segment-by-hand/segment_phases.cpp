// segment_phases (issue 53): a two-rank one-shot by hand (two processes pinned to cpus 0 and 1, a spin
// barrier): each writes S bytes into its own shared buffer (memcpy from its private input; "write"), a
// barrier, then reads ("read"); medians of 200 repetitions, us. Variants of the read: 0 out = mine + peer;
// 1 memcpy from the peer's buffer; 2 out = in + peer; 3 memcpy from this rank's own buffer (the peer never
// reads it); 4 and 5: as 1, then CLFLUSHOPT or CLFLUSH every line read (so the writer's next write finds no
// copy in the reader's cache). Third argument K: each rank rotates through K buffers (default 1).
//   g++ -O3 -std=c++20 -mclflushopt -o segment_phases segment_phases.cpp
//   for v in 0 1 2 3 4 5; do ./segment_phases 0.25 $v; done; for K in 1 2 4 8 16; do ./segment_phases 0.25 0 $K; done
#include <sys/mman.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <immintrin.h>
using clk = std::chrono::steady_clock;
struct ctl { alignas(64) std::atomic<long> arrive[2]; };
int main(int argc, char** argv) {
  size_t S = (argc > 1 ? atof(argv[1]) : 1) * (1 << 20);
  int variant = argc > 2 ? atoi(argv[2]) : 0;
  const int K = argc > 3 ? atoi(argv[3]) : 1; // buffers each rank rotates through
  size_t n = S / 4;
  const int reps = 201;
  char* mem = (char*)mmap(nullptr, 2 * K * (S + 4096), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ctl* c = new (mmap(nullptr, sizeof(ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) ctl{};
  pid_t ch = fork();
  int me = ch == 0 ? 1 : 0;
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(me, &cs); sched_setaffinity(0, sizeof cs, &cs);
  std::vector<float> in(n, 1 + me), out(n);
  float* mine = nullptr; float* peer = nullptr;
  float* b0 = nullptr; float* b1 = nullptr;
  long gen = 0;
  auto barrier = [&] { ++gen; c->arrive[me].store(gen, std::memory_order_release); while (c->arrive[1 - me].load(std::memory_order_acquire) < gen) {} };
  std::vector<double> tw, tr;
  for (int r = 0; r < reps; ++r) {
    mine = (float*)(mem + (size_t(me) * K + r % K) * (S + 4096)); peer = (float*)(mem + (size_t(1 - me) * K + r % K) * (S + 4096));
    b0 = me == 0 ? mine : peer; b1 = me == 0 ? peer : mine;
    barrier();
    auto t0 = clk::now();
    memcpy(mine, in.data(), S);
    auto t1 = clk::now();
    barrier();
    auto t2 = clk::now();
    switch (variant) {
      case 0: for (size_t i = 0; i < n; ++i) out[i] = b0[i] + b1[i]; break;
      case 1: memcpy(out.data(), peer, S); break;
      case 2: for (size_t i = 0; i < n; ++i) out[i] = in[i] + peer[i]; break;   // own private input + peer copy
      case 3: memcpy(out.data(), mine, S); break;
      case 4: memcpy(out.data(), peer, S); for (size_t o = 0; o < S; o += 64) _mm_clflushopt((char*)peer + o); _mm_sfence(); break;
      case 5: memcpy(out.data(), peer, S); for (size_t o = 0; o < S; o += 64) _mm_clflush((char*)peer + o); _mm_mfence(); break;
    }
    auto t3 = clk::now();
    barrier();
    if (r) { tw.push_back(std::chrono::duration<double>(t1 - t0).count()); tr.push_back(std::chrono::duration<double>(t3 - t2).count()); }
  }
  std::sort(tw.begin(), tw.end()); std::sort(tr.begin(), tr.end());
  if (me == 1) _exit(0);
  waitpid(ch, nullptr, 0);
  const char* names[] = {"out=mine+peer", "out=peer(memcpy)", "out=in+peer", "out=mine(memcpy)", "peer+clflushopt", "peer+clflush"};
  printf("K %d S %6.3f MiB %-18s write %7.1f us  read %7.1f us\n", K, S / 1048576.0, names[variant], tw[tw.size()/2]*1e6, tr[tr.size()/2]*1e6);
}
