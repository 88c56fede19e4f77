/// @file nccl.hpp
/// @brief The NCCL transport: an ncclComm_t plus a cudaStream_t; moves CUDA
/// device memory point-to-point (ncclSend/ncclRecv) and exposes NCCL's own
/// collectives (ncclAllReduce, ...) for algorithm::native.
///
/// Needs cuda_runtime_api.h and nccl.h; compiles with g++ or nvcc. Link
/// libnccl and libcudart (meson: nccl_dep). Only the CUDA build includes it.
///
/// @code
/// // one process per GPU, launched by mpirun (see nccl_mpi.hpp):
/// dpkit::nccl comm = dpkit::nccl_from_mpi(MPI_COMM_WORLD);
/// dpkit::device_buffer<float> g(n);
/// dpkit::allreduce(comm, g, dpkit::reduce_op::sum, {dpkit::algorithm::native});  // ncclAllReduce
/// // ring/tree on device tensors need the reduction kernels (nvcc): in a .cu file
/// //   dpkit::nccl_options o; o.kernels = dpkit::cuda_kernels();
/// @endcode
///
/// Point-to-point design. ncclSend/ncclRecv are blocking for the GPU: two
/// operations on one communicator's stream run one after the other, so an
/// algorithm that posts a send and then a receive (ring, tree) would deadlock
/// once messages outgrow NCCL's buffers. Like PyTorch's ProcessGroupNCCL (one
/// communicator per peer pair), this transport therefore gives every ordered
/// pair (src -> dst) its own two-rank communicator and stream, made with
/// ncclCommSplit at construction (2(n-1) splits, collective over all ranks;
/// disable with nccl_options::point_to_point = false). On such a channel one
/// side only sends and the other only receives, so each channel is a FIFO pipe
/// that progresses independently of all others, which is the progress MPI
/// gives and the algorithms assume. Each isend/irecv is one ncclSend/ncclRecv
/// inside ncclGroupStart/ncclGroupEnd on the channel's stream, ordered after
/// all work already enqueued on the transport's stream, followed by a
/// cudaEvent; a request is complete when its event is.
///
/// Differences from the transport concept's MPI-like rules, all harmless for
/// dpkit's algorithms: tags are not matched (messages between a pair are FIFO
/// regardless of tag, so concurrent exchanges with one peer must be posted in
/// the same order on both sides); a rank cannot send to itself; an incomplete
/// request cannot be withdrawn (NCCL has no cancel), so destroying one leaves
/// the operation running, and the transport should be abandoned afterwards
/// (this only happens after an error or a timeout, which abort the
/// communicators anyway).
///
/// Timeouts. A wait that passes its deadline calls ncclCommAbort on the
/// communicator and all channels and throws dpkit::timeout_error; the transport
/// is unusable afterwards (every call throws dpkit::error), as after
/// torch.distributed's NCCL watchdog aborts. Asynchronous NCCL errors
/// (ncclCommGetAsyncError) abort the same way and throw dpkit::error.
#pragma once

#include "../core/async.hpp"
#include "../core/device_ops.hpp"
#include "../core/element.hpp"
#include "../core/errors.hpp"
#include "../core/options.hpp"
#include "../core/reduce_op.hpp"
#include "../core/tensor.hpp"
#include "../cuda/error.hpp"
#include "../cuda/stream_ops.hpp"
#include "concept.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dpkit {

/// Throws dpkit::error if `r` is not ncclSuccess: "<what>: <ncclGetErrorString(r)>"
/// plus ncclGetLastError's detail when there is one.
/// @throws dpkit::error on failure.
inline void nccl_check(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return;
  std::string msg = what + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) msg += std::string(" (") + last + ")";
  throw error(msg);
}

/// The NCCL data type of a dpkit element type (f16 -> ncclFloat16,
/// bf16 -> ncclBfloat16, i8 -> ncclInt8, ..., u64 -> ncclUint64).
inline ncclDataType_t nccl_data_type(element_type t) noexcept {
  switch (t) {
  case element_type::f32: return ncclFloat32;
  case element_type::f64: return ncclFloat64;
  case element_type::f16: return ncclFloat16;
  case element_type::bf16: return ncclBfloat16;
  case element_type::i8: return ncclInt8;
  case element_type::u8: return ncclUint8;
  case element_type::i32: return ncclInt32;
  case element_type::u32: return ncclUint32;
  case element_type::i64: return ncclInt64;
  case element_type::u64: return ncclUint64;
  }
  return ncclUint8;
}

/// The NCCL reduction of a dpkit op: sum -> ncclSum, prod -> ncclProd,
/// min -> ncclMin, max -> ncclMax, avg -> ncclAvg (NCCL >= 2.10).
inline ncclRedOp_t nccl_reduce_op(reduce_op op) noexcept {
  switch (op) {
  case reduce_op::sum: return ncclSum;
  case reduce_op::prod: return ncclProd;
  case reduce_op::min: return ncclMin;
  case reduce_op::max: return ncclMax;
  case reduce_op::avg: return ncclAvg;
  }
  return ncclSum;
}

/// The NCCL reduction to ask for on a communicator of `world` ranks: as
/// nccl_reduce_op, except that avg on one rank is ncclSum (the same result,
/// the input itself). NCCL up to 2.29.6 runs a one-rank ncclAvg of a
/// floating type through its oneRankReduce kernel, which leaves the last
/// count % (blocks) elements unwritten (NVIDIA/nccl#1950, fixed in 2.29.7;
/// pytorch/pytorch#168092); a one-rank sum is a copy and unaffected. Seen on
/// an H100 with NCCL 2.28.9: 4 of 1048581 elements left at 0.
inline ncclRedOp_t nccl_reduce_op(reduce_op op, int world) noexcept {
  return op == reduce_op::avg && world == 1 ? ncclSum : nccl_reduce_op(op);
}

/// Options of an nccl transport (a regular aggregate).
struct nccl_options {
  /// The reduction-kernel table (dpkit::cuda_kernels(), which a .cu file
  /// provides). With it, device() returns a table bound to the transport's
  /// stream and ring/tree run on device tensors; without it (nullptr) only the
  /// native collectives and plain isend/irecv work, and ring/tree throw
  /// dpkit::invalid_argument. Must outlive the transport.
  const device_ops* kernels = nullptr;
  /// Create the per-pair point-to-point channels at construction (collective:
  /// every rank must pass the same value). false: isend/irecv throw
  /// dpkit::invalid_argument; use it when only native collectives are needed
  /// at large world sizes.
  bool point_to_point = true;
  /// Deadline of each native collective (ncclAllReduce, ...), from its
  /// start; also of forming the communicator (init_rank) and of splitting the
  /// point-to-point channels, so a rank that never arrives is a
  /// timeout_error on the others, not a hang.
  std::chrono::milliseconds native_timeout = env_default_timeout();
};

namespace detail {
/// How a thread waits for the GPU or NCCL between polls: it yields (stays
/// runnable) for the first 2 ms of a wait, then sleeps 1/64 of the time
/// waited so far (at most 1 ms), so completion is seen within about a
/// microsecond of it in the first 2 ms and within about 2% (plus the
/// kernel's timer slack, ~50 us) after. A fixed count of yields followed by
/// fixed 5 us sleeps, as before, made every wait longer than ~60 us late by
/// up to one sleep, which Linux rounds up to ~55 us: on an H200 a one-rank
/// native all-reduce of 128 MiB took 130 us where ncclAllReduce took 66 us
/// (benchmarks/results/2026-12-04-gpu-h200-device-check.md). The
/// spinning matches what CUDA does for a blocking synchronize on a machine
/// with more cores than GPUs (cudaDeviceScheduleAuto spins).
class poll_backoff {
public:
  /// Yield-only phase of a wait, from its first poll.
  static constexpr std::chrono::microseconds spin_window{2000};
  /// Longest sleep between two polls.
  static constexpr std::chrono::microseconds max_sleep{1000};
  /// Call after each unsuccessful poll.
  void pause() {
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - start_);
    if (waited < spin_window) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::min(waited / 64, max_sleep));
  }

private:
  clock::time_point start_ = clock::now();
};

/// Completes a call on a non-blocking NCCL communicator c: when r is
/// ncclInProgress, polls ncclCommGetAsyncError(c) until the communicator
/// leaves that state or deadline d passes (timeout_error naming `what`);
/// dpkit::error if it ends in an error. r other than ncclInProgress: as
/// nccl_check. The caller aborts the communicator when this throws.
inline void nccl_settle(ncclComm_t c, ncclResult_t r, deadline d, const std::string& what) {
  if (r != ncclInProgress) return nccl_check(r, what);
  for (poll_backoff backoff;; backoff.pause()) {
    ncclResult_t ar = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(c, &ar);
    if (q != ncclSuccess || (ar != ncclSuccess && ar != ncclInProgress))
      throw error(what + ": " + ncclGetErrorString(q != ncclSuccess ? q : ar));
    if (ar == ncclSuccess) return;
    if (clock::now() >= d)
      throw timeout_error(what + ": not complete before its deadline (a rank that never called it?); "
                                 "the communicator was aborted");
  }
}

/// nccl_settle for a communicator c that nothing owns yet: aborts c (when
/// not null) before the exception leaves.
inline void nccl_settle_or_abort(ncclComm_t c, ncclResult_t r, deadline d, const std::string& what) {
  try {
    nccl_settle(c, r, d, what);
  } catch (...) {
    if (c) (void)ncclCommAbort(c);
    throw;
  }
}

struct nccl_channel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int peer = 0; // the other rank's rank inside the two-rank communicator
};

struct nccl_state {
  ncclComm_t comm = nullptr;
  bool owns_comm = false;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  int device = 0, rank = 0, size = 1;
  std::vector<nccl_channel> send_ch, recv_ch; // by peer rank
  bool p2p = false;
  cuda_stream_context ctx{};
  device_ops ops{};
  bool has_ops = false;
  bool aborted = false;
  cudaEvent_t order = nullptr; // orders channel work after the main stream
  void* barrier_buf = nullptr;
  std::chrono::milliseconds native_timeout = env_default_timeout();

  std::string prefix() const {
    return "nccl: rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
  }
  void check_alive(const char* what) const {
    if (aborted) throw error(prefix() + what + ": the communicator was aborted after an earlier error or timeout");
  }
  /// ncclCommAbort on every communicator (never throws).
  void abort() noexcept {
    if (aborted) return;
    aborted = true;
    for (auto* v : {&send_ch, &recv_ch})
      for (auto& c : *v)
        if (c.comm) (void)ncclCommAbort(std::exchange(c.comm, nullptr));
    // A user's communicator is aborted (freed) too: after a hang it is
    // unusable either way, and a blocked kernel must be released.
    if (comm) (void)ncclCommAbort(comm);
    comm = nullptr;
  }
  /// nccl_settle on communicator c of this transport; ncclInProgress that
  /// ends in an error or the deadline aborts every communicator first.
  void settle(ncclComm_t c, ncclResult_t r, deadline d, const std::string& what) {
    if (r != ncclInProgress) return nccl_check(r, what);
    try {
      nccl_settle(c, r, d, what);
    } catch (...) {
      abort();
      throw;
    }
  }
  /// Throws (after aborting) if a communicator reports an asynchronous error.
  void check_async(ncclComm_t c, const std::string& what) {
    if (!c) return;
    ncclResult_t ar = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(c, &ar);
    if (r != ncclSuccess || (ar != ncclSuccess && ar != ncclInProgress)) {
      const std::string s = ncclGetErrorString(r != ncclSuccess ? r : ar);
      abort();
      throw error(prefix() + what + ": asynchronous NCCL error: " + s);
    }
  }
  /// Polls event ev until it completes; past d aborts and throws timeout_error.
  void wait_event(cudaEvent_t ev, ncclComm_t c, deadline d, const std::string& what) {
    for (detail::poll_backoff backoff;; backoff.pause()) {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda_check(e, prefix() + what + ": cudaEventQuery");
      check_alive(what.c_str());
      check_async(c, what);
      if (clock::now() >= d) {
        abort();
        throw timeout_error(prefix() + what + " did not complete before its deadline; NCCL communicators aborted");
      }
    }
  }

  nccl_state() = default;
  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;
  ~nccl_state() {
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && prev != device) (void)cudaSetDevice(device);
    else prev = -1;
    for (auto* v : {&send_ch, &recv_ch})
      for (auto& c : *v) {
        if (c.comm) (void)ncclCommDestroy(c.comm);
        if (c.stream) (void)cudaStreamDestroy(c.stream);
      }
    if (comm && owns_comm) (void)ncclCommDestroy(comm);
    if (barrier_buf) (void)cudaFree(barrier_buf);
    if (order) (void)cudaEventDestroy(order);
    if (stream && owns_stream) (void)cudaStreamDestroy(stream);
    if (prev >= 0) (void)cudaSetDevice(prev);
  }
};

} // namespace detail

/// A pending ncclSend or ncclRecv (models dpkit::request): complete when the
/// cudaEvent recorded after its group has completed. Move-only.
class nccl_request {
public:
  /// A complete request.
  nccl_request() = default;
  /// Internal: adopts event ev recorded on channel comm c.
  nccl_request(std::shared_ptr<detail::nccl_state> st, cudaEvent_t ev, ncclComm_t c, int peer, bool is_send)
      : st_(std::move(st)), ev_(ev), comm_(c), peer_(peer), send_(is_send) {}
  nccl_request(nccl_request&& o) noexcept { swap(o); }
  nccl_request& operator=(nccl_request&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  nccl_request(const nccl_request&) = delete;
  nccl_request& operator=(const nccl_request&) = delete;
  /// Destroys the event; does not cancel the transfer (see nccl.hpp).
  ~nccl_request() { release(); }

  /// Blocks (polling cudaEventQuery and ncclCommGetAsyncError) until complete.
  /// @throws dpkit::timeout_error past deadline d (after ncclCommAbort);
  ///         dpkit::error on a CUDA/NCCL error or an aborted communicator.
  void wait(deadline d) {
    if (!ev_) return;
    st_->wait_event(ev_, comm_, d,
                    std::string(send_ ? "send to" : "receive from") + " rank " + std::to_string(peer_));
    release();
  }
  /// True once complete (or failed: wait() then throws). Never blocks.
  bool test() const {
    if (!ev_) return true;
    return cudaEventQuery(ev_) != cudaErrorNotReady || st_->aborted;
  }

private:
  void swap(nccl_request& o) noexcept {
    std::swap(st_, o.st_);
    std::swap(ev_, o.ev_);
    std::swap(comm_, o.comm_);
    std::swap(peer_, o.peer_);
    std::swap(send_, o.send_);
  }
  void release() noexcept {
    if (ev_) (void)cudaEventDestroy(ev_);
    ev_ = nullptr;
  }
  std::shared_ptr<detail::nccl_state> st_;
  cudaEvent_t ev_ = nullptr;
  ncclComm_t comm_ = nullptr;
  int peer_ = 0;
  bool send_ = false;
};

/// NCCL transport (models dpkit::transport, dpkit::native_collectives and
/// dpkit::async_transport). Moves device memory only. Move-only; used by one
/// thread at a time (plus its own communication thread for *_async).
class nccl {
public:
  /// Wraps a communicator the caller created (not owned: the caller destroys
  /// it after this transport, unless a timeout or asynchronous error made the
  /// transport abort it, see aborted(); then it is already freed). `stream`: the stream native collectives and the
  /// device_ops table use; nullptr creates (and owns) a non-blocking stream.
  /// With o.point_to_point this constructor is collective over the
  /// communicator (it splits per-pair channels).
  /// @throws dpkit::error on a CUDA/NCCL failure.
  explicit nccl(ncclComm_t comm, cudaStream_t stream = nullptr, const nccl_options& o = {})
      : nccl(comm, false, stream, o) {}

  /// Creates (and owns) rank `rank` of an `nranks`-rank communicator on CUDA
  /// device `device` from a unique id that rank 0 made with ncclGetUniqueId
  /// and shared (ncclCommInitRankConfig, non-blocking, waited against
  /// o.native_timeout as PyTorch's ProcessGroupNCCL does with
  /// TORCH_NCCL_USE_COMM_NONBLOCKING). Collective: all ranks call it.
  /// @throws dpkit::invalid_argument for a bad rank/size/device;
  ///         dpkit::timeout_error when the communicator is not formed within
  ///         o.native_timeout (a rank never called it; the communicator is
  ///         aborted); dpkit::error on failure.
  static nccl init_rank(const ncclUniqueId& id, int nranks, int rank, int device, const nccl_options& o = {}) {
    if (nranks <= 0 || rank < 0 || rank >= nranks)
      throw invalid_argument("nccl::init_rank: rank " + std::to_string(rank) + " out of range for world size " +
                             std::to_string(nranks));
    if (device < 0 || device >= cuda_device_count())
      throw invalid_argument("nccl::init_rank: rank " + std::to_string(rank) + ": CUDA device " +
                             std::to_string(device) + " does not exist (" + std::to_string(cuda_device_count()) +
                             " visible)");
    // The device stays current afterwards: this thread works on this rank's GPU.
    cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    ncclComm_t c = nullptr;
    ncclUniqueId idc = id;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; // every call returns; dpkit waits against its deadlines
    const std::string what = "nccl::init_rank: ncclCommInitRankConfig(rank " + std::to_string(rank) + " of " +
                             std::to_string(nranks) + ")";
    const deadline d = deadline_after(o.native_timeout);
    const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, idc, rank, &cfg); // sets c: call it first
    detail::nccl_settle_or_abort(c, r, d, what);
    return nccl(c, true, nullptr, o);
  }

  /// A one-rank world on `device` (ncclCommInitAll with one device): for
  /// tests, single-GPU runs and benchmarks' native baseline.
  /// @throws dpkit::invalid_argument if the device does not exist, dpkit::error on failure.
  static nccl single(int device = 0, const nccl_options& o = {}) {
    if (device < 0 || device >= cuda_device_count())
      throw invalid_argument("nccl::single: CUDA device " + std::to_string(device) + " does not exist");
    ncclComm_t c = nullptr;
    nccl_check(ncclCommInitAll(&c, 1, &device), "ncclCommInitAll(1 device)");
    return nccl(c, true, nullptr, o);
  }

  nccl(nccl&&) noexcept = default;
  nccl& operator=(nccl&&) noexcept = default;
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  /// Joins the communication thread, then destroys the channels, the owned
  /// communicator and the owned stream.
  ~nccl() = default;

  /// This rank (ncclCommUserRank).
  int rank() const noexcept { return st_->rank; }
  /// World size (ncclCommCount).
  int size() const noexcept { return st_->size; }
  /// Device memory only (compile-time, so host tensors are rejected at
  /// compile time by the algorithms).
  static constexpr bool accepts(memory_space s) noexcept { return s == memory_space::device; }
  /// The device_ops table bound to stream() (reduce kernels from
  /// nccl_options::kernels), or nullptr when no kernels were given.
  const device_ops* device() const noexcept { return st_->has_ops ? &st_->ops : nullptr; }
  /// The stream native collectives and device() enqueue on.
  cudaStream_t stream() const noexcept { return st_->stream; }
  /// The CUDA device of this rank.
  int cuda_device() const noexcept { return st_->device; }
  /// The wrapped communicator (nullptr after an abort).
  ncclComm_t comm() const noexcept { return st_->comm; }
  /// True after a timeout or asynchronous error aborted the communicators.
  bool aborted() const noexcept { return st_->aborted; }
  /// Aborts all communicators now (ncclCommAbort); pending waits then throw.
  void abort() noexcept { st_->abort(); }

  /// Starts sending data.size() bytes of device memory to rank `peer`
  /// (ncclSend on the channel to peer, after the work already on stream()).
  /// `tag` is not matched (see the file comment). A zero-byte send completes
  /// at once without touching NCCL (the matching receive must be zero bytes too).
  /// @throws dpkit::invalid_argument (peer out of range or this rank, point-to-point disabled),
  ///         dpkit::error (CUDA/NCCL failure, aborted communicator).
  nccl_request isend(std::span<const std::byte> data, int peer, int tag) {
    return post(const_cast<std::byte*>(data.data()), data.size(), peer, tag, true);
  }
  /// Starts receiving exactly data.size() bytes from rank `peer` into device
  /// memory (ncclRecv on the channel from peer). Same rules as isend.
  nccl_request irecv(std::span<std::byte> data, int peer, int tag) {
    return post(data.data(), data.size(), peer, tag, false);
  }

  /// ncclAllReduce of `count` elements of type t (in == out: in place); waits
  /// for completion (deadline: nccl_options::native_timeout).
  /// @throws dpkit::timeout_error (communicators aborted), dpkit::error.
  void native_allreduce(const void* in, void* out, std::size_t count, element_type t, reduce_op op) {
    run_native("ncclAllReduce", [&] {
      return ncclAllReduce(in, out, count, nccl_data_type(t), nccl_reduce_op(op, st_->size), st_->comm, st_->stream);
    });
  }
  /// ncclReduceScatter: `count` is the per-rank output count (in has
  /// count * size() elements). Waits as native_allreduce.
  void native_reduce_scatter(const void* in, void* out, std::size_t count, element_type t, reduce_op op) {
    run_native("ncclReduceScatter", [&] {
      return ncclReduceScatter(in, out, count, nccl_data_type(t), nccl_reduce_op(op, st_->size), st_->comm, st_->stream);
    });
  }
  /// ncclAllGather: `count` is the per-rank input count (out has count *
  /// size() elements). Waits as native_allreduce.
  void native_allgather(const void* in, void* out, std::size_t count, element_type t) {
    run_native("ncclAllGather",
               [&] { return ncclAllGather(in, out, count, nccl_data_type(t), st_->comm, st_->stream); });
  }
  /// ncclBroadcast of `count` elements from `root`'s `in` to every rank's
  /// `out`. Waits as native_allreduce.
  /// @throws dpkit::invalid_argument if root is out of range.
  void native_broadcast(const void* in, void* out, std::size_t count, element_type t, int root) {
    check_root(root, "native_broadcast");
    run_native("ncclBroadcast",
               [&] { return ncclBroadcast(in, out, count, nccl_data_type(t), root, st_->comm, st_->stream); });
  }
  /// ncclReduce of `count` elements to `root`'s `out` (other ranks' out is
  /// not written). Waits as native_allreduce.
  /// @throws dpkit::invalid_argument if root is out of range.
  void native_reduce(const void* in, void* out, std::size_t count, element_type t, reduce_op op, int root) {
    check_root(root, "native_reduce");
    run_native("ncclReduce", [&] {
      return ncclReduce(in, out, count, nccl_data_type(t), nccl_reduce_op(op, st_->size), root, st_->comm, st_->stream);
    });
  }
  /// Barrier: an ncclAllReduce of one int on a device scratch word, waited
  /// for (returns once every rank entered it).
  void native_barrier() {
    if (!st_->barrier_buf) {
      detail::cuda_device_guard g(st_->device);
      cuda_check(cudaMalloc(&st_->barrier_buf, sizeof(int)), st_->prefix() + "cudaMalloc(barrier word)");
      cuda_check(cudaMemset(st_->barrier_buf, 0, sizeof(int)), st_->prefix() + "cudaMemset(barrier word)");
    }
    run_native("ncclAllReduce (barrier)", [&] {
      return ncclAllReduce(st_->barrier_buf, st_->barrier_buf, 1, ncclInt32, ncclSum, st_->comm, st_->stream);
    });
  }

  /// This rank's communication thread (runs *_async collectives in order).
  progress_thread& progress() { return *progress_; }

private:
  nccl(ncclComm_t comm, bool owns, cudaStream_t stream, const nccl_options& o)
      : st_(std::make_shared<detail::nccl_state>()), progress_(std::make_unique<progress_thread>()) {
    auto& s = *st_;
    if (!comm) throw invalid_argument("nccl: null ncclComm_t");
    // a non-blocking communicator may still be forming (on failure it is
    // aborted, before this state owns it)
    detail::nccl_settle_or_abort(comm, ncclInProgress, deadline_after(o.native_timeout),
                                 "nccl: forming the communicator");
    s.comm = comm;
    s.owns_comm = owns;
    s.native_timeout = o.native_timeout;
    nccl_check(ncclCommUserRank(comm, &s.rank), "ncclCommUserRank");
    nccl_check(ncclCommCount(comm, &s.size), "ncclCommCount");
    nccl_check(ncclCommCuDevice(comm, &s.device), "ncclCommCuDevice");
    detail::cuda_device_guard g(s.device);
    if (stream) {
      s.stream = stream;
    } else {
      cuda_check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), s.prefix() + "cudaStreamCreate");
      s.owns_stream = true;
    }
    cuda_check(cudaEventCreateWithFlags(&s.order, cudaEventDisableTiming), s.prefix() + "cudaEventCreate");
    s.ctx = cuda_stream_context{s.stream, s.device};
    if (o.kernels) {
      s.ops = make_device_ops(*o.kernels, &s.ctx);
      s.has_ops = true;
    }
    if (o.point_to_point && s.size > 1) make_channels();
    s.p2p = o.point_to_point;
  }

  // Round-robin tournament (circle method): in round k of M-1 rounds every
  // rank meets one partner; M = size rounded up to even (partner M-1 = bye).
  static int partner(int r, int k, int m) {
    if (r == m - 1) return k;
    if (r == k) return m - 1;
    return ((2 * k - r) % (m - 1) + (m - 1)) % (m - 1);
  }

  void make_channels() {
    auto& s = *st_;
    const int n = s.size, r = s.rank;
    const int m = n % 2 == 0 ? n : n + 1;
    const deadline d = deadline_after(s.native_timeout);
    s.send_ch.resize(static_cast<std::size_t>(n));
    s.recv_ch.resize(static_cast<std::size_t>(n));
    for (int k = 0; k < m - 1; ++k) {
      const int p = partner(r, k, m);
      const bool real = p < n;
      for (int dir = 0; dir < 2; ++dir) { // 0: lower -> higher rank, 1: higher -> lower
        ncclComm_t c = nullptr;
        const std::string what = s.prefix() + "ncclCommSplit (point-to-point channel with rank " + std::to_string(p) + ")";
        const ncclResult_t sr = ncclCommSplit(s.comm, real ? std::min(r, p) : NCCL_SPLIT_NOCOLOR, r, &c, nullptr);
        // non-blocking (init_rank): the split completes on the parent and the
        // child; a failure or timeout aborts them all
        s.settle(s.comm, sr, d, what);
        if (c) {
          try {
            detail::nccl_settle_or_abort(c, ncclInProgress, d, what);
          } catch (...) {
            s.abort();
            throw;
          }
        }
        if (!real) continue;
        detail::nccl_channel ch;
        ch.comm = c;
        ch.peer = r < p ? 1 : 0;
        cuda_check(cudaStreamCreateWithFlags(&ch.stream, cudaStreamNonBlocking), s.prefix() + "cudaStreamCreate");
        const bool i_send = dir == 0 ? r < p : r > p;
        (i_send ? s.send_ch : s.recv_ch)[static_cast<std::size_t>(p)] = ch;
      }
    }
  }

  nccl_request post(std::byte* buf, std::size_t bytes, int peer, int tag, bool is_send) {
    (void)tag;
    auto& s = *st_;
    const char* what = is_send ? "isend" : "irecv";
    if (peer < 0 || peer >= s.size || peer == s.rank)
      throw invalid_argument(s.prefix() + what + ": peer rank " + std::to_string(peer) +
                             (peer == s.rank ? " is this rank (self messages are not supported)"
                                             : " out of range for world size " + std::to_string(s.size)));
    if (!s.p2p)
      throw invalid_argument(s.prefix() + what + ": point-to-point disabled (nccl_options::point_to_point)");
    s.check_alive(what);
    if (bytes == 0) return {};
    auto& ch = (is_send ? s.send_ch : s.recv_ch)[static_cast<std::size_t>(peer)];
    detail::cuda_device_guard g(s.device);
    cuda_check(cudaEventRecord(s.order, s.stream), s.prefix() + "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(ch.stream, s.order, 0), s.prefix() + "cudaStreamWaitEvent");
    const std::string call = std::string(is_send ? "ncclSend" : "ncclRecv") + "(" + std::to_string(bytes) +
                             " bytes, " + (is_send ? "to" : "from") + " rank " + std::to_string(peer) + ")";
    nccl_check(ncclGroupStart(), s.prefix() + "ncclGroupStart");
    const ncclResult_t r = is_send ? ncclSend(buf, bytes, ncclUint8, ch.peer, ch.comm, ch.stream)
                                   : ncclRecv(buf, bytes, ncclUint8, ch.peer, ch.comm, ch.stream);
    const ncclResult_t r2 = ncclGroupEnd();
    nccl_check(r == ncclInProgress ? ncclSuccess : r, s.prefix() + call);
    // a non-blocking communicator may still be launching the group
    s.settle(ch.comm, r2, deadline_after(s.native_timeout), s.prefix() + "ncclGroupEnd after " + call);
    cudaEvent_t ev = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), s.prefix() + "cudaEventCreate");
    const cudaError_t er = cudaEventRecord(ev, ch.stream);
    if (er != cudaSuccess) (void)cudaEventDestroy(ev);
    cuda_check(er, s.prefix() + "cudaEventRecord after " + call);
    return nccl_request(st_, ev, ch.comm, peer, is_send);
  }

  void check_root(int root, const char* what) const {
    if (root < 0 || root >= st_->size)
      throw invalid_argument(st_->prefix() + what + ": root rank " + std::to_string(root) +
                             " out of range for world size " + std::to_string(st_->size));
  }

  template <class F>
  void run_native(const char* name, F&& enqueue) {
    auto& s = *st_;
    s.check_alive(name);
    const deadline d = deadline_after(s.native_timeout);
    detail::cuda_device_guard g(s.device);
    s.settle(s.comm, enqueue(), d, s.prefix() + name); // non-blocking: may still be enqueuing
    cuda_check(cudaEventRecord(s.order, s.stream), s.prefix() + "cudaEventRecord after " + name);
    s.wait_event(s.order, s.comm, d, name);
  }

  std::shared_ptr<detail::nccl_state> st_;
  std::unique_ptr<progress_thread> progress_;
};

} // namespace dpkit
