// fusion_perf: what bucketed gradient fusion (dpkit::gradient_reducer) buys
// over per-tensor all-reduces, for a real model's parameter list.
//
//   mpirun -np 2 build/benchmarks/fusion_perf --model data/models/gpt2-124m.tsv
//   build/benchmarks/fusion_perf -t 4 --model ...            # 4 threads as ranks (inproc)
//
// Per step (median over --iters after --warmup of the slowest rank's time):
//   (a) one all-reduce per gradient tensor (what a naive trainer does);
//   (b) one flat all-reduce of all gradients (the lower bound for the data
//       volume; no copies, no overlap);
//   (c) gradient_reducer with every gradient ready at once (no compute):
//       "copy" copies gradients into the buckets and back (DDP default),
//       "view" has them written in place (DDP gradient_as_bucket_view=True);
//   (d) gradient_reducer (view) fed by a simulated backward that produces the
//       gradients in reverse registration order with --compute-ns-per-param
//       nanoseconds of compute per parameter: backward time, step time, and
//       the communication still exposed after backward ends (finish() time),
//       next to a standalone all-reduce of the last bucket (the part that
//       cannot overlap: it only starts when backward ends).
// Rows sweep bucket_cap_bytes (--caps, MiB); the first bucket stays 1 MiB.
#include <dpkit/collectives.hpp>
#include <dpkit/fusion/gradient_reducer.hpp>
#include <dpkit/fusion/model_spec.hpp>
#include <dpkit/transport/inproc.hpp>
#if defined(DPKIT_WITH_MPI) && __has_include(<dpkit/transport/mpi.hpp>)
#include <dpkit/transport/mpi.hpp>
#define FUSION_PERF_HAVE_MPI 1
#endif

#include <CLI/CLI.hpp>

#include "run_main.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

struct config {
  std::string model; // empty: the repository's data/models/gpt2-124m.tsv, wherever the program is started from
  int iters = 5;
  int warmup = 1;
  int threads = 0;
  double ns_per_param = 5.0;
  std::string compute_mode = "spin";
  std::vector<double> caps{1, 5, 25, 50, 100};
  double first_mib = 1.0;
  std::string algo = "automatic";
};

struct grad_buffer {
  dpkit::element_type type;
  std::size_t count;
  std::vector<std::uint64_t> store;
  grad_buffer(dpkit::element_type t, std::size_t n) : type(t), count(n), store((n * dpkit::element_size(t) + 7) / 8 + 1) {}
  void* data() { return store.data(); }
  dpkit::gradient_ref ref() { return {store.data(), count, type, dpkit::memory_space::host}; }
};

template <class C>
void allreduce_raw(C& comm, void* p, std::size_t count, dpkit::element_type t, const dpkit::allreduce_policy& pol) {
  dpkit::visit_element_type(t, [&](auto zero) {
    using T = decltype(zero);
    dpkit::tensor_view<T> v{static_cast<T*>(p), count, dpkit::memory_space::host};
    dpkit::allreduce(comm, v, v, dpkit::reduce_op::avg, pol);
  });
}

// Per phase: the median over timed iterations of the slowest rank's time
// (robust against other processes stealing the CPU for one iteration).
struct timer {
  std::size_t phases;
  std::vector<std::vector<double>> per_phase;
  explicit timer(std::size_t n) : phases(n), per_phase(n) {}
  void add(std::size_t phase, double s) { per_phase[phase].push_back(s); }
  template <class C>
  std::vector<double> result(C& comm, int) {
    std::vector<double> out(phases, 0.0);
    for (std::size_t p = 0; p < phases; ++p) {
      std::vector<double> v = per_phase[p];
      if (v.empty()) continue;
      dpkit::allreduce(comm, v, v, dpkit::reduce_op::max); // slowest rank, per iteration
      std::sort(v.begin(), v.end());
      const std::size_t m = v.size() / 2;
      out[p] = 1e3 * (v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m])); // ms
    }
    return out;
  }
};

double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

template <class C>
int run(C& comm, const config& cfg, const char* transport_name) {
  const auto spec = dpkit::load_model_spec(cfg.model);
  const int rank = comm.rank(), world = comm.size();
  const std::size_t n = spec.params.size();
  dpkit::allreduce_policy pol;
  pol.algo = dpkit::parse_algorithm(cfg.algo);

  std::vector<grad_buffer> grads;
  for (std::size_t i = 0; i < n; ++i) {
    grads.emplace_back(spec.params[i].type, spec.params[i].numel);
    dpkit::visit_element_type(spec.params[i].type, [&](auto zero) {
      using T = decltype(zero);
      T* p = static_cast<T*>(grads.back().data());
      for (std::size_t k = 0; k < spec.params[i].numel; ++k)
        p[k] = static_cast<T>(static_cast<float>((k + i + static_cast<std::size_t>(rank)) % 7) - 3.0f);
    });
  }
  std::vector<dpkit::gradient_ref> refs;
  for (auto& g : grads) refs.push_back(g.ref());

  if (rank == 0) {
    std::printf("# fusion_perf: %s: %zu tensors, %zu parameters (%.1f MiB), world size %d (%s), algorithm %s\n",
                spec.source.c_str(), n, spec.total_numel(), static_cast<double>(spec.total_bytes()) / (1 << 20), world,
                transport_name, cfg.algo.c_str());
    std::printf("# iters %d, warmup %d, simulated backward %.2f ns/param (%s) = %.1f ms; times in ms per step: median over "
                "iterations of the slowest rank\n",
                cfg.iters, cfg.warmup, cfg.ns_per_param, cfg.compute_mode.c_str(),
                1e-6 * cfg.ns_per_param * static_cast<double>(spec.total_numel()));
    std::fflush(stdout);
  }
  const int total_iters = cfg.warmup + cfg.iters;

  // (a) per-tensor all-reduce
  double t_a = 0, t_b = 0;
  {
    timer tm(1);
    for (int it = 0; it < total_iters; ++it) {
      dpkit::barrier(comm);
      const auto t0 = clk::now();
      for (std::size_t i = n; i-- > 0;) allreduce_raw(comm, grads[i].data(), grads[i].count, grads[i].type, pol);
      if (it >= cfg.warmup) tm.add(0, secs(t0, clk::now()));
    }
    t_a = tm.result(comm, cfg.iters)[0];
  }
  // (b) one flat all-reduce per element type
  {
    std::map<dpkit::element_type, std::size_t> per_type;
    for (const auto& p : spec.params) per_type[p.type] += p.numel;
    std::vector<grad_buffer> flats;
    for (auto [t, c] : per_type) flats.emplace_back(t, c);
    timer tm(1);
    for (int it = 0; it < total_iters; ++it) {
      dpkit::barrier(comm);
      const auto t0 = clk::now();
      for (auto& f : flats) allreduce_raw(comm, f.data(), f.count, f.type, pol);
      if (it >= cfg.warmup) tm.add(0, secs(t0, clk::now()));
    }
    t_b = tm.result(comm, cfg.iters)[0];
  }
  if (rank == 0) {
    std::printf("#\n# (a) per-tensor all-reduce (%zu all-reduces)   %10.2f ms\n", n, t_a);
    std::printf("# (b) one flat all-reduce                        %10.2f ms\n#\n", t_b);
    std::printf("# %8s %7s %9s %9s | %9s %9s %6s %6s | %9s %9s %9s %9s %9s %7s\n", "cap_MiB", "buckets", "first_MiB",
                "max_MiB", "(c)copy", "(c)view", "c/b", "a/c", "(d)bwd", "(d)step", "exposed", "exp_copy",
                "last_ar", "exp/ar");
    std::fflush(stdout);
  }

  const double ns = cfg.ns_per_param;
  const bool spin = cfg.compute_mode == "spin";
  // Backward from s0: parameter i's gradient is ready after compute time
  // proportional to the parameters of layers n-1..i (ns per parameter).
  auto simulated_backward = [&](clk::time_point s0, auto&& ready) {
    double acc = 0;
    for (std::size_t i = n; i-- > 0;) {
      acc += ns * static_cast<double>(spec.params[i].numel);
      const auto until = s0 + std::chrono::nanoseconds(static_cast<long long>(acc));
      if (spin) while (clk::now() < until) {}
      else std::this_thread::sleep_until(until);
      ready(i);
    }
  };
  for (double cap_mib : cfg.caps) {
    dpkit::reducer_options opt;
    opt.algorithm = pol;
    opt.buckets.first_bucket_bytes = static_cast<std::size_t>(cfg.first_mib * (1 << 20));
    opt.buckets.bucket_cap_bytes = static_cast<std::size_t>(cap_mib * (1 << 20));
    double c_copy = 0, c_view = 0, d_bwd = 0, d_step = 0, d_exp = 0, d_exp_copy = 0, last_ar = 0;
    dpkit::bucket_plan plan;
    // One timed step: (t0, t1) every bucket marked ready back to back, then
    // finish; (s0, s1, s2) with simulated compute, gradients becoming ready in
    // reverse order: start, end of backward, gradients ready.
    const auto timed_step = [&](auto& red) {
      dpkit::barrier(comm);
      const auto t0 = clk::now();
      for (std::size_t i = n; i-- > 0;) red.mark_ready(i);
      red.finish();
      const auto t1 = clk::now();
      dpkit::barrier(comm);
      const auto s0 = clk::now();
      simulated_backward(s0, [&](std::size_t i) { red.mark_ready(i); });
      const auto s1 = clk::now();
      red.finish();
      return std::array<clk::time_point, 5>{t0, t1, s0, s1, clk::now()};
    };
    // (c) copy mode and (d) copy mode's exposed time
    {
      dpkit::gradient_reducer<C> red(comm, refs, opt, spec.names());
      plan = red.plan();
      timer tm(2);
      for (int it = 0; it < total_iters; ++it) {
        const auto [t0, t1, s0, s1, s2] = timed_step(red);
        if (it >= cfg.warmup) {
          tm.add(0, secs(t0, t1));
          tm.add(1, secs(s1, s2));
        }
      }
      const auto r = tm.result(comm, cfg.iters);
      c_copy = r[0];
      d_exp_copy = r[1];
    }
    // (c) view mode and (d)
    {
      opt.gradient_as_bucket_view = true;
      dpkit::gradient_reducer<C> red(comm, spec.param_infos(), opt, spec.names());
      for (std::size_t i = 0; i < n; ++i) {
        auto b = red.bucket_bytes(i);
        if (!b.empty()) std::memcpy(b.data(), grads[i].data(), b.size());
      }
      timer tm(4);
      for (int it = 0; it < total_iters; ++it) {
        const auto [t0, t1, s0, s1, s2] = timed_step(red);
        if (it >= cfg.warmup) {
          tm.add(0, secs(t0, t1));
          tm.add(1, secs(s0, s1));
          tm.add(2, secs(s0, s2));
          tm.add(3, secs(s1, s2));
        }
      }
      const auto r = tm.result(comm, cfg.iters);
      c_view = r[0];
      d_bwd = r[1];
      d_step = r[2];
      d_exp = r[3];
    }
    // standalone all-reduce of the last bucket
    if (!plan.empty()) {
      const auto& lb = plan.buckets.back();
      grad_buffer buf(lb.type, lb.bytes / dpkit::element_size(lb.type));
      timer tm(1);
      for (int it = 0; it < total_iters; ++it) {
        dpkit::barrier(comm);
        const auto t0 = clk::now();
        allreduce_raw(comm, buf.data(), buf.count, buf.type, pol);
        if (it >= cfg.warmup) tm.add(0, secs(t0, clk::now()));
      }
      last_ar = tm.result(comm, cfg.iters)[0];
    }
    if (rank == 0) {
      std::size_t mx = 0;
      for (const auto& b : plan.buckets) mx = std::max(mx, b.bytes);
      const double first = plan.empty() ? 0.0 : static_cast<double>(plan.buckets.front().bytes) / (1 << 20);
      std::printf("  %8.0f %7zu %9.2f %9.2f | %9.2f %9.2f %6.2f %6.2f | %9.2f %9.2f %9.2f %9.2f %9.2f %7.2f\n", cap_mib,
                  plan.size(), first, static_cast<double>(mx) / (1 << 20), c_copy, c_view, c_view / t_b, t_a / c_view,
                  d_bwd, d_step, d_exp, d_exp_copy, last_ar, last_ar > 0 ? d_exp / last_ar : 0.0);
      if (cap_mib == 25) {
        std::printf("#   bucket sizes at cap 25 MiB (MiB, launch order):");
        for (const auto& b : plan.buckets) std::printf(" %.2f", static_cast<double>(b.bytes) / (1 << 20));
        std::printf("\n");
      }
      std::fflush(stdout);
    }
  }
  if (rank == 0)
    std::printf("# c/b: (c)view / (b) (target <= 1.10); a/c: (a) / (c)view (target >= 3); exp/ar: exposed "
                "communication after backward / last bucket's all-reduce (target <= 1.10)\n");
  return 0;
}

int fusion_perf_main(int argc, char** argv) {
  config cfg;
  CLI::App app{"fusion_perf: per-tensor vs flat vs bucketed (gradient_reducer) all-reduce for a model's gradients"};
  app.add_option("-m,--model", cfg.model, "model parameter list (models/*.tsv; default: the repository's data/models/gpt2-124m.tsv)");
  app.add_option("-n,--iters", cfg.iters, "timed iterations")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", cfg.warmup, "warmup iterations")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("-t,--threads", cfg.threads, "run N ranks as threads (inproc transport) instead of MPI")
      ->capture_default_str();
  app.add_option("--compute-ns-per-param", cfg.ns_per_param, "simulated backward compute, nanoseconds per parameter")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--compute-mode", cfg.compute_mode,
                 "spin (busy CPU, like CPU training) or sleep (idle CPU, like GPU compute)")
      ->capture_default_str()->check(CLI::IsMember({"spin", "sleep"}));
  app.add_option("--caps", cfg.caps, "bucket_cap_bytes values to sweep, MiB")->delimiter(',')->capture_default_str();
  app.add_option("--first-bucket-mib", cfg.first_mib, "first bucket limit, MiB")->capture_default_str();
  app.add_option("-A,--algo", cfg.algo, "all-reduce algorithm: automatic, ring, tree, native")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (cfg.model.empty())
    cfg.model = dpkit_programs::find_default_file("model parameter list", "--model",
                                                  dpkit_programs::source_file_candidates("data/models/gpt2-124m.tsv"))
                    .string();

  if (cfg.threads > 0) {
    dpkit::inproc_world world(cfg.threads);
    world.run([&](dpkit::inproc& comm) { run(comm, cfg, "inproc threads"); });
    return 0;
  }
#ifdef FUSION_PERF_HAVE_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 0;
  {
    // Errors are not caught: run_main ends the whole job with the message,
    // without unwinding through comm while other ranks wait in a collective.
    dpkit::mpi comm(MPI_COMM_WORLD);
    rc = run(comm, cfg, "mpi");
  }
  MPI_Finalize();
  return rc;
#else
  std::fprintf(stderr, "fusion_perf: built without MPI; use -t N for N threads as ranks\n");
  return 2;
#endif
}

} // namespace

// An error prints "fusion_perf: rank R: <what>" and ends the whole job (examples/run_main.hpp).
int main(int argc, char** argv) {
  return dpkit_programs::run_main("fusion_perf", [&] { return fusion_perf_main(argc, argv); });
}
