// sync_floor: the cost of the synchronisation every all-reduce contains, without
// its data, on this machine. N forked processes (as N ranks on one node) run a
// barrier over a shared-memory arrival counter: each adds 1 and waits until all
// N have arrived, polling with `pause` a few times and then with sched_yield
// (the waits of dpkit's shm algorithms, docs/algorithms.md "Protocol"). An
// all-reduce of any algorithm needs every rank's contribution before any rank
// can finish, so its latency cannot go below this barrier's on the same
// processes; with more ranks than cores the barrier includes the context
// switches that bring every rank onto a core (docs/tuning.md "Waits"; the
// runs: benchmarks/results/2026-11-24-sync-floor.md).
//
//   build/benchmarks/probes/sync_floor [-N 2,3,4] [--iters 200000] [--repeat 3]
//
// Prints, per N, the median over --repeat runs of microseconds per barrier for
// two wait modes: 256 pause polls then yields (dpkit's default when ranks do
// not outnumber cores) and yields from the first poll (its choice when they do).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

/// Microseconds per barrier of `n` forked processes over `iters` barriers.
double barrier_us(int n, long iters, int spin) {
  void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("sync_floor: mmap failed");
  auto* arrived = new (mem) std::atomic<long>(0);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("sync_floor: fork failed");
    if (pid == 0) {
      for (long k = 1; k <= iters; ++k) {
        arrived->fetch_add(1, std::memory_order_acq_rel);
        for (int s = 0; arrived->load(std::memory_order_acquire) < k * n;) {
          if (++s > spin) ::sched_yield();
          else __builtin_ia32_pause();
        }
      }
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  bool ok = true;
  for (const pid_t pid : kids) {
    int st = 0;
    ok = ::waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0 && ok;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::munmap(mem, 4096);
  if (!ok) throw std::runtime_error("sync_floor: a barrier process failed");
  return s / static_cast<double>(iters) * 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"sync_floor: us per shared-memory barrier of N processes (the floor of an all-reduce's latency)"};
  std::vector<int> ns{2, 3, 4};
  long iters = 200000;
  int repeat = 3;
  app.add_option("-N,--ranks", ns, "process counts")->delimiter(',');
  app.add_option("--iters", iters, "barriers per run")->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "runs per cell (the median is printed)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    std::printf("# sync_floor: %ld barriers per run, median of %d runs, %u hardware threads\n", iters, repeat,
                std::thread::hardware_concurrency());
    std::printf("| N | 256 pauses, then yields (us) | yields at once (us) |\n|---|---:|---:|\n");
    for (const int n : ns) {
      if (n < 1) throw std::runtime_error("sync_floor: N must be >= 1");
      std::vector<double> a, b;
      for (int r = 0; r < repeat; ++r) {
        a.push_back(barrier_us(n, iters, 256));
        b.push_back(barrier_us(n, iters, 0));
      }
      std::printf("| %d | %.3f | %.3f |\n", n, median(a), median(b));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
