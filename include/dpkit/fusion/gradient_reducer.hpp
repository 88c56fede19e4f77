/// @file gradient_reducer.hpp
/// @brief `gradient_reducer`: DDP-style bucketed gradient all-reduce that
/// overlaps communication with backward (semantics of torch DDP's Reducer,
/// torch/csrc/distributed/c10d/reducer.cpp; docs/design.md "Fusion", docs/fusion.md).
///
/// @code
/// dpkit::gradient_reducer red(comm, grads);           // grads: registered gradient tensors
/// for (step...) {
///   for (i = n-1 .. 0) { compute grad i; red.mark_ready(i); }   // backward
///   auto r = red.finish();                              // averaged gradients in grads
///   if (r.all_finite) optimizer_step();
///   if (step == 0) red.rebuild_buckets();               // agree on the observed order
/// }
/// @endcode
///
/// Life of a step: every rank calls `mark_ready(i)` once per parameter, in any
/// local order. The reducer copies the gradient into its bucket's flat buffer
/// (or, with `gradient_as_bucket_view`, the caller already wrote it into
/// `bucket_view(i)`); when a bucket is complete its all-reduce is launched on
/// the transport's communication thread, always in bucket-index order on every
/// rank (a bucket that completes before a lower-index one waits until all lower
/// ones are launched, as DDP). `finish()` waits for the buckets, and writes the
/// (averaged) results back to the caller's gradient tensors.
///
/// Thread safety: one reducer is driven by one thread at a time (the
/// communication thread is the reducer's own business). The reducer is neither
/// copyable nor movable (in-flight collectives refer to it); it must be
/// destroyed on every rank, and its destructor waits for in-flight collectives.
#pragma once

#include "../collectives/async.hpp"
#include "../collectives/broadcast_tree.hpp"
#include "../collectives/symmetric_memory.hpp"
#include "../core/async.hpp"
#include "../core/element.hpp"
#include "../core/errors.hpp"
#include "../core/options.hpp"
#include "../core/reduce_op.hpp"
#include "../core/tensor.hpp"
#include "../transport/concept.hpp"
#include "bucket_plan.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpkit {

/// Gradient compression for the all-reduce (torch's fp16_compress_hook and
/// bf16_compress_hook): f32/f64 buckets are converted to the 16-bit type
/// (after the division by the world size, in the source precision),
/// all-reduced with sum in the 16-bit type (each pairwise step computed in f32
/// and rounded once), and converted back. Buckets of other types are never
/// compressed.
enum class gradient_compression : std::uint8_t { none, f16, bf16 };

/// "none", "f16" or "bf16".
inline constexpr std::string_view gradient_compression_name(gradient_compression c) noexcept {
  switch (c) {
  case gradient_compression::none: return "none";
  case gradient_compression::f16: return "f16";
  case gradient_compression::bf16: return "bf16";
  }
  return "?";
}
/// Prints gradient_compression_name(c).
inline std::ostream& operator<<(std::ostream& os, gradient_compression c) {
  return os << gradient_compression_name(c);
}

/// Where a gradient_reducer gets its host bucket buffers (default, empty
/// functions: 64-byte aligned operator new). A framework whose gradients live
/// on a GPU passes page-locked ("pinned") host memory here, so that its
/// copies between device gradients and the buckets run at the DMA engine's
/// speed instead of through the driver's pageable staging (on an H200, 474
/// MiB of GPT-2 gradients staged both ways: benchmarks/fusion_device_perf
/// (d) and (e)). dpkit::distributed_data_parallel does so for CUDA
/// parameters with torch's pinned allocator.
struct host_allocator {
  /// Returns `bytes` (> 0) writable bytes, 64-byte aligned, or throws; a
  /// null or misaligned result is rejected with dpkit::invalid_argument.
  std::function<void*(std::size_t bytes)> allocate;
  /// Frees what allocate returned (called with the same byte count); must
  /// not throw.
  std::function<void(void* p, std::size_t bytes)> deallocate;
  /// True when both functions are set.
  explicit operator bool() const noexcept { return allocate && deallocate; }
};

/// A host_allocator whose buffers are symmetric memory on comm
/// (allocate_symmetric): on one node, every rank maps every rank's buckets,
/// and each bucket's all-reduce (in place, from the two-shot's size up) runs
/// the shm all-reduce's direct path, one pass over memory instead of two
/// copies through the shared segment (docs/algorithms.md "Direct, over
/// symmetric memory"). Without a shared segment the buffers are private
/// memory. Each allocation is a collective on comm: give it only to a
/// gradient_reducer over the same comm, which allocates its buckets on every
/// rank in the same order (equal plans, checked) and only between steps
/// (construction, rebuild_buckets). The returned functions hold comm by
/// reference: comm must outlive the reducer. With fallback
/// symmetric_fallback::private_memory, a bucket the node cannot hold in
/// shared memory (/dev/shm too small) is private memory on every rank, and
/// its all-reduce runs the two-shot.
/// @throws (from allocate) what allocate_symmetric throws.
template <transport C>
host_allocator symmetric_bucket_allocator(C& comm, const collective_options& o = {},
                                          symmetric_fallback fallback = symmetric_fallback::none) {
  struct held {
    std::mutex mu;
    std::vector<symmetric_memory> blocks;
  };
  auto h = std::make_shared<held>();
  host_allocator a;
  a.allocate = [&comm, h, o, fallback](std::size_t bytes) -> void* {
    symmetric_memory m = allocate_symmetric(comm, bytes, o, fallback);
    void* p = m.data();
    std::lock_guard<std::mutex> lock(h->mu);
    h->blocks.push_back(std::move(m));
    return p;
  };
  a.deallocate = [h](void* p, std::size_t) noexcept {
    std::lock_guard<std::mutex> lock(h->mu);
    auto it = std::find_if(h->blocks.begin(), h->blocks.end(), [p](const symmetric_memory& m) { return m.data() == p; });
    if (it != h->blocks.end()) h->blocks.erase(it);
  };
  return a;
}

/// Options of a gradient_reducer (regular aggregate; compares and prints).
/// Every rank must pass equal options (the plan check catches differing
/// bucket policies).
struct reducer_options {
  bucket_policy buckets{};          ///< bucket size limits, bytes (DDP: 1 MiB first, 25 MiB cap)
  allreduce_policy algorithm{};     ///< all-reduce algorithm per bucket
  collective_options collective{};  ///< segment size, timeout, tag of every collective the reducer runs
  /// Average (divide by the world size, as DDP without a comm hook) rather
  /// than sum. Uncompressed buckets use reduce_op::avg (the division is fused
  /// into the all-reduce); compressed ones divide before compressing.
  bool divide_by_world_size = true;
  gradient_compression compression = gradient_compression::none; ///< 16-bit all-reduce of f32/f64 buckets
  /// DDP's gradient_as_bucket_view: the caller writes gradients straight into
  /// bucket_view(i) and calls mark_ready(i) without a tensor; results stay in
  /// the buckets (and are also copied to registered gradients, if any).
  bool gradient_as_bucket_view = false;
  /// Compute finish()'s all_finite flag and grad_norm. Costs one read pass
  /// over each reduced bucket (on the communication thread, overlapped with
  /// backward for all but the last bucket) and no communication: every rank
  /// holds the identical reduced buffer, and a NaN/Inf on any rank makes the
  /// reduced sum at that position non-finite.
  bool compute_stats = false;
  /// Where a ready bucket's all-reduce runs. true (default, DDP's way): on the
  /// transport's communication thread, overlapped with the rest of backward.
  /// false: at once on the thread that marked the bucket's last gradient ready
  /// (inside the gradient hook), so backward pauses for each bucket and
  /// finish() has nothing left to wait for. For ranks that outnumber cores,
  /// where a communication thread only takes turns with backward on the same
  /// core and its collectives stall whenever a peer's thread is descheduled
  /// (docs/torch-ddp.md, "comm_thread"). Errors are reported by finish() either way.
  bool comm_thread = true;
  /// All-reduce (and average over) the ranks of this rank's node only, not
  /// the world: the frequent half of a two-speed sync (the intra-node
  /// gradient all-reduce of torch's post_localSGD_hook with an intra-node
  /// subgroup). Parameters then drift apart between nodes until a
  /// periodic_model_averager averages them (model_averager.hpp). Needs a
  /// hierarchical_transport; on one node it is the world, with one rank per
  /// node nothing is communicated.
  bool node_local = false;
  friend bool operator==(const reducer_options&, const reducer_options&) = default;
};

/// Prints "reducer_options{buckets=..., algorithm=..., ...}".
inline std::ostream& operator<<(std::ostream& os, const reducer_options& o) {
  return os << "reducer_options{buckets=" << o.buckets << ", algorithm=" << o.algorithm << ", collective={"
            << o.collective << "}, divide_by_world_size=" << o.divide_by_world_size
            << ", compression=" << o.compression << ", gradient_as_bucket_view=" << o.gradient_as_bucket_view
            << ", compute_stats=" << o.compute_stats << ", comm_thread=" << o.comm_thread
            << ", node_local=" << o.node_local << "}";
}

/// What finish() reports.
struct reduce_result {
  /// False when finish() was called inside a no_sync scope (nothing was
  /// communicated or written).
  bool synchronized = false;
  /// With compute_stats: false if any element of the reduced gradient is NaN
  /// or infinite, i.e. some rank had a NaN/Inf (or the sum overflowed): skip
  /// the optimizer step. Identical on every rank. True without compute_stats.
  bool all_finite = true;
  /// With compute_stats: the global L2 norm of the reduced gradient as
  /// written back (averaged when divide_by_world_size), over all parameters,
  /// accumulated in double. Identical on every rank. NaN without compute_stats
  /// or when !all_finite.
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
};

/// A type-erased, writable gradient tensor: pointer, element count, element
/// type, memory space. Build one from any dpkit::tensor with gradient_ref::of.
struct gradient_ref {
  void* data = nullptr;                    ///< first element
  std::size_t count = 0;                   ///< elements
  element_type type = element_type::f32;   ///< element type
  memory_space space = memory_space::host; ///< where data points

  /// Size in bytes.
  std::size_t bytes() const noexcept { return count * element_size(type); }
  /// The planner's view of this gradient.
  param_info info() const noexcept { return {bytes(), type, space}; }
  /// Refers to tensor t (which must outlive the use of the ref).
  template <tensor T>
  static gradient_ref of(T& t) {
    auto s = as_span(t);
    static_assert(!std::is_const_v<typename decltype(s)::element_type>, "dpkit: gradient_ref needs a mutable tensor");
    return {static_cast<void*>(s.data()), s.size(), element_type_of_v<tensor_value_t<T>>, space_of(t)};
  }
};

namespace detail {

// 64-byte aligned raw storage (vector-friendly bucket buffers), from
// operator new or from a host_allocator (kept alive by a shared_ptr).
class aligned_bytes {
public:
  aligned_bytes() = default;
  explicit aligned_bytes(std::size_t n) : n_(n) {
    if (n) p_ = static_cast<std::byte*>(::operator new(n, std::align_val_t{64}));
  }
  aligned_bytes(std::size_t n, std::shared_ptr<const host_allocator> a, const std::string& what) : n_(n) {
    if (!a || !*a || n == 0) {
      if (n) p_ = static_cast<std::byte*>(::operator new(n, std::align_val_t{64}));
      return;
    }
    void* p = a->allocate(n);
    if (!p) throw invalid_argument(what + "host_allocator returned null for " + std::to_string(n) + " bytes");
    if (reinterpret_cast<std::uintptr_t>(p) % 64 != 0) {
      a->deallocate(p, n);
      throw invalid_argument(what + "host_allocator returned an address that is not 64-byte aligned (" +
                             std::to_string(reinterpret_cast<std::uintptr_t>(p) % 64) + " bytes past) for " +
                             std::to_string(n) + " bytes");
    }
    p_ = static_cast<std::byte*>(p);
    alloc_ = std::move(a);
  }
  aligned_bytes(aligned_bytes&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), alloc_(std::move(o.alloc_)) {}
  aligned_bytes& operator=(aligned_bytes&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      alloc_ = std::move(o.alloc_);
    }
    return *this;
  }
  aligned_bytes(const aligned_bytes&) = delete;
  aligned_bytes& operator=(const aligned_bytes&) = delete;
  ~aligned_bytes() { release(); }
  std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

private:
  void release() noexcept {
    if (p_) {
      if (alloc_) alloc_->deallocate(p_, n_);
      else ::operator delete(p_, std::align_val_t{64});
    }
    p_ = nullptr;
    alloc_.reset();
  }
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
  std::shared_ptr<const host_allocator> alloc_;
};

// dst[i] += src[i] for `count` elements of type t (host).
inline void accumulate_bytes(void* dst, const void* src, std::size_t count, element_type t) {
  if (count == 0) return;
  visit_element_type(t, [&](auto z) {
    using T = decltype(z);
    reduce_host<T>(static_cast<T*>(dst), static_cast<const T*>(dst), static_cast<const T*>(src), count,
                   reduce_op::sum);
  });
}

template <class T>
inline double sum_of_squares(const T* p, std::size_t n) noexcept {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::size_t i = 0;
  auto val = [&](std::size_t k) -> double {
    if constexpr (is_half_v<T>) return static_cast<double>(T::to_float(p[k].bits));
    else return static_cast<double>(p[k]);
  };
  for (; i + 4 <= n; i += 4) {
    const double a = val(i), b = val(i + 1), c = val(i + 2), d = val(i + 3);
    s0 += a * a;
    s1 += b * b;
    s2 += c * c;
    s3 += d * d;
  }
  for (; i < n; ++i) s0 += val(i) * val(i);
  return (s0 + s1) + (s2 + s3);
}

} // namespace detail

/// Bucketed gradient all-reduce over transport C (dpkit::mpi, dpkit::inproc,
/// or any async_transport), matching torch DDP's Reducer: buckets from
/// plan_buckets (reverse registration order, 1 MiB first bucket, 25 MiB cap,
/// one element type and memory space per bucket), bucket all-reduces launched
/// as soon as a bucket is full, in bucket-index order on every rank; averaging
/// by the world size; no_sync gradient accumulation; bucket rebuild from the
/// observed ready order agreed from rank 0.
///
/// Host memory only for now: a parameter in device memory is rejected with
/// dpkit::invalid_argument at construction.
template <async_transport C>
class gradient_reducer {
public:
  /// Creates a reducer for parameters described by `params` (registration
  /// order), without registered gradient tensors: gradients come through
  /// mark_ready(i, grad) or bucket_view(i), results go to finish(out) or stay
  /// in the bucket views. Collective on comm: every rank must construct its
  /// reducer (same parameters and options) at the same point.
  /// @param names optional parameter names (registration order) for error
  ///        messages; empty or one per parameter.
  /// @param buffers where the host bucket buffers come from (also after a
  ///        bucket rebuild); empty: operator new. Need not be equal on every
  ///        rank.
  /// @throws dpkit::invalid_argument for a device-memory parameter, a size
  ///         that is not a multiple of the element size, names of the wrong
  ///         length, a null or misaligned allocation from `buffers`, or when
  ///         ranks disagree on the parameters or the bucket plan (naming the
  ///         first differing parameter index) - thrown on every rank, never a
  ///         hang. What buffers.allocate throws passes through.
  gradient_reducer(C& comm, std::vector<param_info> params, const reducer_options& options = {},
                   std::vector<std::string> names = {}, host_allocator buffers = {})
      : comm_(comm), opt_(options), params_(std::move(params)), names_(std::move(names)),
        alloc_(buffers ? std::make_shared<const host_allocator>(std::move(buffers)) : nullptr) {
    init();
  }

  /// Creates a reducer with registered gradient tensors (registration order):
  /// mark_ready(i) copies grads[i] in (unless gradient_as_bucket_view), and
  /// finish() writes the results back into grads[i]. The tensors must stay
  /// valid while the reducer uses them. Otherwise as the other constructor.
  gradient_reducer(C& comm, std::vector<gradient_ref> grads, const reducer_options& options = {},
                   std::vector<std::string> names = {}, host_allocator buffers = {})
      : comm_(comm), opt_(options), names_(std::move(names)), grads_(std::move(grads)),
        alloc_(buffers ? std::make_shared<const host_allocator>(std::move(buffers)) : nullptr) {
    params_.reserve(grads_.size());
    for (const auto& g : grads_) params_.push_back(g.info());
    init();
  }

  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;

  /// Waits for in-flight bucket all-reduces (errors are swallowed here; call
  /// finish() to see them).
  ~gradient_reducer() { drain_quietly(); }

  /// Number of parameters.
  std::size_t num_params() const noexcept { return params_.size(); }
  /// The current bucket plan (identical on every rank).
  const bucket_plan& plan() const noexcept { return plan_; }
  /// The options given at construction.
  const reducer_options& options() const noexcept { return opt_; }
  /// The transport the reducer communicates on.
  C& communicator() const noexcept { return comm_; }
  /// The bucket holding parameter i and its byte offset inside the bucket.
  /// @throws dpkit::invalid_argument if i is out of range.
  std::pair<std::size_t, std::size_t> locate(std::size_t i) const {
    check_index(i, "locate");
    return {loc_[i].bucket, loc_[i].offset};
  }
  /// Number of buckets whose all-reduce has been launched in the current step.
  std::size_t buckets_launched() const noexcept { return next_launch_; }
  /// The gradient-ready order of the last completed synchronized step (empty
  /// before the first one); rebuild_buckets uses rank 0's.
  const std::vector<std::size_t>& observed_order() const noexcept { return last_order_; }
  /// Wall-clock seconds each bucket's reduction took on the communication
  /// thread (all-reduce, compression and statistics; plan order) in the last
  /// synchronized step; valid after finish() returned, until the next step's
  /// buckets launch. Used to compare the exposed communication with the last
  /// bucket's all-reduce time.
  const std::vector<double>& bucket_seconds() const noexcept { return bucket_sec_; }

  /// Parameter i's slice of its bucket's flat buffer, as a tensor_view<T>
  /// (DDP's gradient_as_bucket_view). Write the gradient there and call
  /// mark_ready(i). After finish() it holds the reduced result. Invalidated by
  /// rebuild_buckets().
  /// @throws dpkit::invalid_argument if i is out of range or T is not the
  ///         parameter's element type.
  template <element T>
  tensor_view<T> bucket_view(std::size_t i) {
    check_index(i, "bucket_view");
    if (element_type_of_v<T> != params_[i].type)
      throw invalid_argument(prefix("bucket_view") + "parameter " + label(i) + " has element type " +
                             std::string(element_type_name(params_[i].type)) + ", requested " +
                             std::string(element_type_name(element_type_of_v<T>)));
    return {reinterpret_cast<T*>(slot(i)), params_[i].bytes / sizeof(T), memory_space::host};
  }
  /// Parameter i's slice of its bucket as raw bytes (params[i].bytes long).
  /// @throws dpkit::invalid_argument if i is out of range.
  std::span<std::byte> bucket_bytes(std::size_t i) {
    check_index(i, "bucket_bytes");
    return {slot(i), params_[i].bytes};
  }

  /// Marks parameter i's gradient ready, taking it from where the reducer
  /// knows it: with gradient_as_bucket_view, from bucket_view(i) (no copy);
  /// otherwise from the gradient registered at construction (copied, or
  /// added inside no_sync / after no_sync accumulation). Launches the
  /// all-reduce of every bucket that became launchable (see the class comment).
  /// @throws dpkit::invalid_argument if i is out of range, parameter i was
  ///         already marked in this step, or there is no gradient to take
  ///         (no registered gradient and not gradient_as_bucket_view).
  void mark_ready(std::size_t i) {
    check_index(i, "mark_ready");
    check_not_marked(i);
    if (!opt_.gradient_as_bucket_view) {
      if (grads_.empty())
        throw invalid_argument(prefix("mark_ready") + "parameter " + label(i) +
                               ": no gradient registered; pass it as mark_ready(i, grad) or write it into "
                               "bucket_view(i) with options.gradient_as_bucket_view");
      take(i, grads_[i].data);
    }
    after_take(i);
  }

  /// Marks parameter i ready with gradient `grad` (any dpkit::tensor of the
  /// parameter's element type and element count, host memory), which is
  /// copied into the bucket (added to it inside no_sync or after no_sync
  /// accumulation); `grad` may be reused as soon as this returns.
  /// @throws dpkit::invalid_argument if i is out of range, already marked in
  ///         this step, or grad's element type, count or memory space differs
  ///         from the parameter's.
  template <tensor G>
  void mark_ready(std::size_t i, const G& grad) {
    check_index(i, "mark_ready");
    using T = tensor_value_t<G>;
    if (element_type_of_v<T> != params_[i].type || size_of(grad) * sizeof(T) != params_[i].bytes ||
        space_of(grad) != memory_space::host)
      throw invalid_argument(prefix("mark_ready") + "parameter " + label(i) + " expects " +
                             std::to_string(params_[i].bytes / element_size(params_[i].type)) + " " +
                             std::string(element_type_name(params_[i].type)) + " elements in host memory, got " +
                             std::to_string(size_of(grad)) + " " +
                             std::string(element_type_name(element_type_of_v<T>)) + " in " +
                             std::string(memory_space_name(space_of(grad))) + " memory");
    check_not_marked(i);
    take(i, static_cast<const void*>(as_span(grad).data()));
    after_take(i);
  }

  /// Ends the step: waits for every bucket's all-reduce; the results are in
  /// the registered gradients (if any; with gradient_as_bucket_view and none
  /// registered they stay in the buckets). Registered gradients are written
  /// by the communication thread as soon as their bucket's all-reduce is done,
  /// so between mark_ready(i) and finish() the caller must not touch
  /// registered gradient i (DDP's contract for .grad during backward).
  /// Inside a no_sync scope it does nothing and returns synchronized = false.
  /// Collective: every rank calls it once per step.
  /// @throws dpkit::error if some parameters were not marked ready (DDP's
  ///         "Expected to have finished reduction in the prior iteration"
  ///         case), naming their indices and names; the step is discarded
  ///         (after waiting for the buckets that were launched) and the
  ///         reducer can be used again.
  /// @throws whatever a bucket's all-reduce threw (dpkit::timeout_error, ...).
  reduce_result finish() {
    if (grads_.empty()) return finish_impl(nullptr);
    return finish_impl(&grads_);
  }

  /// As finish(), writing the results into `out` (one tensor per parameter,
  /// registration order, same element types and counts, host memory).
  /// @throws dpkit::invalid_argument if out's length or a tensor's type or
  ///         count differs (before anything is waited for: the step stays
  ///         open and finish may be called again).
  reduce_result finish(std::span<const gradient_ref> out) {
    if (no_sync_) return reduce_result{};
    if (out.size() != params_.size())
      throw invalid_argument(prefix("finish") + "got " + std::to_string(out.size()) + " output tensors for " +
                             std::to_string(params_.size()) + " parameters");
    for (std::size_t i = 0; i < out.size(); ++i)
      if (out[i].info() != params_[i])
        throw invalid_argument(prefix("finish") + "output tensor for parameter " + label(i) + " has " +
                               std::to_string(out[i].count) + " " + std::string(element_type_name(out[i].type)) +
                               " elements in " + std::string(memory_space_name(out[i].space)) +
                               " memory, expected " + std::to_string(params_[i].bytes / element_size(params_[i].type)) +
                               " " + std::string(element_type_name(params_[i].type)) + " in host memory");
    std::vector<gradient_ref> tmp(out.begin(), out.end());
    return finish_impl(&tmp);
  }

  /// RAII scope of DDP's no_sync(): while it lives, mark_ready accumulates
  /// gradients locally (sum) in the buckets and communicates nothing; the next
  /// synchronized step all-reduces the accumulated sums. Move-only.
  class no_sync_guard {
  public:
    no_sync_guard(no_sync_guard&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
    no_sync_guard& operator=(no_sync_guard&&) = delete;
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    /// Leaves no_sync mode.
    ~no_sync_guard() {
      if (r_) r_->no_sync_ = false;
    }

  private:
    friend class gradient_reducer;
    explicit no_sync_guard(gradient_reducer* r) : r_(r) {}
    gradient_reducer* r_;
  };

  /// Enters no_sync mode until the returned guard is destroyed (gradient
  /// accumulation, DDP's `with model.no_sync():`). With
  /// gradient_as_bucket_view the caller accumulates into bucket_view(i) itself.
  /// @throws dpkit::invalid_argument if already in no_sync mode or a
  ///         synchronized step is in progress (some parameters marked).
  [[nodiscard]] no_sync_guard no_sync() {
    if (no_sync_) throw invalid_argument(prefix("no_sync") + "already inside a no_sync scope");
    if (marked_count_ != 0)
      throw invalid_argument(prefix("no_sync") + "a synchronized step is in progress (" +
                             std::to_string(marked_count_) + " parameters marked); call finish() first");
    no_sync_ = true;
    return no_sync_guard(this);
  }
  /// True inside a no_sync scope.
  bool in_no_sync() const noexcept { return no_sync_; }

  /// Rebuilds the buckets from the gradient-ready order rank 0 observed in its
  /// last completed synchronized step (torch DDP's rebuild_buckets: rank 0's
  /// assignment is broadcast so every rank holds the same plan). Collective:
  /// every rank calls it at the same point, between steps. Returns false (on
  /// every rank) if rank 0 has no observed order yet. bucket_view pointers
  /// are invalidated.
  /// @throws dpkit::invalid_argument inside no_sync, during a step, with
  ///         accumulated no_sync gradients pending, or if the resulting plans
  ///         differ across ranks.
  bool rebuild_buckets() {
    if (no_sync_ || marked_count_ != 0)
      throw invalid_argument(prefix("rebuild_buckets") + "call it between steps, outside no_sync");
    for (std::size_t i = 0; i < accumulated_.size(); ++i)
      if (accumulated_[i])
        throw invalid_argument(prefix("rebuild_buckets") + "parameter " + label(i) +
                               " holds no_sync-accumulated gradients; finish a synchronized step first");
    const std::size_t n = params_.size();
    std::vector<std::uint64_t> msg(n + 1, 0);
    if (comm_.rank() == 0 && last_order_.size() == n) {
      msg[0] = 1;
      for (std::size_t k = 0; k < n; ++k) msg[k + 1] = last_order_[k];
    }
    run_on_comm([&] { broadcast_tree(comm_, msg, 0, opt_.collective); });
    if (msg[0] == 0) return false;
    std::vector<std::size_t> order(n);
    for (std::size_t k = 0; k < n; ++k) order[k] = static_cast<std::size_t>(msg[k + 1]);
    bucket_plan p = plan_buckets_from_order(params_, order, opt_.buckets);
    verify_plan(p);
    install(std::move(p));
    return true;
  }

private:
  struct locator {
    std::size_t bucket = 0;
    std::size_t offset = 0; // bytes
  };

  std::string prefix(const char* what) const {
    return std::string("gradient_reducer::") + what + ": rank " + std::to_string(comm_.rank()) + " of " +
           std::to_string(comm_.size()) + ": ";
  }
  std::string label(std::size_t i) const {
    std::string s = std::to_string(i);
    if (i < names_.size()) s += " ('" + names_[i] + "')";
    return s;
  }
  void check_index(std::size_t i, const char* what) const {
    if (i >= params_.size())
      throw invalid_argument(prefix(what) + "parameter index " + std::to_string(i) + " out of range for " +
                             std::to_string(params_.size()) + " parameters");
  }
  void check_not_marked(std::size_t i) const {
    if (!no_sync_ && marked_[i])
      throw invalid_argument(prefix("mark_ready") + "parameter " + label(i) +
                             " marked ready twice in one step (call finish() once per step)");
  }
  std::byte* slot(std::size_t i) const { return bufs_[loc_[i].bucket].data() + loc_[i].offset; }

  void init() {
    if (!names_.empty() && names_.size() != params_.size())
      throw invalid_argument(prefix("gradient_reducer") + "got " + std::to_string(names_.size()) + " names for " +
                             std::to_string(params_.size()) + " parameters");
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (params_[i].space != memory_space::host)
        throw invalid_argument(prefix("gradient_reducer") + "parameter " + label(i) +
                               " is in device memory; gradient_reducer supports host memory only");
    if constexpr (!hierarchical_transport<C>)
      if (opt_.node_local)
        throw invalid_argument(prefix("gradient_reducer") +
                               "node_local needs a transport that knows its nodes (a hierarchical_transport: "
                               "dpkit::mpi, dpkit::inproc)");
    marked_.assign(params_.size(), 0);
    accumulated_.assign(params_.size(), 0);
    bucket_plan p = plan_buckets(params_, opt_.buckets);
    verify_plan(p);
    install(std::move(p));
  }

  void install(bucket_plan p) {
    plan_ = std::move(p);
    loc_.assign(params_.size(), locator{});
    bufs_.clear();
    std::size_t max_elems = 0;
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
      const auto& bk = plan_.buckets[b];
      std::size_t off = 0;
      for (auto i : bk.params) {
        loc_[i] = {b, off};
        off += params_[i].bytes;
      }
      bufs_.emplace_back(bk.bytes, alloc_, prefix("gradient_reducer"));
      if (bk.bytes) std::memset(bufs_.back().data(), 0, bk.bytes);
      max_elems = std::max(max_elems, bk.bytes / element_size(bk.type));
    }
    scratch_ = detail::aligned_bytes(opt_.compression == gradient_compression::none ? 0 : max_elems * 2);
    remaining_.assign(plan_.buckets.size(), 0);
    handles_.assign(plan_.buckets.size(), collective_handle{});
    sumsq_.assign(plan_.buckets.size(), 0.0);
    bucket_sec_.assign(plan_.buckets.size(), 0.0);
    reset_step();
  }

  void reset_step() {
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) remaining_[b] = plan_.buckets[b].params.size();
    std::fill(marked_.begin(), marked_.end(), std::uint8_t{0});
    std::fill(handles_.begin(), handles_.end(), collective_handle{});
    marked_count_ = 0;
    next_launch_ = 0;
    inline_failed_ = false;
    order_.clear();
  }

  // Runs f on the communication thread (after everything queued) and waits.
  template <class F>
  void run_on_comm(F&& f) {
    comm_.progress().submit(std::function<void()>(std::forward<F>(f))).wait();
  }

  // Checks that every rank holds the same plan: one all-reduce (max) of
  // {h, ~h, n, ~n}; on a mismatch a second one of per-parameter descriptors
  // finds the first differing parameter. Every rank sees the same reduced
  // values, so every rank throws the same error.
  void verify_plan(const bucket_plan& p) {
    const std::uint64_t h = p.fingerprint() ^ (static_cast<std::uint64_t>(opt_.buckets.first_bucket_bytes) * 31u) ^
                            (static_cast<std::uint64_t>(opt_.buckets.bucket_cap_bytes) * 1000003u);
    const std::uint64_t n = params_.size();
    std::vector<std::uint64_t> v{h, ~h, n, ~n};
    run_on_comm([&] { allreduce(comm_, v, v, reduce_op::max, allreduce_policy{}, opt_.collective); });
    if (v[2] != ~v[3])
      throw invalid_argument(prefix("gradient_reducer") + "ranks disagree on the number of parameters: this rank has " +
                             std::to_string(n) + ", others between " + std::to_string(~v[3]) + " and " +
                             std::to_string(v[2]));
    if (v[0] == ~v[1]) return;
    std::vector<std::uint64_t> d(2 * n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t x = (static_cast<std::uint64_t>(params_[i].bytes) << 6) |
                              (static_cast<std::uint64_t>(params_[i].type) << 1) |
                              static_cast<std::uint64_t>(params_[i].space);
      d[2 * i] = x;
      d[2 * i + 1] = ~x;
    }
    run_on_comm([&] { allreduce(comm_, d, d, reduce_op::max, allreduce_policy{}, opt_.collective); });
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t hi = d[2 * i], lo = ~d[2 * i + 1];
      if (hi == lo) continue;
      const auto desc = [](std::uint64_t x) {
        return std::to_string(x >> 6) + " bytes of " +
               std::string(element_type_name(static_cast<element_type>((x >> 1) & 31u)));
      };
      throw invalid_argument(prefix("gradient_reducer") + "bucket plans differ across ranks: parameter " + label(i) +
                             " is " + desc(lo) + " on some rank and " + desc(hi) + " on another (this rank: " +
                             std::to_string(params_[i].bytes) + " bytes of " +
                             std::string(element_type_name(params_[i].type)) + ")");
    }
    std::ostringstream os;
    os << opt_.buckets;
    throw invalid_argument(prefix("gradient_reducer") +
                           "bucket plans differ across ranks although every parameter agrees: the bucket policy or "
                           "ready order differs (this rank: " + os.str() + ")");
  }

  // Copies (or adds) the gradient at src into parameter i's slot.
  void take(std::size_t i, const void* src) {
    std::byte* dst = slot(i);
    const std::size_t bytes = params_[i].bytes;
    if (bytes == 0 || src == static_cast<const void*>(dst)) return;
    if (accumulated_[i]) detail::accumulate_bytes(dst, src, bytes / element_size(params_[i].type), params_[i].type);
    else std::memcpy(dst, src, bytes);
  }

  void after_take(std::size_t i) {
    if (no_sync_) {
      accumulated_[i] = 1;
      return;
    }
    accumulated_[i] = 0;
    marked_[i] = 1;
    ++marked_count_;
    order_.push_back(i);
    const std::size_t b = loc_[i].bucket;
    if (--remaining_[b] == 0) launch_ready();
  }

  void launch_ready() {
    while (next_launch_ < plan_.buckets.size() && remaining_[next_launch_] == 0) {
      const std::size_t b = next_launch_++;
      if (opt_.comm_thread) {
        handles_[b] = comm_.progress().submit([this, b] { reduce_bucket(b); });
        continue;
      }
      // on this thread, now; a failure is kept for finish() like the
      // communication thread's (and the buckets after it are not run)
      auto st = std::make_shared<detail::task_state>();
      st->done = true;
      if (!inline_failed_) {
        try {
          reduce_bucket(b);
        } catch (...) {
          st->error = std::current_exception();
          inline_failed_ = true;
        }
      }
      handles_[b] = collective_handle(std::move(st));
    }
  }

  // Runs on the communication thread: (compress,) all-reduce, (decompress,) stats.
  void reduce_bucket(std::size_t b) {
    const auto started = std::chrono::steady_clock::now();
    const bucket& bk = plan_.buckets[b];
    const std::size_t count = bk.bytes / element_size(bk.type);
    const std::size_t world = sync_group_size();
    visit_element_type(bk.type, [&](auto z) {
      using T = decltype(z);
      T* data = reinterpret_cast<T*>(bufs_[b].data());
      bool done = false;
      if constexpr (std::is_floating_point_v<T>) {
        if (opt_.compression != gradient_compression::none) {
          if (opt_.compression == gradient_compression::f16) reduce_compressed<T, f16>(data, count, world);
          else reduce_compressed<T, bf16>(data, count, world);
          done = true;
        }
      }
      if (!done) {
        const reduce_op op = opt_.divide_by_world_size ? reduce_op::avg : reduce_op::sum;
        tensor_view<T> v{data, count, memory_space::host};
        on_sync_group([&](auto& g) { allreduce(g, v, v, op, opt_.algorithm, opt_.collective); });
      }
      if (opt_.compute_stats) sumsq_[b] = detail::sum_of_squares(data, count);
    });
    bucket_sec_[b] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    // Write the bucket back to the registered gradients right away, so only
    // the last bucket's copy is left for finish().
    if (!grads_.empty())
      for (auto i : bk.params) {
        const gradient_ref& g = grads_[i];
        if (params_[i].bytes && g.data != static_cast<void*>(slot(i))) std::memcpy(g.data, slot(i), params_[i].bytes);
      }
  }

  // Runs f on the transport the gradients are synchronized over: the world,
  // or with node_local this rank's node (nothing with one rank per node).
  template <class F>
  void on_sync_group(F&& f) {
    if constexpr (hierarchical_transport<C>) {
      if (opt_.node_local && comm_.topology().nodes() > 1) {
        if (auto* node = comm_.node_transport()) f(*node);
        return;
      }
    }
    f(comm_);
  }
  // The ranks the gradients are averaged over.
  std::size_t sync_group_size() const {
    if constexpr (hierarchical_transport<C>)
      if (opt_.node_local) return static_cast<std::size_t>(comm_.topology().local_size());
    return static_cast<std::size_t>(comm_.size());
  }

  template <class T, class H>
  void reduce_compressed(T* data, std::size_t count, std::size_t world) {
    H* h = reinterpret_cast<H*>(scratch_.data());
    const T d = opt_.divide_by_world_size ? static_cast<T>(world) : T(1);
    for (std::size_t i = 0; i < count; ++i) h[i].bits = H::from_float(static_cast<float>(data[i] / d));
    tensor_view<H> v{h, count, memory_space::host};
    on_sync_group([&](auto& g) { allreduce(g, v, v, reduce_op::sum, opt_.algorithm, opt_.collective); });
    for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<T>(H::to_float(h[i].bits));
  }

  void drain_quietly() noexcept {
    for (auto& h : handles_) {
      try {
        h.wait();
      } catch (...) {
      }
    }
  }

  reduce_result finish_impl(const std::vector<gradient_ref>* out) {
    if (no_sync_) return reduce_result{};
    if (marked_count_ != params_.size()) {
      drain_quietly();
      std::string missing;
      std::size_t shown = 0, total = 0;
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (marked_[i]) continue;
        ++total;
        if (shown < 32) {
          missing += (shown ? ", " : "") + label(i);
          ++shown;
        }
      }
      if (total > shown) missing += ", ... (" + std::to_string(total - shown) + " more)";
      reset_step();
      std::fill(accumulated_.begin(), accumulated_.end(), std::uint8_t{0});
      throw error(prefix("finish") + "expected all " + std::to_string(params_.size()) +
                  " parameters to be marked ready before finish() (torch DDP: \"Expected to have finished reduction "
                  "in the prior iteration before starting a new one\"): " + std::to_string(total) +
                  " parameters did not receive a gradient on this rank: " + missing +
                  ". Every parameter must be marked ready once per synchronized step, on every rank.");
    }
    reduce_result res;
    res.synchronized = true;
    double sumsq = 0;
    std::exception_ptr err;
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
      try {
        handles_[b].wait();
      } catch (...) {
        if (!err) err = std::current_exception();
        continue;
      }
      if (err) continue;
      sumsq += sumsq_[b];
      if (out && out != &grads_) { // registered gradients were written on the communication thread
        for (auto i : plan_.buckets[b].params) {
          const gradient_ref& g = (*out)[i];
          if (params_[i].bytes && g.data != static_cast<void*>(slot(i))) std::memcpy(g.data, slot(i), params_[i].bytes);
        }
      }
    }
    if (err) {
      reset_step();
      std::rethrow_exception(err);
    }
    if (opt_.compute_stats) {
      res.all_finite = std::isfinite(sumsq);
      res.grad_norm = res.all_finite ? std::sqrt(sumsq) : std::numeric_limits<double>::quiet_NaN();
    }
    last_order_ = order_;
    reset_step();
    return res;
  }

  C& comm_;
  reducer_options opt_;
  std::vector<param_info> params_;
  std::vector<std::string> names_;
  std::vector<gradient_ref> grads_;
  std::shared_ptr<const host_allocator> alloc_; // bucket buffers' source (null: operator new)
  bucket_plan plan_;
  std::vector<locator> loc_;
  std::vector<detail::aligned_bytes> bufs_;
  detail::aligned_bytes scratch_;
  std::vector<std::size_t> remaining_;
  std::vector<collective_handle> handles_;
  bool inline_failed_ = false; // comm_thread == false: a bucket's all-reduce failed this step
  std::vector<double> sumsq_;
  std::vector<double> bucket_sec_;
  std::vector<std::uint8_t> marked_;
  std::vector<std::uint8_t> accumulated_;
  std::vector<std::size_t> order_;
  std::vector<std::size_t> last_order_;
  std::size_t marked_count_ = 0;
  std::size_t next_launch_ = 0;
  bool no_sync_ = false;
};

} // namespace dpkit
