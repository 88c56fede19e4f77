// torch_ddp_cuda: dpkit::distributed_data_parallel on CUDA (or CPU)
// parameters, launched without mpirun through a store (gloo_transport:
// --rendezvous/--rank/--world-size or torch's env:// variables), training
// examples/torch_lm_model.hpp's transformer on deterministic synthetic token
// batches. CUDA gradients are staged through the reducer's host buckets
// (what distributed_data_parallel supports; no CUDA IPC). Built and run by
// scripts/device_check.sh, which compares the runs:
//
//   # two processes on one GPU, then the same on the CPU: the per-step mean
//   # losses must agree within float tolerance
//   torch_ddp_cuda --device cuda --rendezvous tcp://127.0.0.1:29500 --rank 0 --world-size 2 --loss-log cuda.txt &
//   torch_ddp_cuda --device cuda --rendezvous tcp://127.0.0.1:29500 --rank 1 --world-size 2
//   # the reducer's overhead: libtorch's own single-GPU step, then dpkit's DDP on one rank
//   torch_ddp_cuda --device cuda --ddp none --steps 50
//   torch_ddp_cuda --device cuda --ddp dpkit --rendezvous tcp://127.0.0.1:29501 --rank 0 --world-size 1 --steps 50
//
// Batches: rank r's batch of step s is --batch rows of --seq + 1 tokens from
// a generator seeded with (seed, s, r); a row follows t' = (31 t + 7) mod V
// with probability 0.9 (else a random token), so the loss falls. The same
// on every device, so a CUDA run and a CPU run see the same data.
// Weights: torch::manual_seed(seed), built on the CPU, then moved to the
// device, so both runs start from the same weights (DDP broadcasts rank 0's).
//
// Output (rank 0): "step S loss L grad_norm G" lines (L the mean over
// ranks, G the norm of the averaged gradient from ddp_step_result, nan with
// --ddp none; %.9g) on stdout, "S L G" in --loss-log; then one line
//   # summary: device=cuda ddp=dpkit world=2 steps=20 timed=15 median_step_ms=... mean_step_ms=...
//     median_exposed_ms=... params=... buckets=... param_hash=...
// Steps before --warmup are left out of the times. After the last step every
// rank all-gathers a hash of its parameters' bytes and fails (exit 1) unless
// all ranks hold bitwise the same parameters (DDP's invariant).
//
// Exit status: 0; 1 on an error; 2 for a usage error; 77 with --device cuda
// when libtorch sees no CUDA device (checked before joining the job).
#include <dpkit/collectives.hpp>
#include <dpkit/torch/distributed_data_parallel.hpp>
#include <dpkit/torch/threads.hpp>
#include <dpkit/transport/launch.hpp>

#include "run_main.hpp"
#include "torch_lm_model.hpp"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

struct args {
  std::string device = "cuda"; // cuda | cpu
  std::string ddp = "dpkit";    // dpkit | none
  std::string optim = "adam";   // adam | sgd
  std::int64_t steps = 20, warmup = 5, batch = 8, seq = 64;
  std::int64_t layers = 2, d_model = 128, heads = 4, vocab = 8000;
  double lr = 1e-3, bucket_cap_mb = 25.0;
  bool pinned_buckets = true; // ddp_options::pinned_buckets
  std::uint64_t seed = 1234;
  std::string loss_log;
  dpkit::launch_flags launch;
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: torch_ddp_cuda [--device cuda|cpu] [--ddp dpkit|none] [--optim adam|sgd] [--steps 20]\n"
               "         [--warmup 5] [--batch 8] [--seq 64] [--layers 2] [--d-model 128] [--heads 4] [--vocab 8000]\n"
               "         [--lr 1e-3] [--bucket-cap-mb 25] [--pinned-buckets 1|0] [--seed 1234] [--loss-log FILE]\n"
               "         [--rendezvous URL --rank R --world-size W]  (or torch's env:// variables)\n");
  std::exit(2);
}

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help" || i + 1 >= argc) usage();
    const std::string v = argv[++i];
    if (k == "--device") a.device = v;
    else if (k == "--ddp") a.ddp = v;
    else if (k == "--optim") a.optim = v;
    else if (k == "--steps") a.steps = std::atoll(v.c_str());
    else if (k == "--warmup") a.warmup = std::atoll(v.c_str());
    else if (k == "--batch") a.batch = std::atoll(v.c_str());
    else if (k == "--seq") a.seq = std::atoll(v.c_str());
    else if (k == "--layers") a.layers = std::atoll(v.c_str());
    else if (k == "--d-model") a.d_model = std::atoll(v.c_str());
    else if (k == "--heads") a.heads = std::atoll(v.c_str());
    else if (k == "--vocab") a.vocab = std::atoll(v.c_str());
    else if (k == "--lr") a.lr = std::atof(v.c_str());
    else if (k == "--bucket-cap-mb") a.bucket_cap_mb = std::atof(v.c_str());
    else if (k == "--pinned-buckets" && (v == "0" || v == "1")) a.pinned_buckets = v == "1";
    else if (k == "--seed") a.seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--loss-log") a.loss_log = v;
    else if (k == "--rendezvous") a.launch.rendezvous = v;
    else if (k == "--rank") a.launch.rank = v;
    else if (k == "--world-size") a.launch.world_size = v;
    else usage();
  }
  const bool ok = (a.device == "cuda" || a.device == "cpu") && (a.ddp == "dpkit" || a.ddp == "none") &&
                  (a.optim == "adam" || a.optim == "sgd") && a.steps > 0 && a.warmup >= 0 && a.batch > 0 &&
                  a.seq > 1 && a.layers > 0 && a.d_model > 0 && a.heads > 0 && a.d_model % a.heads == 0 &&
                  a.vocab > 1 && a.lr > 0;
  if (!ok) usage();
  return a;
}

// Rank r's token batch of step s: [batch, seq + 1] int64 on the CPU.
torch::Tensor batch_of(const args& a, std::int64_t step, int rank) {
  std::mt19937_64 g(a.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(step) * 1000003ull +
                    static_cast<std::uint64_t>(rank) * 7919ull);
  std::uniform_int_distribution<std::int64_t> tok(1, a.vocab - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto rows = torch::empty({a.batch, a.seq + 1}, torch::kLong);
  auto* p = rows.data_ptr<std::int64_t>();
  for (std::int64_t b = 0; b < a.batch; ++b) {
    std::int64_t t = tok(g);
    for (std::int64_t j = 0; j <= a.seq; ++j) {
      p[b * (a.seq + 1) + j] = t;
      t = u(g) < 0.9 ? (31 * t + 7) % a.vocab : tok(g);
    }
  }
  return rows;
}

// torch_lm's forward with its position ids and causal mask made on the
// device of idx (lm_impl::forward makes them on the CPU).
torch::Tensor forward_on_device(torch_lm::lm& m, const torch::Tensor& idx) {
  const auto T = idx.size(1);
  const auto dev = idx.device();
  auto x = m->tok(idx) + m->pos(torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(dev)));
  auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(dev)).triu(1);
  for (const auto& b : *m->blocks) x = b->as<torch_lm::block_impl>()->forward(x, mask);
  return m->head(m->lnf(x));
}

// Mean next-token cross entropy of rows [B, L] (as torch_lm::lm_loss).
torch::Tensor loss_of(torch_lm::lm& m, const torch::Tensor& rows) {
  const auto L = rows.size(1);
  auto inputs = rows.slice(1, 0, L - 1);
  auto targets = rows.slice(1, 1, L);
  auto logits = forward_on_device(m, inputs);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}));
}

// FNV-1a over the bytes of every parameter (registration order), read on the CPU.
std::uint64_t parameter_hash(torch::nn::Module& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : m.parameters()) {
    auto c = p.detach().to(torch::kCPU).contiguous();
    const auto* b = static_cast<const unsigned char*>(c.data_ptr());
    const std::size_t n = static_cast<std::size_t>(c.numel()) * c.element_size();
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Trains on the ranks of comm (nullptr: --ddp none, one process alone).
template <class C>
int train(const args& a, C* comm) {
  const int world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const bool cuda = a.device == "cuda";
  const torch::Device dev = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (comm) (void)dpkit::size_torch_threads(*comm, {});
  else (void)dpkit::size_torch_threads();

  torch::manual_seed(a.seed);
  torch_lm::lm_config cfg;
  cfg.vocab = a.vocab;
  cfg.d_model = a.d_model;
  cfg.heads = a.heads;
  cfg.layers = a.layers;
  cfg.max_len = a.seq;
  torch_lm::lm model(cfg);
  model->to(dev);

  std::unique_ptr<dpkit::distributed_data_parallel<C>> ddp;
  if (comm) {
    dpkit::ddp_options o;
    o.bucket_cap_mb = a.bucket_cap_mb;
    o.pinned_buckets = a.pinned_buckets;
    ddp = std::make_unique<dpkit::distributed_data_parallel<C>>(model, *comm, o); // broadcasts rank 0's weights
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (a.optim == "sgd") opt = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(a.lr));
  else opt = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(a.lr));

  std::size_t nparams = 0;
  for (const auto& p : model->parameters()) nparams += static_cast<std::size_t>(p.numel());
  std::FILE* log = nullptr;
  if (rank == 0) {
    std::printf("# torch_ddp_cuda: device %s, ddp %s, world %d, %zu parameters (%.1f MiB f32), %lld layers x %lld, "
                "batch %lld x %lld tokens per rank, %s lr %g, pinned buckets %d, torch %s\n",
                dev.str().c_str(), a.ddp.c_str(), world, nparams, static_cast<double>(nparams) * 4 / (1 << 20),
                static_cast<long long>(a.layers), static_cast<long long>(a.d_model), static_cast<long long>(a.batch),
                static_cast<long long>(a.seq), a.optim.c_str(), a.lr, a.pinned_buckets ? 1 : 0, TORCH_VERSION);
    if (!a.loss_log.empty() && !(log = std::fopen(a.loss_log.c_str(), "w")))
      throw dpkit::error("cannot write " + a.loss_log);
    std::fflush(stdout);
  }

  std::vector<double> step_s, exposed_s;
  for (std::int64_t step = 0; step < a.steps; ++step) {
    auto rows = batch_of(a, step, rank).to(dev);
    if (comm) dpkit::barrier(*comm); // time the step, not a peer's late start
    if (cuda) torch::cuda::synchronize();
    const auto t0 = clk::now();
    opt->zero_grad();
    auto loss = loss_of(model, rows);
    loss.backward();
    double exposed = 0, norm = std::numeric_limits<double>::quiet_NaN();
    if (ddp) {
      const auto r = ddp->finish();
      exposed = r.exposed_seconds;
      norm = r.grad_norm; // the averaged gradient's norm (on the GPU for CUDA parameters)
    }
    opt->step();
    if (cuda) torch::cuda::synchronize();
    const double dt = std::chrono::duration<double>(clk::now() - t0).count();
    if (step >= a.warmup) {
      step_s.push_back(dt);
      exposed_s.push_back(exposed);
    }
    double l = loss.item<double>();
    if (comm) {
      std::vector<double> all(static_cast<std::size_t>(world));
      dpkit::allgather(*comm, std::span<const double>(&l, 1), all);
      l = 0;
      for (double x : all) l += x / world;
    }
    if (rank == 0) {
      std::printf("step %lld loss %.9g grad_norm %.9g\n", static_cast<long long>(step), l, norm);
      if (log) std::fprintf(log, "%lld %.9g %.9g\n", static_cast<long long>(step), l, norm);
    }
  }
  if (log) std::fclose(log);

  // DDP's invariant: every rank holds the same parameters
  std::uint64_t h = parameter_hash(*model);
  if (comm) {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(world));
    dpkit::allgather(*comm, std::span<const std::uint64_t>(&h, 1), all);
    for (int r = 1; r < world; ++r)
      if (all[static_cast<std::size_t>(r)] != all[0])
        throw dpkit::error("after " + std::to_string(a.steps) + " steps rank " + std::to_string(r) +
                           "'s parameters differ from rank 0's (hash " + std::to_string(all[static_cast<std::size_t>(r)]) +
                           " vs " + std::to_string(all[0]) + ")");
  }
  if (rank == 0) {
    double mean = 0;
    for (double x : step_s) mean += x / static_cast<double>(step_s.size());
    std::printf("# summary: device=%s ddp=%s world=%d steps=%lld timed=%zu median_step_ms=%.3f mean_step_ms=%.3f "
                "median_exposed_ms=%.3f params=%zu buckets=%zu param_hash=%016llx\n",
                a.device.c_str(), a.ddp.c_str(), world, static_cast<long long>(a.steps), step_s.size(),
                1e3 * median(step_s), 1e3 * mean, 1e3 * median(exposed_s), nparams,
                ddp ? ddp->reducer().plan().size() : std::size_t{0}, static_cast<unsigned long long>(h));
  }
  return 0;
}

int torch_ddp_cuda_main(int argc, char** argv) {
  const args a = parse(argc, argv);
  if (a.device == "cuda" && !torch::cuda::is_available()) {
    std::printf("# no CUDA device visible to libtorch (torch %s): skipping\n", TORCH_VERSION);
    return 77;
  }
  if (a.ddp == "none") return train<dpkit::gloo_transport>(a, nullptr);
  const auto job = dpkit::resolve_launch(a.launch);
  if (!job) throw dpkit::invalid_argument("--ddp dpkit needs --rendezvous, --rank and --world-size (or env://)");
  dpkit_programs::detail::launched_rank() = job->rank;
  dpkit::gloo_transport comm = dpkit::connect_launch(*job);
  return train(a, &comm);
}

} // namespace

// An error prints "torch_ddp_cuda: rank R: <what>" and exits 1 (examples/run_main.hpp).
int main(int argc, char** argv) {
  return dpkit_programs::run_main("torch_ddp_cuda", [&] { return torch_ddp_cuda_main(argc, argv); });
}
