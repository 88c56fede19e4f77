/// @file distributed_data_parallel.hpp
/// @brief `distributed_data_parallel`: PyTorch's DistributedDataParallel for
/// libtorch's C++ frontend (which has none, pytorch/pytorch#48959), on dpkit's
/// gradient_reducer and transports: a C++ training program gets DDP's
/// bucketed gradient averaging, overlapped with backward, without Python
/// (guide: docs/torch-ddp.md).
///
/// @code
/// dpkit::mpi comm(MPI_COMM_WORLD);
/// auto model = std::make_shared<Net>();
/// dpkit::distributed_data_parallel ddp(model, comm);      // broadcasts rank 0's weights
/// torch::optim::Adam opt(model->parameters(), 1e-3);
/// for (auto& batch : my_batches) {
///   opt.zero_grad();
///   auto loss = loss_fn(model->forward(batch.x), batch.y);
///   loss.backward();                  // bucket all-reduces start while backward runs
///   auto r = ddp.finish();            // averaged gradients are in p.grad()
///   if (!r.all_finite) continue;      // NaN/Inf on any rank: every rank skips
///   ddp.clip_grad_norm(1.0);          // from the reduction's norm, no extra collective
///   opt.step();
/// }
/// @endcode
///
/// Mechanism (torch/csrc/distributed/c10d/reducer.cpp): a post hook on every
/// parameter's gradient accumulator (torch::autograd::impl::grad_accumulator,
/// kept alive here as the Reducer keeps grad_accumulators_) hands the freshly
/// accumulated gradient to a dpkit::gradient_reducer, which launches each
/// bucket's all-reduce on the transport's communication thread as soon as the
/// bucket is full, in bucket-index order on every rank. Backward keeps
/// computing the earlier layers meanwhile.
///
/// Differences from torch DDP: the step ends with an explicit finish() (C++
/// has no generic forward to wrap; torch's Reducer waits for the buckets in
/// a final callback of the autograd engine, here finish() does, so the
/// reduction's errors reach the caller from finish() and the wrapper only
/// stamps the time in that callback: ddp_step_result::compute_end);
/// find_unused_parameters marks unused parameters at
/// finish() rather than by walking the graph at forward time, and a parameter
/// unused on every rank gets a zero gradient instead of staying undefined;
/// buffers are broadcast at construction and by sync_buffers() (torch:
/// before every forward). CUDA parameters are staged through host buckets
/// (dpkit::mpi and dpkit::inproc move host memory), page-locked unless
/// ddp_options::pinned_buckets is false, and with every parameter on CUDA
/// compute_stats runs on the GPU; gradient_as_bucket_view needs CPU
/// parameters.
#pragma once

#include "../core/errors.hpp"
#include "../fusion/gradient_reducer.hpp"
#include "../fusion/model_averager.hpp"
#include "tensor.hpp"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dpkit {

/// Options of distributed_data_parallel, named after
/// torch.nn.parallel.DistributedDataParallel's arguments. Every rank must
/// pass equal options (the bucket plan check catches differing bucket sizes).
struct ddp_options {
  /// Bucket size limit in MiB (DDP's bucket_cap_mb, default 25). > 0.
  double bucket_cap_mb = 25.0;
  /// Limit of the first bucket in MiB (DDP: dist._DEFAULT_FIRST_BUCKET_BYTES,
  /// 1 MiB). > 0.
  double first_bucket_cap_mb = 1.0;
  /// DDP's find_unused_parameters: parameters that got no gradient in a step
  /// are marked ready (with a zero contribution) at finish(). Without it such
  /// a step throws dpkit::error naming them (DDP's "Expected to have finished
  /// reduction in the prior iteration before starting a new one").
  bool find_unused_parameters = false;
  /// DDP's gradient_as_bucket_view: each p.grad() becomes a view into its
  /// bucket, so gradients are accumulated, reduced and read in place (no
  /// copy in or out). CPU parameters only.
  bool gradient_as_bucket_view = false;
  /// DDP's broadcast_buffers: broadcast rank 0's buffers at construction
  /// (call sync_buffers() to repeat it, e.g. before each forward).
  bool broadcast_buffers = true;
  /// Communication hook: none, or the 16-bit compression of torch's
  /// fp16_compress_hook / bf16_compress_hook (register_comm_hook).
  gradient_compression comm_hook = gradient_compression::none;
  /// Rebuild the buckets from the gradient-ready order of the first
  /// synchronized step, agreed from rank 0 (DDP does this after iteration 1).
  bool rebuild_buckets = true;
  /// Compute all_finite and the global gradient norm in the reduction (one
  /// read pass per bucket on the communication thread, no communication).
  /// When every parameter is a CUDA tensor they are computed on the GPU
  /// instead, from the averaged gradients after finish() wrote them back
  /// (one norm per gradient, accumulated in double, as the host pass): the
  /// host pass over the staged buckets cost more than the copies (an H200,
  /// benchmarks/results/2026-12-04-gpu-h200-device-check.md).
  bool compute_stats = true;
  /// Where each bucket's all-reduce runs (reducer_options::comm_thread):
  /// true (DDP's way), on the transport's communication thread, overlapped
  /// with backward; false, inside the gradient hook that makes the bucket
  /// ready, on the backward thread (for ranks that outnumber cores).
  bool comm_thread = true;
  /// With CUDA parameters: the host buckets they are staged through are
  /// page-locked (torch's pinned host allocator), so the copies between the
  /// GPU and the buckets run at DMA speed, and finish() copies the results
  /// back asynchronously with one synchronize per device. false: pageable
  /// buckets and one blocking copy per gradient each way (measured side by
  /// side on an H200: benchmarks/results/2026-12-04-gpu-h200-device-check.md).
  /// No effect on CPU parameters.
  bool pinned_buckets = true;
  /// With CPU parameters: the buckets are symmetric memory on comm
  /// (symmetric_bucket_allocator): where the transport has a shared segment
  /// (one node), every rank maps every rank's buckets and each bucket's
  /// all-reduce runs the shm all-reduce's direct path, one pass over memory
  /// instead of two copies through the segment (docs/algorithms.md "Direct,
  /// over symmetric memory"). Each bucket takes its size in /dev/shm; where
  /// the node cannot hold it (Docker's 64 MiB /dev/shm), it is private memory
  /// on every rank alike (symmetric_fallback::private_memory) and runs the
  /// two-shot, as with false. Elsewhere (several nodes, DPKIT_SHM_BYTES=0, a
  /// transport without a segment) the buckets are private memory. No effect
  /// with CUDA parameters (their buckets are pinned_buckets').
  bool symmetric_buckets = true;
  /// The two-speed sync ("small sync inside a node often, large sync
  /// between nodes rarely"): with k > 1 every step averages the gradients
  /// over this rank's node only (reducer_options::node_local: torch's
  /// post_localSGD_hook with an intra-node subgroup), and average_parameters(),
  /// called after each optimizer step, averages the parameters over every
  /// rank after steps 0, k, 2k, ... (torch's PeriodicModelAverager with
  /// period k); optimizer states stay local. 1 (default): plain DDP,
  /// gradients averaged over every rank in every step (bitwise the same
  /// steps as without the option). > 1 needs a transport that knows its
  /// nodes (hierarchical_transport) and CPU parameters.
  int inter_node_every = 1;
  /// All-reduce algorithm of every bucket.
  allreduce_policy algorithm{};
  /// Segment size, timeout and tag of every collective.
  collective_options collective{};
};

/// What distributed_data_parallel::finish() reports.
struct ddp_step_result {
  /// False inside no_sync() (nothing communicated, gradients accumulate).
  bool synchronized = false;
  /// False if some rank had a NaN/Inf gradient: skip the optimizer step (the
  /// same on every rank). True without compute_stats.
  bool all_finite = true;
  /// Global L2 norm of the averaged gradient over all parameters (double
  /// accumulation); NaN without compute_stats or when !all_finite.
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  /// Parameters marked ready at finish() because they got no gradient on
  /// this rank (find_unused_parameters).
  std::size_t unused_parameters = 0;
  /// Seconds from the start of the last gradient hook's bucket handling in
  /// this backward (or from the call of finish() if no hook ran) until the
  /// averaged gradients were in place: the communication backward did not
  /// hide (with comm_thread = false it includes the last bucket's all-reduce,
  /// and every earlier bucket's lengthened backward itself).
  double exposed_seconds = 0;
  /// Seconds the last bucket's reduction took on the communication thread
  /// (or in the hook, without it), from its start on this rank: on a rank
  /// that gets there before its peers this includes waiting for them.
  double last_bucket_seconds = 0;
  /// Seconds from compute_end until the averaged gradients were in place:
  /// the communication backward did not hide as PyTorch DDP's own logging
  /// counts it (torch/csrc/distributed/c10d/logger.cpp: the reducer's
  /// Timer::Event::kBackwardCommEnd minus kBackwardComputeEnd, i.e.
  /// avg_backward_comm_time minus avg_backward_compute_comm_overlap_time).
  /// Shorter than exposed_seconds by the autograd engine's work after the
  /// last gradient hook; with comm_thread = false the buckets' all-reduces
  /// ran inside backward, so it is only finish()'s own work (the step time
  /// shows their cost).
  double exposed_after_compute_seconds = 0;
  /// When exposed_seconds starts (the last gradient hook's entry, or the call
  /// of finish() if no hook ran) and ends (gradients in place), on
  /// std::chrono::steady_clock (CLOCK_MONOTONIC on Linux: one clock for every
  /// process of a node). With ranks whose backward ends at different times,
  /// a rank's exposed_seconds includes waiting for the slowest rank's
  /// gradients; the communication exposed after everyone's backward is
  /// max over ranks of `ready` minus max over ranks of `backward_end`
  /// (examples/torch_lm.cpp reports both).
  std::chrono::steady_clock::time_point backward_end{};
  std::chrono::steady_clock::time_point ready{};
  /// The end of backward's autograd graph task: when the engine ran its final
  /// callbacks (torch::autograd::Engine::queue_callback, queued by this
  /// backward's first gradient hook). torch's Reducer records
  /// Timer::Event::kBackwardComputeEnd at this point (in the final callback
  /// that runs its finalize_backward). Later than backward_end by the
  /// engine's work after the last hook; equal to it if no hook ran or the
  /// callback could not be queued. steady_clock, as backward_end.
  std::chrono::steady_clock::time_point compute_end{};
};

namespace detail {
// Shared between the wrapper and its hooks: a hook that outlives the wrapper
// (the module is still alive) finds owner == nullptr and does nothing.
template <class W>
struct ddp_hook_state {
  W* owner = nullptr;
};
} // namespace detail

/// DistributedDataParallel over a torch::nn::Module and a dpkit transport C
/// (dpkit::mpi, dpkit::inproc, or any async_transport moving host memory).
/// Collective: every rank constructs it over an identically structured
/// module, runs the same number of backward passes and calls finish() once
/// after each (inside and outside no_sync alike). Neither copyable nor
/// movable (the hooks refer to it); destroy it before the transport. The
/// module must outlive it. One thread drives it (backward on CPU runs the
/// hooks on the calling thread).
template <async_transport C>
class distributed_data_parallel {
public:
  /// Wraps `module`: collects its parameters that require a gradient
  /// (registration order, as module->named_parameters()), broadcasts every
  /// parameter and (with broadcast_buffers) buffer from rank 0, plans the
  /// buckets and hooks every parameter's gradient accumulator.
  /// @throws dpkit::invalid_argument for bucket_cap_mb <= 0, a parameter of
  ///         an unsupported dtype, a non-contiguous or non-CPU parameter with
  ///         gradient_as_bucket_view, or when ranks disagree on the parameters
  ///         (naming the first differing one; on every rank).
  distributed_data_parallel(std::shared_ptr<torch::nn::Module> module, C& comm, ddp_options options = {})
      : module_(std::move(module)), comm_(comm), opt_(std::move(options)),
        state_(std::make_shared<detail::ddp_hook_state<distributed_data_parallel>>()) {
    if (!module_) throw invalid_argument(prefix("distributed_data_parallel") + "null module");
    if (!(opt_.bucket_cap_mb > 0) || !(opt_.first_bucket_cap_mb > 0))
      throw invalid_argument(prefix("distributed_data_parallel") + "bucket_cap_mb " +
                             std::to_string(opt_.bucket_cap_mb) + " and first_bucket_cap_mb " +
                             std::to_string(opt_.first_bucket_cap_mb) + " must be > 0");
    std::vector<param_info> infos;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      const at::Tensor& p = item.value();
      if (!p.requires_grad()) continue;
      const std::string what = prefix("distributed_data_parallel") + "parameter '" + item.key() + "'";
      const element_type e = check_torch_tensor(p, what);
      if (opt_.gradient_as_bucket_view && !p.device().is_cpu())
        throw invalid_argument(what + " is on " + p.device().str() +
                               "; gradient_as_bucket_view needs CPU parameters (host buckets)");
      params_.push_back(p);
      names_.push_back(item.key());
      infos.push_back({static_cast<std::size_t>(p.numel()) * element_size(e), e, memory_space::host});
    }
    {
      torch::NoGradGuard no_grad;
      for (const auto& p : params_) broadcast_any(p);
      if (opt_.broadcast_buffers) sync_buffers();
    }
    reducer_options ro;
    ro.buckets.bucket_cap_bytes = static_cast<std::size_t>(opt_.bucket_cap_mb * 1024.0 * 1024.0);
    ro.buckets.first_bucket_bytes = static_cast<std::size_t>(opt_.first_bucket_cap_mb * 1024.0 * 1024.0);
    ro.algorithm = opt_.algorithm;
    ro.collective = opt_.collective;
    ro.compression = opt_.comm_hook;
    ro.compute_stats = opt_.compute_stats;
    ro.comm_thread = opt_.comm_thread;
    ro.gradient_as_bucket_view = true; // the wrapper writes every gradient into its bucket slot itself
    if (opt_.inter_node_every < 1)
      throw invalid_argument(prefix("distributed_data_parallel") + "inter_node_every must be >= 1, got " +
                             std::to_string(opt_.inter_node_every));
    if (opt_.inter_node_every > 1) {
      if constexpr (!hierarchical_transport<C>)
        throw invalid_argument(prefix("distributed_data_parallel") + "inter_node_every " +
                               std::to_string(opt_.inter_node_every) +
                               " needs a transport that knows its nodes (dpkit::mpi, dpkit::inproc)");
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (!params_[i].device().is_cpu() || !params_[i].is_contiguous())
          throw invalid_argument(prefix("distributed_data_parallel") + "parameter '" + names_[i] +
                                 "': inter_node_every > 1 averages parameters in place and needs contiguous CPU "
                                 "parameters");
      ro.node_local = true;
      averager_ = std::make_unique<periodic_model_averager<C>>(comm_, opt_.inter_node_every, 0, opt_.algorithm,
                                                               opt_.collective);
    }
    host_allocator buffers;
    bool all_cuda = !params_.empty();
    for (const auto& p : params_) {
      if (p.device().is_cuda()) cuda_devices_.insert(p.device().index());
      else all_cuda = false;
    }
    device_stats_ = opt_.compute_stats && all_cuda;
    if (device_stats_) ro.compute_stats = false; // computed by gradient_stats() on the GPU
    pinned_ = opt_.pinned_buckets && !cuda_devices_.empty();
    if (pinned_) buffers = pinned_allocator();
    else if (opt_.symmetric_buckets && cuda_devices_.empty())
      buffers = symmetric_bucket_allocator(comm_, opt_.collective, symmetric_fallback::private_memory);
    reducer_ = std::make_unique<gradient_reducer<C>>(comm_, std::move(infos), ro, names_, std::move(buffers));
    ready_.assign(params_.size(), 0);
    state_->owner = this;
    install_hooks();
  }

  /// As the other constructor, for a module holder (e.g. torch::nn::Linear
  /// or a TORCH_MODULE type).
  template <class M>
  distributed_data_parallel(const torch::nn::ModuleHolder<M>& module, C& comm, ddp_options options = {})
      : distributed_data_parallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()), comm,
                                  std::move(options)) {}

  distributed_data_parallel(const distributed_data_parallel&) = delete;
  distributed_data_parallel& operator=(const distributed_data_parallel&) = delete;

  /// Removes the hooks and waits for in-flight bucket all-reduces.
  ~distributed_data_parallel() {
    state_->owner = nullptr;
    for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  }

  /// The wrapped module (DDP's .module).
  const std::shared_ptr<torch::nn::Module>& module() const noexcept { return module_; }
  /// The parameters DDP reduces (those requiring a gradient, registration order).
  const std::vector<at::Tensor>& parameters() const noexcept { return params_; }
  /// Their names (as module->named_parameters()).
  const std::vector<std::string>& parameter_names() const noexcept { return names_; }
  /// The options given at construction.
  const ddp_options& options() const noexcept { return opt_; }
  /// The underlying reducer (bucket plan, per-bucket timings).
  const gradient_reducer<C>& reducer() const noexcept { return *reducer_; }
  /// The transport.
  C& communicator() const noexcept { return comm_; }

  /// Broadcasts every buffer of the module (e.g. BatchNorm running stats)
  /// from rank 0 (DDP's broadcast_buffers, which torch runs before each
  /// forward). Collective.
  /// @throws dpkit::invalid_argument for a buffer of an unsupported dtype or
  ///         layout; the collective's errors.
  void sync_buffers() {
    torch::NoGradGuard no_grad;
    for (const auto& b : module_->buffers(/*recurse=*/true)) broadcast_any(b);
  }

  /// RAII scope of DDP's no_sync(): backward passes inside accumulate
  /// gradients locally in p.grad() (the hooks do nothing) and finish()
  /// returns synchronized = false; the first step after the scope reduces
  /// the accumulated sums. Move-only.
  class no_sync_guard {
  public:
    no_sync_guard(no_sync_guard&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
    no_sync_guard& operator=(no_sync_guard&&) = delete;
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    /// Leaves no_sync mode.
    ~no_sync_guard() {
      if (d_) d_->no_sync_ = false;
    }

  private:
    friend class distributed_data_parallel;
    explicit no_sync_guard(distributed_data_parallel* d) : d_(d) {}
    distributed_data_parallel* d_;
  };

  /// Enters no_sync mode until the returned guard is destroyed (gradient
  /// accumulation; DDP's `with ddp.no_sync():`).
  /// @throws dpkit::invalid_argument if already in no_sync mode or a
  ///         synchronized backward has started (some hooks ran) and finish()
  ///         was not called yet.
  [[nodiscard]] no_sync_guard no_sync() {
    if (no_sync_) throw invalid_argument(prefix("no_sync") + "already inside a no_sync scope");
    if (ready_count_ != 0)
      throw invalid_argument(prefix("no_sync") + "a synchronized backward is in progress (" +
                             std::to_string(ready_count_) + " gradients ready); call finish() first");
    no_sync_ = true;
    return no_sync_guard(this);
  }
  /// True inside a no_sync scope.
  bool in_no_sync() const noexcept { return no_sync_; }

  /// Ends the step after backward: marks unused parameters (with
  /// find_unused_parameters), waits for every bucket's all-reduce and leaves
  /// the averaged gradients in p.grad() (with gradient_as_bucket_view p.grad()
  /// is the bucket slice). After the first synchronized step the buckets are
  /// rebuilt from rank 0's observed gradient order (rebuild_buckets).
  /// Collective: every rank calls it once per backward.
  /// @throws dpkit::error naming the parameters that got no gradient on this
  ///         rank (without find_unused_parameters; torch DDP's "Expected to
  ///         have finished reduction in the prior iteration before starting a
  ///         new one"); the step is discarded and the wrapper stays usable.
  /// @throws whatever a hook or a bucket's all-reduce threw (dpkit::error,
  ///         dpkit::timeout_error, ...), after discarding the step.
  ddp_step_result finish() {
    using clock = std::chrono::steady_clock;
    const auto called = clock::now();
    ddp_step_result res;
    if (no_sync_) return res;
    if (averager_ && averager_->step() != static_cast<long long>(synchronized_steps_)) {
      discard_step();
      throw invalid_argument(prefix("finish") + "inter_node_every " + std::to_string(opt_.inter_node_every) +
                             ": average_parameters() was called " + std::to_string(averager_->step()) +
                             " times after " + std::to_string(synchronized_steps_) +
                             " synchronized steps; call it once after every optimizer step (the nodes' "
                             "parameters would otherwise drift apart for good)");
    }
    if (hook_error_) {
      auto e = std::exchange(hook_error_, nullptr);
      discard_step();
      std::rethrow_exception(e);
    }
    if (ready_count_ != params_.size()) check_accumulators();
    if (opt_.find_unused_parameters) {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (ready_[i]) continue;
        auto bytes = reducer_->bucket_bytes(i);
        if (!bytes.empty()) std::memset(bytes.data(), 0, bytes.size());
        reducer_->mark_ready(i);
        ready_[i] = 2;
        ++res.unused_parameters;
      }
    }
    reduce_result r;
    try {
      r = reducer_->finish();
    } catch (...) {
      reset_ready();
      throw;
    }
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params_.size(); ++i) {
        at::Tensor& g = params_[i].mutable_grad();
        if (opt_.gradient_as_bucket_view) {
          if (!g.defined() || g.data_ptr() != static_cast<void*>(reducer_->bucket_bytes(i).data())) g = slot(i);
        } else if (!g.defined()) {
          g = slot(i).to(params_[i].device(), /*non_blocking=*/pinned_, /*copy=*/true);
        } else {
          g.copy_(slot(i), /*non_blocking=*/pinned_ && g.is_cuda());
        }
      }
      // the asynchronous copies out of the pinned buckets are complete
      // before the caller steps (and before the next backward writes the buckets)
      if (pinned_)
        for (const auto d : cuda_devices_) torch::cuda::synchronize(d);
    }
    res.synchronized = r.synchronized;
    res.all_finite = r.all_finite;
    res.grad_norm = r.grad_norm;
    if (device_stats_ && r.synchronized) gradient_stats(res);
    res.backward_end = any_hook_ ? last_hook_ : called;
    res.compute_end = any_hook_ && compute_end_ > last_hook_ ? compute_end_ : res.backward_end;
    res.ready = clock::now();
    res.exposed_seconds = std::chrono::duration<double>(res.ready - res.backward_end).count();
    res.exposed_after_compute_seconds = std::chrono::duration<double>(res.ready - res.compute_end).count();
    const auto& bs = reducer_->bucket_seconds();
    if (!bs.empty()) res.last_bucket_seconds = bs.back();
    last_ = res;
    reset_ready();
    ++synchronized_steps_;
    if (opt_.rebuild_buckets && synchronized_steps_ == 1) rebuild();
    return res;
  }

  /// The result of the last synchronized finish().
  const ddp_step_result& last_result() const noexcept { return last_; }

  /// The two-speed sync's large step (inter_node_every = k > 1): call it
  /// after every optimizer step, as torch's
  /// PeriodicModelAverager.average_parameters(model.parameters()); after
  /// steps 0, k, 2k, ... it replaces every parameter by its average over all
  /// ranks (one fused all-reduce per dtype, hierarchical across nodes) and
  /// returns true. With inter_node_every == 1 it does nothing and returns
  /// false. Collective.
  /// @throws the all-reduce's errors (timeout_error, mismatch_error, ...).
  bool average_parameters() {
    if (!averager_) return false;
    std::vector<gradient_ref> refs;
    refs.reserve(params_.size());
    for (auto& p : params_)
      refs.push_back({p.data_ptr(), static_cast<std::size_t>(p.numel()), check_torch_tensor(p, "average_parameters"),
                      memory_space::host});
    torch::NoGradGuard no_grad;
    return averager_->average_parameters(refs);
  }

  /// torch.nn.utils.clip_grad_norm_ on the averaged gradients, using the norm
  /// the last finish() computed in the reduction (no collective, no extra
  /// pass to compute it): every gradient is multiplied by min(1, max_norm /
  /// (norm + 1e-6)). Returns the total norm before clipping.
  /// @throws dpkit::invalid_argument without compute_stats, before the first
  ///         synchronized step, or for max_norm <= 0.
  double clip_grad_norm(double max_norm) {
    if (!opt_.compute_stats || synchronized_steps_ == 0)
      throw invalid_argument(prefix("clip_grad_norm") + "needs compute_stats and a finished synchronized step");
    if (!(max_norm > 0)) throw invalid_argument(prefix("clip_grad_norm") + "max_norm " + std::to_string(max_norm) + " must be > 0");
    const double norm = last_.grad_norm;
    const double coef = std::min(1.0, max_norm / (norm + 1e-6));
    torch::NoGradGuard no_grad;
    if (coef < 1.0)
      for (auto& p : params_)
        if (p.grad().defined()) p.mutable_grad().mul_(coef);
    return norm;
  }

private:
  std::string prefix(const char* what) const {
    return std::string("distributed_data_parallel::") + what + ": rank " + std::to_string(comm_.rank()) + " of " +
           std::to_string(comm_.size()) + ": ";
  }

  // Broadcasts t from rank 0 (a CUDA tensor through a host copy).
  void broadcast_any(const at::Tensor& t) {
    if (t.device().is_cpu()) {
      torch_broadcast(comm_, t, 0, opt_.collective);
      return;
    }
    at::Tensor h = t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    torch_broadcast(comm_, h, 0, opt_.collective);
    at::Tensor(t).copy_(h);
  }

  // all_finite and grad_norm from the (averaged, written back) CUDA
  // gradients, as the reducer's compute_stats defines them: the L2 norm over
  // every parameter accumulated in double; a NaN or Inf element makes the
  // sum of squares non-finite (a finite float squared cannot overflow a
  // double), which is !all_finite, and then grad_norm is NaN.
  void gradient_stats(ddp_step_result& res) {
    torch::NoGradGuard no_grad;
    std::map<c10::DeviceIndex, std::vector<at::Tensor>> sq; // per device: each gradient's squared norm
    for (const auto& p : params_) {
      const at::Tensor& g = p.grad();
      if (!g.defined() || g.numel() == 0) continue;
      sq[g.device().index()].push_back(
          at::linalg_vector_norm(g, 2, c10::nullopt, /*keepdim=*/false, at::kDouble).square());
    }
    double total = 0;
    for (auto& [dev, v] : sq) total += at::stack(v).sum().item().toDouble();
    res.all_finite = std::isfinite(total);
    res.grad_norm = res.all_finite ? std::sqrt(total) : std::numeric_limits<double>::quiet_NaN();
  }

  // Page-locked host memory from torch's pinned allocator for the reducer's
  // buckets (each block 64-byte aligned inside a pinned byte tensor, which
  // this allocator keeps alive until the reducer frees the block).
  static host_allocator pinned_allocator() {
    auto blocks = std::make_shared<std::map<void*, at::Tensor>>();
    return {[blocks](std::size_t bytes) -> void* {
              at::Tensor t = at::empty({static_cast<std::int64_t>(bytes + 64)},
                                       at::TensorOptions().dtype(at::kByte).pinned_memory(true));
              auto a = reinterpret_cast<std::uintptr_t>(t.data_ptr());
              void* p = reinterpret_cast<void*>((a + 63) / 64 * 64);
              (*blocks)[p] = std::move(t);
              return p;
            },
            [blocks](void* p, std::size_t) { blocks->erase(p); }};
  }

  // Parameter i's bucket slice as a CPU tensor of the parameter's shape.
  at::Tensor slot(std::size_t i) {
    auto bytes = reducer_->bucket_bytes(i);
    return torch::from_blob(static_cast<void*>(bytes.data()), params_[i].sizes(),
                            params_[i].options().device(at::kCPU).requires_grad(false));
  }

  void install_hooks() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
      std::weak_ptr<detail::ddp_hook_state<distributed_data_parallel>> weak = state_;
      hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            if (auto s = weak.lock(); s && s->owner) s->owner->on_gradient(i);
            return outputs;
          })));
      accumulators_.push_back(std::move(acc));
    }
  }

  // The post hook of parameter i's gradient accumulator: p.grad() holds its
  // gradient for this backward (accumulated onto what was there).
  void on_gradient(std::size_t i) noexcept {
    if (no_sync_ || hook_error_) return;
    try {
      if (ready_[i])
        throw error(prefix("backward") + "parameter " + std::to_string(i) + " ('" + names_[i] +
                    "') got a gradient twice before finish() (torch DDP: \"Expected to have finished reduction in "
                    "the prior iteration before starting a new one\"); call finish() after every backward, or "
                    "accumulate inside no_sync()");
      at::Tensor& g = params_[i].mutable_grad();
      if (g.defined()) {
        at::Tensor s = slot(i);
        if (g.data_ptr() != s.data_ptr()) {
          if (g.is_sparse()) throw invalid_argument(prefix("backward") + "sparse gradient of '" + names_[i] + "'");
          s.copy_(g);
          if (opt_.gradient_as_bucket_view) g = s;
        }
      } else {
        auto bytes = reducer_->bucket_bytes(i);
        if (!bytes.empty()) std::memset(bytes.data(), 0, bytes.size());
      }
      // taken before mark_ready: with comm_thread = false the bucket's
      // all-reduce runs inside it, and it is not hidden by backward
      last_hook_ = std::chrono::steady_clock::now();
      if (!any_hook_) queue_compute_end();
      reducer_->mark_ready(i);
      ready_[i] = 1;
      ++ready_count_;
      any_hook_ = true;
    } catch (...) {
      hook_error_ = std::current_exception();
    }
  }

  // Queues a final callback on the running backward's graph task that stamps
  // compute_end_ (where torch's Reducer records kBackwardComputeEnd). The
  // callback reaches the wrapper through the hook state, so it does nothing
  // if the wrapper was destroyed before the graph task ended. A stamp left
  // from an earlier step is older than last_hook_, which finish() checks.
  void queue_compute_end() {
    std::weak_ptr<detail::ddp_hook_state<distributed_data_parallel>> weak = state_;
    try {
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto s = weak.lock(); s && s->owner) s->owner->compute_end_ = std::chrono::steady_clock::now();
      });
    } catch (...) {
      // not inside a graph task (a hook invoked by hand): compute_end falls
      // back to the last hook
    }
  }

  // A parameter whose gradient accumulator was replaced after construction
  // (Tensor::set_data with another dtype or device, e.g. loading a checkpoint
  // onto another device) has lost its hook: say so instead of reporting it as
  // merely unused.
  void check_accumulators() {
    std::string replaced;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i] && torch::autograd::impl::try_get_grad_accumulator(params_[i]) != accumulators_[i])
        replaced += (replaced.empty() ? "'" : ", '") + names_[i] + "'";
    if (replaced.empty()) return;
    discard_step();
    throw invalid_argument(prefix("finish") + "the gradient accumulators of " + replaced +
                           " were replaced after the wrapper hooked them (set_data or a load that changed the dtype "
                           "or device); construct distributed_data_parallel after loading the weights");
  }

  void reset_ready() {
    std::fill(ready_.begin(), ready_.end(), std::uint8_t{0});
    ready_count_ = 0;
    any_hook_ = false;
  }

  // Ends a step that failed: the reducer's finish() discards its state (and
  // reports the missing parameters, which we drop in favour of the first error).
  void discard_step() {
    try {
      (void)reducer_->finish();
    } catch (...) {
    }
    reset_ready();
  }

  // DDP's bucket rebuild after the first iteration: the plan follows rank 0's
  // observed ready order; gradient views into the old buckets are copied into
  // the new ones.
  void rebuild() {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> keep;
    if (opt_.gradient_as_bucket_view)
      for (auto& p : params_) keep.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    if (!reducer_->rebuild_buckets()) return;
    if (opt_.gradient_as_bucket_view)
      for (std::size_t i = 0; i < params_.size(); ++i) {
        at::Tensor s = slot(i);
        if (keep[i].defined()) s.copy_(keep[i]);
        params_[i].mutable_grad() = s;
      }
  }

  std::shared_ptr<torch::nn::Module> module_;
  C& comm_;
  ddp_options opt_;
  std::shared_ptr<detail::ddp_hook_state<distributed_data_parallel>> state_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::unique_ptr<gradient_reducer<C>> reducer_;
  std::set<c10::DeviceIndex> cuda_devices_; // the devices of CUDA parameters
  bool pinned_ = false;                     // the buckets are pinned (pinned_allocator)
  bool device_stats_ = false;               // compute_stats on the GPU (gradient_stats)
  std::unique_ptr<periodic_model_averager<C>> averager_; // inter_node_every > 1
  // what torch::autograd::impl::grad_accumulator returns: std::shared_ptr<Node>
  // in torch 1.13, c10::intrusive_ptr<Node> in torch 2.15
  using accumulator_ptr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<accumulator_ptr> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  std::vector<std::uint8_t> ready_;
  std::size_t ready_count_ = 0;
  std::size_t synchronized_steps_ = 0;
  std::chrono::steady_clock::time_point last_hook_{};
  std::chrono::steady_clock::time_point compute_end_{};
  bool any_hook_ = false;
  bool no_sync_ = false;
  std::exception_ptr hook_error_;
  ddp_step_result last_;
};

} // namespace dpkit
