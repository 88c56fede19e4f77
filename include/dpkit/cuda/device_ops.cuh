/// @file device_ops.cuh
/// @brief The CUDA dpkit::device_ops table: reduction kernels plus stream
/// copies and allocations, so ring and tree run unchanged on device tensors.
///
/// Must be compiled by nvcc: a translation unit that calls cuda_kernels() or
/// make_cuda_device_ops() is a .cu file. Everything else (device_buffer, the
/// NCCL transport, cuda_device_ops itself) compiles with g++, so a C++ program
/// can create the table in one small .cu file and use it everywhere.
///
/// @code
/// // ranks.cu
/// #include <dpkit/cuda/device_ops.cuh>
/// #include <dpkit/dpkit.hpp>
/// auto ops = dpkit::make_cuda_device_ops();   // cudaStreamPerThread: one stream per rank thread
/// dpkit::inproc_world world(4, ops.get());
/// world.run([](dpkit::inproc& c) { dpkit::device_buffer<float> g(n); ...; dpkit::allreduce_ring(c, g); });
/// @endcode
#pragma once

#include "device_buffer.hpp"
#include "reduce_kernels.cuh"
#include "stream_ops.hpp"

namespace dpkit {

namespace detail {
inline void ops_reduce(void* dst, const void* a, const void* b, std::size_t n, element_type t, reduce_op op,
                       void* ctx) {
  auto& c = detail::cuda_ctx(ctx);
  detail::cuda_device_guard g(c.device);
  reduce_device(dst, a, b, n, t, op, c.stream);
}
inline void ops_divide(void* data, std::size_t n, element_type t, std::size_t divisor, void* ctx) {
  auto& c = detail::cuda_ctx(ctx);
  detail::cuda_device_guard g(c.device);
  divide_device(data, n, t, divisor, c.stream);
}
} // namespace detail

/// The CUDA kernel table: reduce and divide launch the kernels of
/// reduce_kernels.cuh, the other entries are stream_ops.hpp's runtime
/// functions; ctx is nullptr. Every function expects a cuda_stream_context* as
/// ctx, so bind it with make_device_ops(table, &ctx), cuda_device_ops, or hand
/// it to the NCCL transport (nccl_options::kernels), which binds it to its
/// stream. The pointer is valid for the program's lifetime.
inline const device_ops* cuda_kernels() noexcept {
  static const device_ops table{&detail::ops_reduce,         &detail::ops_divide,
                                &detail::cuda_ops_copy,           &detail::cuda_ops_allocate,
                                &detail::cuda_ops_deallocate,     &detail::cuda_ops_synchronize,
                                nullptr};
  return &table;
}

/// A device_ops table bound to `stream` on `device` (-1: the current device).
/// The default, cudaStreamPerThread, gives every calling thread (each inproc
/// rank, each communication thread) its own stream.
/// @throws dpkit::error if the current device cannot be queried.
inline cuda_device_ops make_cuda_device_ops(cudaStream_t stream = cudaStreamPerThread, int device = -1) {
  return cuda_device_ops(*cuda_kernels(), stream, device);
}

} // namespace dpkit
