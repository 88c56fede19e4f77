// sampler_perf: indices/s and peak RSS of distributed_sampler with the
// torch_randperm and feistel engines, feistel's bulk fill on one core, and
// token-budget plan building (samples/s) on synthetic lengths with the torch
// and the feistel sample order. Each engine runs in its own forked process so
// that peak RSS (getrusage ru_maxrss) is its own.
//
//   sampler_perf [--n 2e8] [--engine all|feistel|feistel_fill|torch_randperm|token_budget|token_budget_feistel]
//                [--world 1] [--plan-threads 0]
#include <dpkit/data.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

/// User + system CPU seconds of this process (wall times are inflated on a shared machine).
double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double peak_rss_mib() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0; // ru_maxrss is KiB on Linux
}

template <class Engine>
void run_distributed(const char* name, std::uint64_t n, std::uint64_t world, Engine engine) {
  const auto t0 = clock_type::now();
  dpkit::distributed_sampler<Engine> s(n, world, 0, {}, std::move(engine));
  s.set_epoch(1);
  const double t_epoch = seconds_since(t0);
  const auto t1 = clock_type::now();
  std::uint64_t sink = 0;
  for (std::uint64_t k = 0; k < s.size(); ++k) sink += s[k];
  const double t_iter = seconds_since(t1);
  const double total = seconds_since(t0);
  std::printf("%-16s %14llu %10.3f %10.3f %14.3e %14.3e %10.1f %10.2f  (sink %llu)\n", name, static_cast<unsigned long long>(s.size()),
              t_epoch, t_iter, static_cast<double>(s.size()) / t_iter, static_cast<double>(s.size()) / total, peak_rss_mib(), cpu_seconds(),
              static_cast<unsigned long long>(sink % 7));
}

/// feistel::fill over [0, n) in chunks of 4096 (one core).
void run_feistel_fill(std::uint64_t n) {
  dpkit::feistel f;
  const auto t0 = clock_type::now();
  f.reset(n, 1);
  const double t_epoch = seconds_since(t0);
  std::vector<std::uint64_t> buf(4096);
  std::uint64_t sink = 0;
  const auto t1 = clock_type::now();
  for (std::uint64_t k = 0; k < n; k += buf.size()) {
    const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), n - k));
    f.fill(k, std::span<std::uint64_t>(buf.data(), m));
    sink += buf[m - 1];
  }
  const double t_iter = seconds_since(t1);
  std::printf("%-16s %14llu %10.3f %10.3f %14.3e %14.3e %10.1f %10.2f  (sink %llu)\n", "feistel_fill", static_cast<unsigned long long>(n),
              t_epoch, t_iter, static_cast<double>(n) / t_iter, static_cast<double>(n) / seconds_since(t0), peak_rss_mib(), cpu_seconds(),
              static_cast<unsigned long long>(sink % 7));
}

void run_token_budget(const char* name, std::uint64_t n, std::uint64_t world, dpkit::sample_shuffle order, unsigned plan_threads) {
  std::vector<std::uint32_t> lengths(n);
  std::mt19937_64 rng(1);
  for (auto& l : lengths) {
    // long-tailed: mostly 20..300, some up to ~4000
    const std::uint64_t r = rng();
    l = static_cast<std::uint32_t>(20 + (r & 255) + (((r >> 8) & 63) == 0 ? (r >> 16) % 4000 : 0));
  }
  dpkit::token_budget_options o;
  o.max_tokens = 4096;
  o.shuffle_with = order;
  o.threads = plan_threads;
  const double cpu0 = cpu_seconds();
  const auto t0 = clock_type::now();
  dpkit::token_budget_batch_sampler s(lengths, world, 0, o); // builds epoch 0's plan
  const double t_plan = seconds_since(t0);
  const double cpu_plan = cpu_seconds() - cpu0;
  // batches are re-derived from their buffer: time 10000 random steps (a
  // training loop's access pattern with shuffle_batches)
  const std::uint64_t probes = std::min<std::uint64_t>(10000, s.num_batches());
  std::mt19937_64 pick(3);
  const auto t1 = clock_type::now();
  std::uint64_t sink = 0, samples = 0;
  for (std::uint64_t k = 0; k < probes; ++k) {
    const auto b = s.batch(pick() % s.num_batches());
    samples += b.size();
    sink += b.front();
  }
  const double t_iter = seconds_since(t1);
  std::printf("%-16s %14llu %10.3f %10.3f %14.3e %14.3e %10.1f %10.2f  (plan %llu batches, %llu skipped, plan cpu %.2f s; %llu random "
              "batches, %.1f us each; sink %llu)\n",
              name, static_cast<unsigned long long>(samples), t_plan, t_iter, static_cast<double>(samples) / std::max(t_iter, 1e-9),
              static_cast<double>(n) / t_plan, peak_rss_mib(), cpu_seconds(), static_cast<unsigned long long>(s.total_batches()),
              static_cast<unsigned long long>(s.skipped()), cpu_plan, static_cast<unsigned long long>(probes),
              t_iter / static_cast<double>(std::max<std::uint64_t>(probes, 1)) * 1e6, static_cast<unsigned long long>(sink % 7));
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"sampler_perf: distributed_sampler engines and token-budget plan throughput, peak RSS"};
  double n_d = 2e8;
  std::string engine = "all";
  std::uint64_t world = 1;
  app.add_option("--n", n_d, "dataset size (samples)")->default_val(2e8);
  unsigned plan_threads = 0;
  app.add_option("--engine", engine, "all | feistel | feistel_fill | torch_randperm | token_budget | token_budget_feistel")->default_val("all");
  app.add_option("--world", world, "world size (rank 0 is measured)")->default_val(1);
  app.add_option("--plan-threads", plan_threads, "token-budget plan threads (0 = all cores)")->default_val(0);
  CLI11_PARSE(app, argc, argv);
  const auto n = static_cast<std::uint64_t>(n_d);
  std::printf("# n = %llu, world_size = %llu, rank 0, epoch 1; one forked process per engine\n", static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(world));
  std::printf("# %-14s %14s %10s %10s %14s %14s %10s %10s\n", "engine", "indices", "epoch (s)", "iter (s)", "iter idx/s", "total idx/s",
              "peak MiB", "cpu (s)");
  std::fflush(stdout);
  const std::vector<std::string> all = {"feistel", "feistel_fill", "torch_randperm", "token_budget", "token_budget_feistel"};
  for (const auto& e : all) {
    if (engine != "all" && engine != e) continue;
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        if (e == "feistel") run_distributed("feistel", n, world, dpkit::feistel());
        if (e == "feistel_fill") run_feistel_fill(n);
        if (e == "torch_randperm") run_distributed("torch_randperm", n, world, dpkit::torch_randperm());
        if (e == "token_budget") run_token_budget("token_budget", n, world, dpkit::sample_shuffle::torch_randperm, plan_threads);
        if (e == "token_budget_feistel")
          run_token_budget("token_budget_f", n, world, dpkit::sample_shuffle::feistel, plan_threads);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "sampler_perf: %s: %s\n", e.c_str(), ex.what());
        std::fflush(nullptr);
        ::_exit(1);
      }
      std::fflush(nullptr);
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
  }
  return 0;
}
