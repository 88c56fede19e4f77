// memory_floor: the node's copy, reduce and streaming-copy rates with 1..N
// threads at once (each thread its own buffers, first touched by it), and
// what the model of benchmarks/common/bench_floor.hpp derives from them for
// n = 1..N ranks: each algorithm's time if nothing stayed in the caches
// (one-shot, two-shot, direct, ring) and the floor (S / stream rate). No
// MPI: threads stand in for the ranks of a node (a rank of an all-reduce is
// one process on one core; the memory system is what they share). allreduce_perf --floor measures the
// same rates with its own ranks and prints the floor beside each row.
//
//   ninja -C build benchmarks/probes/memory_floor
//   build/benchmarks/probes/memory_floor [-b 1M] [-e 256M] [-t max_threads] [-r reps]
//
// Sizes step by 4 from -b to -e; -t defaults to the CPUs this process may
// run on (sched_getaffinity). Rates are GB/s of payload per thread (copy:
// bytes copied; reduce: bytes written by out = a + b, float sum; stream: the
// faster of memcpy and a copy with non-temporal stores), the median
// of -r repetitions after one warm-up, every thread timing at once.
#include "bench_floor.hpp"

#include <dpkit/core/cpus.hpp>

#include <CLI/CLI.hpp>

#include <barrier>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// Every thread's rates for `bytes`, measured at once; the slowest thread's
// (a collective waits for its slowest rank).
dpkit_bench::memory_rates rates_with(int threads, std::size_t bytes, int reps) {
  std::barrier sync(threads);
  std::vector<dpkit_bench::memory_rates> got(static_cast<std::size_t>(threads));
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      got[static_cast<std::size_t>(t)] = dpkit_bench::measure_rates(bytes, reps, [&] { sync.arrive_and_wait(); });
    });
  for (auto& t : ts) t.join();
  dpkit_bench::memory_rates slowest = got[0];
  for (const auto& g : got) {
    slowest.copy_bytes_per_s = std::min(slowest.copy_bytes_per_s, g.copy_bytes_per_s);
    slowest.reduce_bytes_per_s = std::min(slowest.reduce_bytes_per_s, g.reduce_bytes_per_s);
    slowest.stream_bytes_per_s = std::min(slowest.stream_bytes_per_s, g.stream_bytes_per_s);
  }
  return slowest;
}

int run(int argc, char** argv) {
  std::size_t lo = std::size_t{1} << 20, hi = std::size_t{256} << 20;
  int max_threads = static_cast<int>(dpkit::usable_cpu_count()), reps = 5;
  CLI::App app{"memory_floor: copy, reduce and stream rates with 1..N threads, and the all-reduce floor they give"};
  app.add_option("-b,--minbytes", lo, "smallest size (bytes; K, M, G)")->transform(CLI::AsSizeValue(false));
  app.add_option("-e,--maxbytes", hi, "largest size (bytes; K, M, G)")->transform(CLI::AsSizeValue(false));
  app.add_option("-t,--threads", max_threads, "up to this many threads (default: the usable CPUs)")
      ->check(CLI::PositiveNumber);
  app.add_option("-r,--reps", reps, "timed repetitions per rate (the median)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (lo == 0 || hi < lo) throw std::invalid_argument("memory_floor: need 0 < -b <= -e");
  std::printf("# memory_floor: rates per thread with 1..%d threads at once (GB/s of payload; the slowest thread), "
              "median of %d\n", max_threads, reps);
  std::printf("# copy: memcpy; reduce: out = a + b (float); stream: the faster of memcpy and a copy with "
              "non-temporal stores\n");
  std::printf("# per algorithm: the all-reduce's time on n = threads ranks if nothing stayed in the caches (us); "
              "floor: S / stream (us)\n");
  for (int k = 1; k <= max_threads; ++k) {
    std::printf("#\n# %d thread(s)\n# %10s  %7s  %7s  %7s  %10s  %10s  %10s  %10s  %10s\n", k, "size", "copy", "reduce",
                "stream", "one-shot", "two-shot", "direct", "ring", "floor");
    std::printf("# %10s  %7s  %7s  %7s  %10s  %10s  %10s  %10s  %10s\n", "(B)", "(GB/s)", "(GB/s)", "(GB/s)", "(us)", "(us)",
                "(us)", "(us)", "(us)");
    for (std::size_t s = lo; s <= hi; s *= 4) {
      const auto r = rates_with(k, s, reps);
      std::printf("  %10zu  %7.2f  %7.2f  %7.2f", s, r.copy_bytes_per_s / 1e9, r.reduce_bytes_per_s / 1e9,
                  r.stream_bytes_per_s / 1e9);
      for (auto a : dpkit_bench::floor_algos)
        std::printf("  %10.1f", dpkit_bench::uncached_seconds(a, k, static_cast<double>(s), r) * 1e6);
      std::printf("  %10.1f\n", dpkit_bench::stream_floor_seconds(static_cast<double>(s), r) * 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
