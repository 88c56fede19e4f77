/// @file stream_ops.hpp
/// @brief The CUDA half of a dpkit::device_ops table that needs no kernels
/// (copy, allocate, deallocate, synchronize on a stream), and the owning
/// `cuda_device_ops` object that binds a table to a stream and device.
///
/// Compiles with g++ (CUDA runtime API only). The reduce/divide entries launch
/// kernels and therefore come from a translation unit compiled by nvcc: call
/// dpkit::cuda_kernels() (cuda/device_ops.cuh) in a .cu file and pass the
/// result here, or use dpkit::make_cuda_device_ops() there directly.
///
/// Semantics of every table built here (ctx is a cuda_stream_context*):
/// - reduce/divide enqueue a kernel on ctx->stream and return at once;
/// - copy is cudaMemcpyAsync(cudaMemcpyDefault) on the stream followed by a
///   stream synchronize, so when copy returns the bytes have arrived (the
///   inproc transport relies on this to signal completion to the peer);
/// - allocate is cudaMallocAsync on the stream (the device's default memory
///   pool) followed by a stream synchronize, so the memory may be used from
///   any stream; deallocate is cudaFreeAsync on the stream;
/// - synchronize is cudaStreamSynchronize.
/// Each function makes ctx->device current for its duration (device >= 0).
#pragma once

#include "../core/device_ops.hpp"
#include "error.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

namespace dpkit {

/// The context a CUDA device_ops table passes to its functions: the stream
/// work is enqueued on and the device that owns it (-1: the calling thread's
/// current device). `cudaStreamPerThread` gives every calling thread its own
/// stream (one per inproc rank, one per communication thread).
struct cuda_stream_context {
  cudaStream_t stream = nullptr; ///< stream work is enqueued on
  int device = -1;               ///< device ordinal, or -1 for the current one
};

namespace detail {
inline cuda_stream_context& cuda_ctx(void* ctx) { return *static_cast<cuda_stream_context*>(ctx); }

inline void cuda_ops_copy(void* dst, const void* src, std::size_t bytes, void* ctx) {
  if (bytes == 0 || dst == src) return;
  auto& c = cuda_ctx(ctx);
  cuda_device_guard g(c.device);
  cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c.stream),
             "cudaMemcpyAsync(" + std::to_string(bytes) + " bytes)");
  cuda_check(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize after cudaMemcpyAsync");
}
inline void* cuda_ops_allocate(std::size_t bytes, void* ctx) {
  if (bytes == 0) return nullptr;
  auto& c = cuda_ctx(ctx);
  cuda_device_guard g(c.device);
  void* p = nullptr;
  cuda_check(cudaMallocAsync(&p, bytes, c.stream), "cudaMallocAsync(" + std::to_string(bytes) + " bytes)");
  cuda_check(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize after cudaMallocAsync");
  return p;
}
inline void cuda_ops_deallocate(void* p, void* ctx) noexcept {
  if (!p) return;
  auto& c = cuda_ctx(ctx);
  int prev = -1;
  if (c.device >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != c.device) (void)cudaSetDevice(c.device);
  else prev = -1;
  (void)cudaFreeAsync(p, c.stream);
  if (prev >= 0) (void)cudaSetDevice(prev);
}
inline void cuda_ops_synchronize(void* ctx) {
  auto& c = cuda_ctx(ctx);
  cuda_device_guard g(c.device);
  cuda_check(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
}
} // namespace detail

/// Builds a device_ops table bound to `ctx`: reduce and divide are taken from
/// `kernels` (a table from dpkit::cuda_kernels(), compiled by nvcc), copy,
/// allocate, deallocate and synchronize are the runtime-API functions described
/// in this file's header. `ctx` must outlive every use of the table.
inline device_ops make_device_ops(const device_ops& kernels, cuda_stream_context* ctx) noexcept {
  return device_ops{kernels.reduce,          kernels.divide,           &detail::cuda_ops_copy,
                    &detail::cuda_ops_allocate, &detail::cuda_ops_deallocate, &detail::cuda_ops_synchronize,
                    ctx};
}

/// An owning device_ops table bound to one CUDA stream and device. Move-only;
/// the table stays at the same address across moves (get() is stable), so it
/// can be handed to dpkit::inproc_world. Pass `cudaStreamPerThread` (the
/// default) to give every rank thread of an inproc world its own stream.
///
/// @code
/// // in a .cu file (the kernels must be compiled by nvcc):
/// auto ops = dpkit::make_cuda_device_ops();          // per-thread streams, current device
/// dpkit::inproc_world world(4, ops.get());
/// @endcode
class cuda_device_ops {
public:
  /// Binds `kernels` (from dpkit::cuda_kernels()) to `stream` on `device`
  /// (-1: the current device, resolved now). Does not own the stream.
  /// @throws dpkit::error if the current device cannot be queried.
  cuda_device_ops(const device_ops& kernels, cudaStream_t stream, int device = -1)
      : state_(std::make_unique<state>()) {
    if (device < 0) cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    state_->ctx = cuda_stream_context{stream, device};
    state_->ops = make_device_ops(kernels, &state_->ctx);
  }
  /// The table (valid while this object lives; stable across moves).
  const device_ops* get() const noexcept { return &state_->ops; }
  /// Same as get().
  operator const device_ops*() const noexcept { return get(); }
  /// The stream the table enqueues on.
  cudaStream_t stream() const noexcept { return state_->ctx.stream; }
  /// The device the table runs on.
  int device() const noexcept { return state_->ctx.device; }

private:
  struct state {
    cuda_stream_context ctx;
    device_ops ops{};
  };
  std::unique_ptr<state> state_;
};

} // namespace dpkit
