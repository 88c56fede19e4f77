// torch_lm: a small transformer language model trained data-parallel with
// libtorch's C++ frontend and dpkit's DistributedDataParallel on the
// repository's real corpus (Debian package descriptions).
//
//   . scripts/env.sh       # OpenMPI as root, shared-memory transport
//   mpirun -np 2 build/examples/torch_lm --steps 200
//   mpirun -np 2 build/examples/torch_lm --steps 100 --checkpoint ckpt.pt --checkpoint-every 50
//   mpirun -np 2 build/examples/torch_lm --steps 200 --resume ckpt.pt
//   scripts/cluster.sh run -np 4 build/examples/torch_lm --steps 100 --inter-node-every 4   # two-speed sync, 2 nodes
//   build/examples/torch_lm --elastic file:///tmp/job --id 1 --first-size 2 & build/examples/torch_lm --elastic file:///tmp/job --id 2
//                          # elastic: no mpirun; processes fail and join at will (docs/elastic.md)
//   build/examples/torch_lm --steps 200 --rendezvous tcp://127.0.0.1:29600 --rank 0 --world-size 2 &
//   build/examples/torch_lm --steps 200 --rendezvous tcp://127.0.0.1:29600 --rank 1 --world-size 2
//                          # without mpirun (Gloo build): the same training over dpkit::gloo_transport;
//                          # or MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE as torchrun sets them
//
// Data: dpkit's JSONL index of <build>/data/debian-descriptions.jsonl with its
// num_tokens column (built on first use next to the corpus) feeds dpkit's
// token-budget batch sampler, which gives each rank its batches; each text is
// tokenized with SentencePiece (data/debian-bpe-8k.model) into
// <bos> pieces <eos>. Every step logs the mean loss over ranks, tokens/s and
// the exposed communication (from the last gradient hook of backward until
// the averaged gradients are in place).
//
// Modes (--ddp): dpkit (default: dpkit::distributed_data_parallel over
// dpkit::mpi, or over dpkit::gloo_transport when launched without mpirun);
// per-param (the official libtorch example's approach: after backward, an
// all-reduce of every parameter's gradient, then divide: MPI_Allreduce under
// mpirun); none (one process alone, e.g. with --batches DIR --as-rank 0).
// run() is written once against the transport: its own collectives
// (broadcast, barrier, all-gather of the metrics) are dpkit's, MPI's native
// ones under mpirun (the same MPI calls as ever), dpkit's ring/tree/shm over
// Gloo (the same values: a broadcast and an all-gather copy bytes, and the
// barrier carries none).
//
// Reference check and benchmark (scripts/torch_ddp_reference.py):
// --dump DIR writes the initial weights (DIR/init.bin) and every rank's token
// batches (DIR/batches.rank<R>.bin); --batches DIR trains on those files
// instead of the corpus, from DIR/init.bin; --loss-log FILE (rank 0) writes
// "step loss" lines; --json FILE (rank 0) writes the run's timing summary.
//
// Threads: libtorch's intra-op pool is sized to the CPUs each rank may run
// on, divided among the ranks of the node that share them
// (dpkit::size_torch_threads, dpkit/torch/threads.hpp): one thread per rank
// when 2 ranks share 2 cores, whether mpirun binds them (its default) or
// not; --threads N asks for N, and a rank whose CPUs get more threads than
// they have prints one warning line.
//
// Determinism: fixed seeds, no dropout; --resume continues from a checkpoint
// (written by rank 0 atomically: temporary file, fsync, rename) with the
// sampler positioned in O(1) and gives the same losses as an uninterrupted
// run.
#include <dpkit/data.hpp>
#include <dpkit/data/jsonl_length_column.hpp>
#include <dpkit/torch/distributed_data_parallel.hpp>
#include <dpkit/torch/threads.hpp>
#include <dpkit/transport/mpi.hpp>
#ifdef TORCH_LM_ELASTIC
#include <dpkit/torch/elastic.hpp>
#endif

#include "launch_main.hpp"
#include "run_main.hpp"
#include "torch_lm_model.hpp"

#include <CLI/CLI.hpp>
#include <mpi.h>
#include <simdjson.h>
#include <torch/torch.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

struct args {
  std::int64_t steps = 200;
  std::int64_t layers = 2, d_model = 128, heads = 4, max_len = 64;
  std::uint64_t max_tokens = 512;
  double lr = 1e-3, clip = 1.0, bucket_cap_mb = 25.0;
  std::uint64_t seed = 1234;
  std::string corpus; // empty: the build's data/debian-descriptions.jsonl (resolve_defaults)
  std::string spm;    // empty: the repository's data/debian-bpe-8k.model
  std::string ddp = "dpkit";
  bool bucket_view = false, find_unused = false, no_comm_thread = false, private_buckets = false;
  std::string compression = "none";
  std::string algorithm = "automatic";
  std::string checkpoint, resume, dump, batches, loss_log, json;
  std::int64_t checkpoint_every = 0;
  std::int64_t warmup = 3; // steps left out of the timing summary
  int as_rank = 0, log_every = 1;
  int threads = 0; // intra-op threads per rank; 0: sized to the rank's CPUs
  int inter_node_every = 1; // two-speed sync: parameters averaged across nodes every k steps
  // --elastic mode (no MPI): an elastic group through a store URL
  std::string elastic, sample_log, control;
  std::int64_t id = -1;
  int first_size = 1, admit_every = 1;
  std::int64_t limit_samples = 0; // 0: the whole corpus
  std::uint64_t epochs = 1;
  int heartbeat_ms = 500, dead_after_ms = 5000;
  bool no_majority = false;
};

using clk = std::chrono::steady_clock;
double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

// SentencePiece through the torch_lm_spm module (see torch_lm_spm.cpp for why
// it is loaded with dlopen into a local, deep-bound scope), found next to
// this executable.
class tokenizer {
public:
  explicit tokenizer(const std::string& model) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
    const std::string mod = self + "/libtorch_lm_spm.so";
    lib_ = ::dlopen(mod.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!lib_) throw dpkit::error("cannot load " + mod + ": " + ::dlerror());
    sym(open_, "torch_lm_spm_open");
    sym(encode_, "torch_lm_spm_encode");
    sym(bos_, "torch_lm_spm_bos");
    sym(eos_, "torch_lm_spm_eos");
    sym(close_, "torch_lm_spm_close");
    char err[512] = {};
    h_ = open_(model.c_str(), err, sizeof err);
    if (!h_) throw dpkit::error("SentencePiece: cannot load " + model + ": " + err);
  }
  tokenizer(const tokenizer&) = delete;
  tokenizer& operator=(const tokenizer&) = delete;
  ~tokenizer() {
    if (h_) close_(h_);
    // lib_ stays loaded: SentencePiece's protobuf registers exit handlers.
  }
  /// Piece ids of text.
  std::vector<int> encode(std::string_view text) const {
    const int* ids = nullptr;
    std::size_t n = 0;
    char err[512] = {};
    if (encode_(h_, text.data(), text.size(), &ids, &n, err, sizeof err) != 0)
      throw dpkit::error(std::string("SentencePiece: ") + err);
    return std::vector<int>(ids, ids + n);
  }
  int bos_id() const { return bos_(h_); }
  int eos_id() const { return eos_(h_); }

private:
  template <class F>
  void sym(F*& f, const char* name) {
    f = reinterpret_cast<F*>(::dlsym(lib_, name));
    if (!f) throw dpkit::error(std::string("libtorch_lm_spm.so lacks ") + name);
  }
  void* lib_ = nullptr;
  void* h_ = nullptr;
  void*(*open_)(const char*, char*, std::size_t) = nullptr;
  int (*encode_)(void*, const char*, std::size_t, const int**, std::size_t*, char*, std::size_t) = nullptr;
  int (*bos_)(void*) = nullptr;
  int (*eos_)(void*) = nullptr;
  void (*close_)(void*) = nullptr;
};

// Writes `path` atomically: f(tmp) writes a temporary file in the same
// directory, which is fsync'ed and renamed over `path`, then the directory is
// fsync'ed. A crash leaves either the old or the new file, never half of one.
template <class F>
void write_atomically(const std::string& path, F&& f) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path tmp = target.string() + ".tmp." + std::to_string(::getpid());
  try {
    f(tmp.string());
    const int fd = ::open(tmp.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
      if (fd >= 0) ::close(fd);
      throw dpkit::error("fsync failed on " + tmp.string());
    }
    ::close(fd);
    fs::rename(tmp, target);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// The batches of one rank: from the corpus (sampler + SentencePiece) or from
// a batch file.
class batch_source {
public:
  /// Elastic mode: the corpus and tokenizer only (the caller owns the
  /// sampler, re-derived after every heal). The index is opened (built when
  /// missing or stale) under an flock of <corpus>.lock: processes start
  /// independently, without a barrier.
  explicit batch_source(const args& a) : a_(a) {
    spm_.emplace(a.spm);
    dpkit::jsonl_index_open_options open;
    open.rebuild_if_stale = true;
    open.build.length_column = dpkit::json_length_column("num_tokens");
    const std::string lock = a.corpus + ".lock";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) throw dpkit::error("cannot lock " + lock);
    try {
      index_.emplace(dpkit::jsonl_index::open(a.corpus, open));
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    if (!index_->has_lengths()) throw dpkit::error(a.corpus + ": index has no num_tokens column");
  }
  /// The index's num_tokens column.
  std::span<const std::uint32_t> lengths() const { return index_->lengths(); }

  /// `barrier` waits for every rank (nothing with --ddp none).
  batch_source(const args& a, int world, int rank, const std::function<void()>& barrier) : a_(a) {
    if (!a.batches.empty()) {
      file_ = torch_lm::read_batches(a.batches + "/batches.rank" + std::to_string(rank) + ".bin");
      return;
    }
    spm_.emplace(a.spm);
    dpkit::jsonl_index_open_options open;
    open.rebuild_if_stale = true;
    open.build.length_column = dpkit::json_length_column("num_tokens");
    // Rank 0 builds the index (if missing or stale) before the others open it.
    if (rank == 0) index_.emplace(dpkit::jsonl_index::open(a.corpus, open));
    barrier();
    if (rank != 0) index_.emplace(dpkit::jsonl_index::open(a.corpus, open));
    if (!index_->has_lengths()) throw dpkit::error(a.corpus + ": index has no num_tokens column");
    dpkit::token_budget_options o;
    o.max_tokens = a.max_tokens;
    o.max_sample_tokens = static_cast<std::uint64_t>(a.max_len) - 1; // + <bos>
    o.oversize = dpkit::oversize_policy::truncate;
    o.seed = a.seed;
    sampler_.emplace(index_->lengths(), static_cast<std::uint64_t>(world), static_cast<std::uint64_t>(rank), o);
  }

  /// Rows [B, L] int32 of global step `step` (-1 pads).
  torch::Tensor batch(std::int64_t step) {
    if (!file_.empty()) {
      if (step >= static_cast<std::int64_t>(file_.size()))
        throw dpkit::invalid_argument("--batches: the batch file has " + std::to_string(file_.size()) +
                                      " steps, step " + std::to_string(step) + " requested");
      return file_[static_cast<std::size_t>(step)];
    }
    // O(1) positioning: epoch = step / batches per epoch, then batch(step % n).
    const auto per_epoch = static_cast<std::int64_t>(sampler_->num_batches());
    const auto epoch = static_cast<std::uint64_t>(step / per_epoch);
    if (epoch != sampler_->epoch()) sampler_->set_epoch(epoch);
    return rows_of(sampler_->batch(static_cast<std::uint64_t>(step % per_epoch)));
  }

  /// Rows [B, L] int32 of the corpus lines `idx` (-1 pads).
  torch::Tensor rows_of(const std::vector<std::uint64_t>& idx) {
    std::vector<std::vector<int>> rows;
    std::size_t longest = 0;
    const std::size_t limit = static_cast<std::size_t>(a_.max_len) - 1;
    for (auto i : idx) {
      const std::string_view line = (*index_)[i];
      simdjson::padded_string ps(line);
      auto doc = parser_.iterate(ps);
      std::string_view text;
      if (doc["text"].get_string().get(text))
        throw dpkit::format_error(a_.corpus + ": line " + std::to_string(i + 1) + " has no string field 'text'");
      std::vector<int> ids = spm_->encode(text);
      if (ids.size() > limit) ids.resize(limit);
      std::vector<int> row;
      row.reserve(ids.size() + 2);
      row.push_back(spm_->bos_id());
      row.insert(row.end(), ids.begin(), ids.end());
      row.push_back(spm_->eos_id());
      longest = std::max(longest, row.size());
      rows.push_back(std::move(row));
    }
    auto t = torch::full({static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(longest)}, -1, torch::kInt);
    auto acc = t.accessor<int, 2>();
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::size_t c = 0; c < rows[r].size(); ++c) acc[static_cast<std::int64_t>(r)][static_cast<std::int64_t>(c)] = rows[r][c];
    return t;
  }

private:
  const args& a_;
  std::vector<torch::Tensor> file_;
  std::optional<tokenizer> spm_;
  std::optional<dpkit::jsonl_index> index_;
  std::optional<dpkit::token_budget_batch_sampler> sampler_;
  simdjson::ondemand::parser parser_;
};

void save_checkpoint(const std::string& path, torch_lm::lm& model, torch::optim::Adam& opt, std::int64_t step, int world) {
  write_atomically(path, [&](const std::string& tmp) {
    torch::serialize::OutputArchive ar;
    model->save(ar);
    torch::serialize::OutputArchive opt_ar;
    opt.save(opt_ar);
    ar.write("optimizer", opt_ar);
    ar.write("dpkit_step", torch::tensor(step, torch::kLong));
    ar.write("dpkit_world_size", torch::tensor(static_cast<std::int64_t>(world), torch::kLong));
    ar.save_to(tmp);
  });
}

std::int64_t load_checkpoint(const std::string& path, torch_lm::lm& model, torch::optim::Adam& opt, int world) {
  try {
    torch::serialize::InputArchive ar;
    ar.load_from(path);
    model->load(ar);
    torch::serialize::InputArchive opt_ar;
    ar.read("optimizer", opt_ar);
    opt.load(opt_ar);
    torch::Tensor step, w;
    ar.read("dpkit_step", step);
    ar.read("dpkit_world_size", w);
    if (w.item<std::int64_t>() != world)
      throw dpkit::invalid_argument("--resume " + path + ": written by " + std::to_string(w.item<std::int64_t>()) +
                                    " ranks, resuming on " + std::to_string(world) +
                                    " would give different batches");
    return step.item<std::int64_t>();
  } catch (const c10::Error& e) {
    throw dpkit::format_error("--resume " + path + ": not a readable torch_lm checkpoint: " + e.what_without_backtrace());
  }
}

// The model of --layers/--d-model/--heads/--max-len, initialized from --seed
// (the same on every rank and in both modes).
torch_lm::lm make_model(const args& a) {
  torch::manual_seed(static_cast<std::uint64_t>(a.seed));
  torch_lm::lm_config cfg;
  cfg.layers = a.layers;
  cfg.d_model = a.d_model;
  cfg.heads = a.heads;
  cfg.max_len = a.max_len + 1;
  return torch_lm::lm(cfg);
}

// The algorithm of run()'s own collectives: MPI's native ones on dpkit::mpi
// (MPI_Bcast, MPI_Allreduce, MPI_Barrier, MPI_Allgather, as this program
// always called them), dpkit's on a transport without native collectives.
template <class C>
constexpr dpkit::algorithm own_algorithm = dpkit::native_collectives<C> ? dpkit::algorithm::native
                                                                        : dpkit::algorithm::automatic;

// Trains on the ranks of `comm` (nullptr: --ddp none, one process alone).
// C: dpkit::mpi under mpirun, dpkit::gloo_transport launched without it.
template <class C>
int run(const args& a, C* comm) {
  int world = 1, rank = 0;
  if (comm) {
    world = comm->size();
    rank = comm->rank();
  } else {
    rank = a.as_rank;
  }
  constexpr dpkit::algorithm algo = own_algorithm<C>;
  const auto barrier = [&] {
    if (comm) dpkit::barrier(*comm, algo);
  };
  // Before any torch work: libtorch's pools sized to this rank's CPUs.
  dpkit::torch_threads_options topt;
  topt.intra_op_threads = a.threads;
  dpkit::torch_threads_result threads;
  if (comm) {
    threads = dpkit::size_torch_threads(*comm, topt);
  } else {
    threads = dpkit::size_torch_threads(topt);
  }
  torch_lm::lm model = make_model(a);
  if (!a.batches.empty()) torch_lm::load_weights(*model, a.batches + "/init.bin");

  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(a.lr));
  std::int64_t start = 0;
  if (!a.resume.empty()) start = load_checkpoint(a.resume, model, opt, world); // before DDP hooks the parameters

  std::unique_ptr<dpkit::distributed_data_parallel<C>> ddp;
  if (a.ddp == "dpkit") {
    dpkit::ddp_options o;
    o.bucket_cap_mb = a.bucket_cap_mb;
    o.gradient_as_bucket_view = a.bucket_view;
    o.comm_thread = !a.no_comm_thread;
    o.symmetric_buckets = !a.private_buckets;
    o.find_unused_parameters = a.find_unused;
    o.inter_node_every = a.inter_node_every;
    o.algorithm.algo = dpkit::parse_algorithm(a.algorithm);
    o.comm_hook = a.compression == "f16" ? dpkit::gradient_compression::f16
                  : a.compression == "bf16" ? dpkit::gradient_compression::bf16
                                            : dpkit::gradient_compression::none;
    ddp = std::make_unique<dpkit::distributed_data_parallel<C>>(model, *comm, o); // broadcasts rank 0's weights
  } else if (a.ddp == "per-param") {
    torch::NoGradGuard ng;
    for (auto& p : model->parameters())
      dpkit::broadcast(*comm, std::span<float>(p.data_ptr<float>(), static_cast<std::size_t>(p.numel())), 0, algo);
  }
  if (!a.dump.empty() && rank == 0 && start == 0) {
    std::filesystem::create_directories(a.dump);
    torch_lm::save_weights(*model, a.dump + "/init.bin");
  }
  std::unique_ptr<torch_lm::batch_writer> dump_batches;
  if (!a.dump.empty()) {
    barrier(); // rank 0 created the directory
    dump_batches = std::make_unique<torch_lm::batch_writer>(a.dump + "/batches.rank" + std::to_string(rank) + ".bin");
  }
  batch_source data(a, world, rank, barrier);
  std::FILE* loss_log = nullptr;
  if (!a.loss_log.empty() && rank == 0) {
    loss_log = std::fopen(a.loss_log.c_str(), start == 0 ? "w" : "a");
    if (!loss_log) throw dpkit::error("cannot write " + a.loss_log);
  }
  if (rank == 0) {
    std::size_t n = 0;
    for (const auto& p : model->parameters()) n += static_cast<std::size_t>(p.numel());
    std::printf("torch_lm: %lld layers, d_model %lld, %zu parameters (%.1f MiB f32), %d ranks, ddp=%s", static_cast<long long>(a.layers),
                static_cast<long long>(a.d_model), n, static_cast<double>(n) * 4 / (1 << 20), world, a.ddp.c_str());
    if (ddp) std::printf(", %zu buckets (bucket_cap_mb %.3g)", ddp->reducer().plan().size(), a.bucket_cap_mb);
    std::printf(", %d intra-op thread%s per rank (CPUs %s of rank 0, shared by %d rank%s)", threads.intra_op,
                threads.intra_op == 1 ? "" : "s", dpkit::cpu_list_string(threads.cpus).c_str(), threads.ranks_sharing,
                threads.ranks_sharing == 1 ? "" : "s");
    std::printf(", steps %lld..%lld\n", static_cast<long long>(start), static_cast<long long>(a.steps));
    std::fflush(stdout);
  }

  double sum_step = 0, sum_exposed = 0, sum_exposed_last = 0, sum_exposed_compute = 0, sum_skew = 0,
         sum_last_bucket = 0, sum_tokens = 0;
  std::int64_t timed = 0, skipped = 0;
  double first_loss = NAN, last_loss = NAN;
  for (std::int64_t step = start; step < a.steps; ++step) {
    auto rows = data.batch(step);
    if (dump_batches) dump_batches->add(rows);
    const double tokens = static_cast<double>((rows.slice(1, 1, rows.size(1)) >= 0).sum().item<std::int64_t>());
    barrier(); // time the step, not the other rank's tokenizer
    const auto t0 = clk::now();
    opt.zero_grad();
    auto loss = torch_lm::lm_loss(model, rows);
    loss.backward();
    double last_bucket = 0;
    clk::time_point backward_end = clk::now(), ready = backward_end; // steady_clock: one clock for the node's ranks
    clk::time_point compute_end = backward_end;
    bool finite = true;
    if (ddp) {
      const auto r = ddp->finish();
      last_bucket = r.last_bucket_seconds;
      backward_end = r.backward_end;
      compute_end = r.compute_end;
      ready = r.ready;
      finite = r.all_finite;
      if (finite && a.clip > 0) ddp->clip_grad_norm(a.clip);
    } else {
      const auto tb = clk::now();
      if (a.ddp == "per-param") {
        for (auto& p : model->parameters()) {
          auto g = p.mutable_grad();
          dpkit::allreduce(*comm, std::span<float>(g.data_ptr<float>(), static_cast<std::size_t>(g.numel())),
                           dpkit::reduce_op::sum, dpkit::allreduce_policy{algo});
          g.div_(world);
        }
      }
      backward_end = compute_end = tb; // its communication starts after backward returned
      ready = clk::now();
      if (a.clip > 0) {
        const double norm = torch::nn::utils::clip_grad_norm_(model->parameters(), a.clip);
        finite = std::isfinite(norm);
      }
    }
    if (finite) opt.step();
    else ++skipped;
    bool averaged = false;
    if (ddp) averaged = ddp->average_parameters(); // two-speed sync: the large step, every --inter-node-every steps
    const double step_s = since(t0);
    const double exposed = std::chrono::duration<double>(ready - backward_end).count(); // = ddp_step_result::exposed_seconds
    // Metrics: mean loss over ranks, tokens summed, times maxed (one small collective, for the log).
    // Exposed two ways: the largest over ranks (a rank whose backward ended
    // first also waits there for the slowest one), and after the last rank's
    // backward (max ready - max backward end, on the node's shared clock): the
    // communication nobody's computation hid. Skew: last - first backward end.
    // The last bucket's all-reduce is the one of the rank whose backward ended
    // last: on the others it includes waiting for that rank's backward (the
    // skew), which would make any exposed time look small next to it.
    // Also after the last rank's end of the backward graph task (max ready -
    // max compute_end): where PyTorch DDP's logging puts the end of backward
    // (ddp_step_result::compute_end).
    constexpr int nm = 8;
    const auto secs = [](clk::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); };
    double m[nm] = {loss.item<double>(), tokens, step_s, exposed, last_bucket, secs(backward_end), secs(ready),
                    secs(compute_end)};
    std::vector<double> all(static_cast<std::size_t>(nm * world));
    if (comm) dpkit::allgather(*comm, std::span<const double>(m, nm), all, algo);
    else std::copy(m, m + nm, all.begin());
    double gl = 0, gt = 0, gs = 0, ge = 0, gb = 0;
    double end_max = -1e300, end_min = 1e300, ready_max = -1e300, compute_max = -1e300;
    for (int r = 0; r < world; ++r) {
      const double* v = all.data() + nm * r;
      gl += v[0] / world;
      gt += v[1];
      gs = std::max(gs, v[2]);
      ge = std::max(ge, v[3]);
      if (v[5] > end_max) gb = v[4];
      end_max = std::max(end_max, v[5]);
      end_min = std::min(end_min, v[5]);
      ready_max = std::max(ready_max, v[6]);
      compute_max = std::max(compute_max, v[7]);
    }
    const double gc = ready_max - end_max, gk = end_max - end_min;
    if (step == start) first_loss = gl;
    last_loss = gl;
    if (step - start >= a.warmup) {
      sum_step += gs;
      sum_exposed += ge;
      sum_exposed_last += gc;
      sum_exposed_compute += ready_max - compute_max;
      sum_skew += gk;
      sum_last_bucket += gb;
      sum_tokens += gt;
      ++timed;
    }
    if (rank == 0) {
      if (loss_log) std::fprintf(loss_log, "%lld %.9g\n", static_cast<long long>(step), gl);
      if (a.log_every > 0 && (step % a.log_every == 0 || step + 1 == a.steps)) {
        std::printf("step %lld loss %.4f tokens %.0f step %.1f ms tokens/s %.0f exposed_comm %.2f ms%s%s\n",
                    static_cast<long long>(step), gl, gt, 1e3 * gs, gt / gs, 1e3 * ge, finite ? "" : " (non-finite: skipped)",
                    averaged ? " (parameters averaged across nodes)" : "");
        std::fflush(stdout);
      }
    }
    if (!a.checkpoint.empty() && a.checkpoint_every > 0 && (step + 1) % a.checkpoint_every == 0 && rank == 0)
      save_checkpoint(a.checkpoint, model, opt, step + 1, world);
  }
  if (dump_batches) dump_batches->close();
  if (loss_log) std::fclose(loss_log);
  if (!a.checkpoint.empty() && rank == 0) save_checkpoint(a.checkpoint, model, opt, a.steps, world);
  if (rank == 0) {
    const double n = static_cast<double>(std::max<std::int64_t>(timed, 1));
    std::printf("summary: ddp=%s ranks=%d first_loss=%.4f last_loss=%.4f step_ms=%.2f tokens_per_s=%.0f "
                "exposed_comm_ms=%.3f exposed_after_last_backward_ms=%.3f exposed_after_last_compute_end_ms=%.3f "
                "backward_skew_ms=%.3f last_bucket_ms=%.3f "
                "timed_steps=%lld skipped_steps=%lld\n",
                a.ddp.c_str(), world, first_loss, last_loss, 1e3 * sum_step / n, sum_tokens / std::max(sum_step, 1e-12),
                1e3 * sum_exposed / n, 1e3 * sum_exposed_last / n, 1e3 * sum_exposed_compute / n, 1e3 * sum_skew / n,
                1e3 * sum_last_bucket / n,
                static_cast<long long>(timed), static_cast<long long>(skipped));
    if (!a.json.empty()) {
      std::ofstream j(a.json);
      j << "{\"ddp\": \"" << a.ddp << "\", \"ranks\": " << world << ", \"first_loss\": " << first_loss
        << ", \"last_loss\": " << last_loss << ", \"step_s\": " << sum_step / n
        << ", \"tokens_per_s\": " << sum_tokens / std::max(sum_step, 1e-12) << ", \"exposed_s\": " << sum_exposed / n
        << ", \"exposed_last_s\": " << sum_exposed_last / n
        << ", \"exposed_compute_last_s\": " << sum_exposed_compute / n << ", \"skew_s\": " << sum_skew / n
        << ", \"last_bucket_s\": " << sum_last_bucket / n << ", \"timed_steps\": " << timed << "}\n";
    }
  }
  return 0;
}

#ifdef TORCH_LM_ELASTIC
// ---- --elastic: training over a dpkit::elastic_group, healed after every
// (re)formation (dpkit/torch/elastic.hpp). Logs (--sample-log DIR, one file
// per process, DIR/id<N>.log, each line written with one write(2) before
// the step's collective, so a process that ends abruptly has logged what
// it contributed), with the wall time (s) first:
//   T J gen id rank world step epoch offset checksum source members   after a heal
//   T S gen step epoch position rank pad id...                        before a step
//   T A gen step epoch offset checksum                                step applied here
//   T F id where step                                                 a fault injected (--control)
//   T D id step epoch checksum                                        finished
// The checksum is dpkit::module_checksum (FNV-1a of the parameters' and
// buffers' bytes). scripts/torch_elastic_check.py reads them back.

class line_log {
public:
  explicit line_log(const std::string& path) {
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd_ < 0) throw dpkit::error("cannot write " + path);
  }
  ~line_log() {
    if (fd_ >= 0) ::close(fd_);
  }
  line_log(const line_log&) = delete;
  line_log& operator=(const line_log&) = delete;
  void put(const std::string& body) {
    if (fd_ < 0) return;
    char t[32];
    std::snprintf(t, sizeof t, "%.3f ",
                  std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    const std::string line = t + body + "\n";
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      throw dpkit::error("short write to the sample log");
  }

private:
  int fd_ = -1;
};

// Fault injection for the elastic test (--control DIR): DIR/fail.<id> names
// where this process ends itself with _exit (no destructor runs, the kernel
// resets its connections): "join" (right after its group constructor
// returns, before the state broadcast), "before" (at the next step, before
// forward), "during" (after backward started the buckets' all-reduces,
// before finish), "after" (after the next step was applied, before
// admit_joiners); while DIR/pace exists each step sleeps 100 ms.
std::string control_fault(const args& a) {
  if (a.control.empty()) return {};
  std::ifstream f(a.control + "/fail." + std::to_string(a.id));
  std::string w;
  if (f) f >> w;
  return w;
}

int run_elastic(const args& a) {
  if (a.id < 0) throw dpkit::invalid_argument("--elastic needs --id N (N >= 0), got " + std::to_string(a.id));
  dpkit::torch_threads_options topt;
  topt.intra_op_threads = a.threads;
  dpkit::size_torch_threads(topt);
  torch_lm::lm model = make_model(a);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(a.lr));
  batch_source data(a);
  const auto all = data.lengths();
  const std::size_t n = a.limit_samples > 0 ? std::min<std::size_t>(all.size(), static_cast<std::size_t>(a.limit_samples))
                                            : all.size();
  const auto lengths = all.first(n);
  dpkit::token_budget_options so;
  so.max_tokens = a.max_tokens;
  so.max_sample_tokens = static_cast<std::uint64_t>(a.max_len) - 1; // + <bos>
  so.oversize = dpkit::oversize_policy::truncate;
  so.seed = a.seed;
  so.elastic = true; // one global batch sequence whatever the world size
  std::optional<dpkit::token_budget_batch_sampler> sampler;
  line_log log(a.sample_log.empty() ? std::string() : a.sample_log + "/id" + std::to_string(a.id) + ".log");
  const auto fault = [&](const std::string& where, std::int64_t step) {
    log.put("F " + std::to_string(a.id) + " " + where + " " + std::to_string(step));
    std::fprintf(stderr, "torch_lm: id %lld: fault injected (%s, step %lld)\n", static_cast<long long>(a.id),
                 where.c_str(), static_cast<long long>(step));
    ::_exit(3);
  };

  dpkit::elastic_options eo;
  eo.first_size = a.first_size;
  eo.heartbeat_interval = std::chrono::milliseconds(a.heartbeat_ms);
  eo.dead_after = std::chrono::milliseconds(a.dead_after_ms);
  eo.announce_wait = 4 * eo.dead_after;
  eo.majority = !a.no_majority;
  dpkit::elastic_group group(a.elastic, a.id, eo);
  if (control_fault(a) == "join") fault("join", -1);

  dpkit::elastic_ddp_options o;
  o.ddp.bucket_cap_mb = a.bucket_cap_mb;
  o.admit_every = a.admit_every;
  o.on_heal = [&](const dpkit::elastic_heal& h) {
    sampler.emplace(lengths, static_cast<std::uint64_t>(h.world_size), static_cast<std::uint64_t>(h.rank), so);
    // An offset past the plan (the epoch ended on padding positions) is the
    // epoch's end: the loop starts the next one.
    sampler->set_epoch(h.progress.epoch, 0);
    sampler->set_epoch(h.progress.epoch, std::min(h.progress.offset, sampler->total_batches()));
    std::string members;
    for (auto q : group.members()) {
      if (!members.empty()) members += ',';
      members += std::to_string(q);
    }
    char c[32];
    std::snprintf(c, sizeof c, "%016llx", static_cast<unsigned long long>(h.checksum));
    log.put("J " + std::to_string(h.generation) + " " + std::to_string(a.id) + " " + std::to_string(h.rank) + " " +
            std::to_string(h.world_size) + " " + std::to_string(h.progress.step) + " " +
            std::to_string(h.progress.epoch) + " " + std::to_string(h.progress.offset) + " " + c + " " +
            std::to_string(h.source) + " " + members);
    std::printf("torch_lm: id %lld joined generation %llu: rank %d of %d, step %lld, epoch %llu, offset %llu, "
                "params checksum %s (from rank %d)\n",
                static_cast<long long>(a.id), static_cast<unsigned long long>(h.generation), h.rank, h.world_size,
                static_cast<long long>(h.progress.step), static_cast<unsigned long long>(h.progress.epoch),
                static_cast<unsigned long long>(h.progress.offset), c, h.source);
    std::fflush(stdout);
  };
  dpkit::elastic_ddp trainer(group, model.ptr(), opt, o);

  while (trainer.progress().epoch < a.epochs && trainer.progress().step < a.steps) {
    const dpkit::elastic_progress p = trainer.progress();
    const auto w = static_cast<std::uint64_t>(group.size());
    const std::uint64_t k = (p.offset - sampler->start()) / w;
    if (k >= sampler->num_batches()) { // the epoch's sequence is done: every member at the same step
      trainer.next_epoch();
      sampler->set_epoch(trainer.progress().epoch, 0);
      continue;
    }
    const std::string f = control_fault(a);
    if (f == "before") fault(f, p.step);
    const std::uint64_t pos = sampler->global_position(k, static_cast<std::uint64_t>(group.rank()));
    const bool pad = sampler->is_padding_position(pos);
    const auto idx = sampler->batch(k);
    std::string line = "S " + std::to_string(group.generation()) + " " + std::to_string(p.step) + " " +
                       std::to_string(p.epoch) + " " + std::to_string(pos) + " " + std::to_string(group.rank()) + " " +
                       (pad ? "1" : "0");
    for (auto i : idx) {
      line += ' ';
      line += std::to_string(i);
    }
    log.put(line);
    auto rows = data.rows_of(idx);
    const std::uint64_t gen = group.generation();
    double loss_value = 0;
    const bool applied = trainer.step(
        [&] {
          opt.zero_grad();
          auto loss = torch_lm::lm_loss(model, rows);
          loss_value = loss.item<double>();
          if (pad) loss = loss * 0.0; // a padding duplicate takes part in the all-reduce, adding nothing
          loss.backward();
          if (f == "during") fault(f, p.step); // the buckets' all-reduces are in flight
        },
        [&](dpkit::distributed_data_parallel<dpkit::gloo_transport>& ddp, const dpkit::ddp_step_result& r) {
          if (r.all_finite) {
            if (a.clip > 0) ddp.clip_grad_norm(a.clip);
            opt.step();
          }
          char c[32];
          std::snprintf(c, sizeof c, "%016llx", static_cast<unsigned long long>(dpkit::module_checksum(*model)));
          log.put("A " + std::to_string(gen) + " " + std::to_string(p.step) + " " + std::to_string(p.epoch) + " " +
                  std::to_string(p.offset) + " " + c);
          if (group.rank() == 0 && a.log_every > 0 && p.step % a.log_every == 0) {
            std::printf("step %lld generation %llu world %d loss %.4f (rank 0's batch) params %s\n",
                        static_cast<long long>(p.step), static_cast<unsigned long long>(gen), group.size(), loss_value,
                        c);
            std::fflush(stdout);
          }
          if (f == "after") fault(f, p.step);
        });
    (void)applied;
    if (!a.control.empty() && std::filesystem::exists(a.control + "/pace"))
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  char c[32];
  std::snprintf(c, sizeof c, "%016llx", static_cast<unsigned long long>(dpkit::module_checksum(*model)));
  log.put("D " + std::to_string(a.id) + " " + std::to_string(trainer.progress().step) + " " +
          std::to_string(trainer.progress().epoch) + " " + c);
  std::printf("torch_lm: id %lld done: step %lld, epoch %llu, generation %llu, params checksum %s\n",
              static_cast<long long>(a.id), static_cast<long long>(trainer.progress().step),
              static_cast<unsigned long long>(trainer.progress().epoch),
              static_cast<unsigned long long>(group.generation()), c);
  return 0;
}
#endif

// The corpus and SentencePiece model when --corpus / --spm are not given:
// the repository's, wherever the program is started from (next to this
// executable's build directory, then the directories baked in at build
// time, then build/data and data/ under the working directory). Not needed
// with --batches.
void resolve_defaults(args& a) {
  if (!a.batches.empty() && a.elastic.empty()) return;
  if (a.corpus.empty())
    a.corpus = dpkit_programs::find_default_file("corpus", "--corpus",
                                                 dpkit_programs::build_file_candidates("data/debian-descriptions.jsonl"))
                   .string();
  if (a.spm.empty())
    a.spm = dpkit_programs::find_default_file("SentencePiece model", "--spm",
                                              dpkit_programs::source_file_candidates("data/debian-bpe-8k.model"))
                .string();
}

int torch_lm_main(int argc, char** argv) {
  args a;
  CLI::App app{"torch_lm: a small transformer LM trained with dpkit's DistributedDataParallel for libtorch"};
  app.add_option("--steps", a.steps, "train until this global step");
  app.add_option("--layers", a.layers, "transformer blocks");
  app.add_option("--d-model", a.d_model, "model width");
  app.add_option("--heads", a.heads, "attention heads");
  app.add_option("--max-len", a.max_len, "longest input row in tokens (<bos> + pieces, truncated)");
  app.add_option("--max-tokens", a.max_tokens, "token budget of one rank's batch (padding included)");
  app.add_option("--lr", a.lr, "Adam learning rate");
  app.add_option("--clip", a.clip, "clip the gradient norm to this (0: off)");
  app.add_option("--seed", a.seed, "model and sampler seed");
  app.add_option("--corpus", a.corpus,
                 "JSONL corpus with 'text' and 'num_tokens' (default: data/debian-descriptions.jsonl in this program's "
                 "build directory, wherever it is started from)");
  app.add_option("--spm", a.spm, "SentencePiece model (default: the repository's data/debian-bpe-8k.model)");
  app.add_option("--ddp", a.ddp, "dpkit | per-param | none")->check(CLI::IsMember({"dpkit", "per-param", "none"}));
  app.add_option("--bucket-cap-mb", a.bucket_cap_mb, "DDP bucket_cap_mb");
  app.add_flag("--bucket-view", a.bucket_view, "DDP gradient_as_bucket_view");
  app.add_flag("--find-unused", a.find_unused, "DDP find_unused_parameters");
  app.add_flag("--private-buckets", a.private_buckets,
               "DDP buckets in private memory (ddp_options::symmetric_buckets false: the two-shot all-reduce)");
  app.add_flag("--no-comm-thread", a.no_comm_thread,
               "all-reduce each bucket inside the gradient hook that makes it ready (ddp_options::comm_thread = false)");
  app.add_option("--compression", a.compression, "none | f16 | bf16 (comm hook)")->check(CLI::IsMember({"none", "f16", "bf16"}));
  app.add_option("--algorithm", a.algorithm, "all-reduce of each bucket: automatic | ring | tree | native (MPI_Allreduce)");
  app.add_option("--checkpoint", a.checkpoint, "checkpoint file rank 0 writes (atomically) at the end");
  app.add_option("--checkpoint-every", a.checkpoint_every, "also every K steps");
  app.add_option("--resume", a.resume, "continue from this checkpoint");
  app.add_option("--dump", a.dump, "write init.bin and batches.rank<R>.bin into this directory");
  app.add_option("--batches", a.batches, "train on DIR/batches.rank<R>.bin from DIR/init.bin");
  app.add_option("--as-rank", a.as_rank, "with --ddp none: whose batches to read");
  app.add_option("--loss-log", a.loss_log, "rank 0 writes 'step loss' lines here");
  app.add_option("--json", a.json, "rank 0 writes the timing summary here");
  app.add_option("--warmup", a.warmup, "steps left out of the timing summary");
  app.add_option("--log-every", a.log_every, "log every K steps (0: summary only)");
  app.add_option("--inter-node-every", a.inter_node_every,
                 "two-speed sync: average gradients inside each node every step and the parameters across nodes "
                 "after steps 0, k, 2k, ... (1: plain DDP)")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", a.threads, "intra-op threads per rank (0: the rank's CPUs divided among the ranks sharing them)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--elastic", a.elastic,
                 "train over an elastic group through this store (file:///dir or redis://host:port/job), without MPI");
  app.add_option("--id", a.id, "--elastic: this process's id (unique in the job, never reused)");
  app.add_option("--first-size", a.first_size, "--elastic: processes the job's first generation waits for");
  app.add_option("--admit-every", a.admit_every, "--elastic: admit waiting processes every K steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--limit-samples", a.limit_samples, "--elastic: an epoch is the corpus's first N lines (0: all)");
  app.add_option("--epochs", a.epochs, "--elastic: stop after this many epochs (or at --steps)");
  app.add_option("--heartbeat-ms", a.heartbeat_ms, "--elastic: heartbeat interval");
  app.add_option("--dead-after-ms", a.dead_after_ms, "--elastic: a heartbeat unchanged this long is dead");
  app.add_flag("--no-majority", a.no_majority,
               "--elastic: let any live members go on after a failure, even half or fewer of the last generation "
               "(default: a strict majority is needed, so a partition's minority never trains apart)");
  app.add_option("--sample-log", a.sample_log, "--elastic: each process appends its log to DIR/id<N>.log");
  app.add_option("--control", a.control, "--elastic: fault injection for the test (DIR/fail.<id>, DIR/pace)");
  // A launch without mpirun (launch_main.hpp; also from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
  dpkit_programs::launch_args launch;
  std::string rendezvous, launch_rank, launch_world;
  app.add_option("--rendezvous", rendezvous,
                 "without mpirun: the store where the ranks meet (tcp://host:port served by rank 0, file:///dir, "
                 "redis://host:port/job)");
  app.add_option("--rank", launch_rank, "without mpirun: this process's rank");
  app.add_option("--world-size", launch_world, "without mpirun: the number of processes");
  CLI11_PARSE(app, argc, argv);
  if (app.count("--rendezvous")) launch.rendezvous = rendezvous;
  if (app.count("--rank")) launch.rank = launch_rank;
  if (app.count("--world-size")) launch.world_size = launch_world;
  if (launch.any() && (!a.elastic.empty() || a.ddp == "none"))
    throw dpkit::invalid_argument(std::string(!a.elastic.empty() ? "--elastic forms its own group through its store"
                                                                 : "--ddp none runs one process alone") +
                                  ": it takes no --rendezvous, --rank or --world-size");
  if (!a.elastic.empty() || a.ddp == "none") resolve_defaults(a);
  if (!a.elastic.empty()) {
#ifdef TORCH_LM_ELASTIC
    try {
      return run_elastic(a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_lm: id %lld: %s\n", static_cast<long long>(a.id), e.what());
      return 1;
    }
#else
    std::fprintf(stderr, "torch_lm: --elastic needs dpkit built with the gloo feature\n");
    return 1;
#endif
  }
  if (a.ddp == "none") return run<dpkit::mpi>(a, nullptr);
  // Launched without mpirun: over dpkit::gloo_transport. Not caught: an
  // error on one rank ends the process through run_main; its peers' waits
  // fail once its connections close. The default files are looked for after
  // connecting, so a rank that lacks them ends its peers at once rather than
  // leaving them in the rendezvous until DPKIT_TIMEOUT.
  const auto launched = [&](auto& comm) {
    resolve_defaults(a);
    return run(a, &comm);
  };
  if (auto rc = dpkit_programs::run_if_launched(launch, launched)) return *rc;
  resolve_defaults(a);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) throw dpkit::error("MPI does not provide MPI_THREAD_MULTIPLE");
  // Not caught: an error on one rank ends the whole job through run_main,
  // without unwinding through the communicator while the other ranks wait.
  int rc = 1;
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    rc = run(a, &comm);
  }
  MPI_Finalize();
  return rc;
}

} // namespace

int main(int argc, char** argv) {
  return dpkit_programs::run_main("torch_lm", [&] { return torch_lm_main(argc, argv); });
}
