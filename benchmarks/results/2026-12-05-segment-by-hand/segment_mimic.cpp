// segment_mimic (issue 53): g++ -O3 -std=c++20 -o segment_mimic segment_mimic.cpp && ./segment_mimic SIZE_MIB ALGO [REPS]
// Minimal two-process all-reduces of S bytes of float (sum) through shared
// memory, no dpkit: what a segment path costs on this machine when written
// by hand. Two processes pinned to cpus 0 and 1, a spin barrier.
//   oneshot : memcpy(in -> mine); barrier; out = buf0 + buf1; barrier
//   twoshot : copy peer's half of in -> mineA; barrier; out[own] = in[own] + peerA[own],
//             also into mineB[own]; barrier; out[peer half] = peerB[peer half]; barrier
//   direct  : inputs live in shared memory (not rewritten); out0[own] = out1[own] = in0[own] + in1[own]; barrier
//   directw : direct, each rank rewriting its input before every repetition (untimed), as a new gradient is
// Prints the median over the repetitions after the first (argument 3, default 401), us, and that of a
// private memcpy of S bytes on the same core right after each (the floor's copy).
#include <sys/mman.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <algorithm>
using clk = std::chrono::steady_clock;
struct ctl { alignas(64) std::atomic<long> arrive[2]; };
int main(int argc, char** argv) {
  const size_t S = (argc > 1 ? atof(argv[1]) : 1) * (1 << 20);
  const std::string algo = argc > 2 ? argv[2] : "twoshot";
  const size_t n = S / 4, h = n / 2;
  const int reps = argc > 3 ? atoi(argv[3]) : 401;
  auto shm = [](size_t b) { return (char*)mmap(nullptr, b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0); };
  // per rank: segA, segB (S each), shared input, shared output (direct)
  char* mem = shm(8 * (S + 4096 * 3));
  ctl* c = new (shm(4096)) ctl{};
  pid_t ch = fork();
  if (ch < 0) return 1;
  const int me = ch == 0 ? 1 : 0, pe = 1 - me;
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(me, &cs); sched_setaffinity(0, sizeof cs, &cs);
  auto region = [&](int rank, int k) { return (float*)(mem + (size_t(rank) * 4 + k) * (S + 4096 * 3)); };
  std::vector<float> priv_in(n, 1 + me), priv_out(n), src(n, 1), dst(n);
  const bool dir = algo == "direct" || algo == "directw";
  float* in = dir ? region(me, 2) : priv_in.data();
  float* out = dir ? region(me, 3) : priv_out.data();
  if (dir) for (size_t i = 0; i < n; ++i) in[i] = 1 + me;
  long gen = 0;
  auto barrier = [&] { ++gen; c->arrive[me].store(gen, std::memory_order_release); while (c->arrive[pe].load(std::memory_order_acquire) < gen) {} };
  const size_t ob = me == 0 ? 0 : h, oe = me == 0 ? h : n;   // own half
  const size_t pb = me == 0 ? h : 0, pe_ = me == 0 ? n : h;  // peer's half
  barrier();
  std::vector<double> tt, tc;
  for (int r = 0; r < reps; ++r) {
    if (algo == "directw") memcpy(in, priv_in.data(), S); // the owner rewrites its input (a new gradient), untimed
    barrier();
    auto t0 = clk::now();
    if (algo == "oneshot") {
      memcpy(region(me, 0), in, S);
      barrier();
      const float *b0 = region(0, 0), *b1 = region(1, 0);
      for (size_t i = 0; i < n; ++i) out[i] = b0[i] + b1[i];
      barrier();
    } else if (algo == "twoshot") {
      memcpy(region(me, 0) + pb, in + pb, (pe_ - pb) * 4);
      barrier();
      const float* peerA = region(pe, 0);
      float* mineB = region(me, 1);
      for (size_t i = ob; i < oe; ++i) { float v = me == 0 ? in[i] + peerA[i] : peerA[i] + in[i]; out[i] = v; mineB[i] = v; }
      barrier();
      memcpy(out + pb, region(pe, 1) + pb, (pe_ - pb) * 4);
      barrier();
    } else { // direct
      barrier(); // inputs ready
      const float *i0 = region(0, 2), *i1 = region(1, 2);
      float *o0 = region(0, 3), *o1 = region(1, 3);
      for (size_t i = ob; i < oe; ++i) { float v = i0[i] + i1[i]; o0[i] = v; o1[i] = v; }
      barrier();
    }
    auto t1 = clk::now();
    memcpy(dst.data(), src.data(), S);  // private copy, the floor's
    auto t2 = clk::now();
    if (r) { tt.push_back(std::chrono::duration<double>(t1 - t0).count()); tc.push_back(std::chrono::duration<double>(t2 - t1).count()); }
  }
  std::sort(tt.begin(), tt.end()); std::sort(tc.begin(), tc.end());
  const float want = 3;
  bool ok = true; for (size_t i = 0; i < n; ++i) ok &= out[i] == want;
  if (me == 1) _exit(ok ? 0 : 1);
  int st = 0; waitpid(ch, &st, 0);
  printf("S %7.3f MiB %-8s %8.1f us   private memcpy %7.1f us   ratio %.2f  %s\n", S / 1048576.0, algo.c_str(), tt[tt.size()/2]*1e6, tc[tc.size()/2]*1e6, tt[tt.size()/2]/tc[tc.size()/2], ok && st == 0 ? "ok" : "WRONG");
}
