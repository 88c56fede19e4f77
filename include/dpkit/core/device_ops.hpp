/// @file device_ops.hpp
/// @brief The table of device-memory primitives a transport hands to the
/// algorithms, so ring and tree run unchanged on device tensors.
///
/// Host memory never goes through this table: algorithms use reduce_host and
/// std::memcpy. A transport that moves device memory exposes
/// `const device_ops* device() const` (see detail/local_ops.hpp); the CUDA
/// build provides one (cuda/device_ops.cuh) whose functions enqueue kernels and
/// copies on the transport's stream and synchronize in `synchronize`.
#pragma once

#include "element.hpp"
#include "reduce_op.hpp"

#include <cstddef>

namespace dpkit {

/// Device-memory primitives (all sizes in elements unless named bytes).
/// Every function receives `ctx` (e.g. a CUDA stream and device ordinal).
struct device_ops {
  /// dst[i] = a[i] op b[i] for n elements of type t (avg: sum step).
  void (*reduce)(void* dst, const void* a, const void* b, std::size_t n, element_type t, reduce_op op, void* ctx);
  /// data[i] /= divisor for n elements of type t (finishes avg).
  void (*divide)(void* data, std::size_t n, element_type t, std::size_t divisor, void* ctx);
  /// Copies bytes between any two of host/device memory.
  void (*copy)(void* dst, const void* src, std::size_t bytes, void* ctx);
  /// Allocates device scratch of `bytes` bytes; throws dpkit::error on failure.
  void* (*allocate)(std::size_t bytes, void* ctx);
  /// Frees what allocate returned.
  void (*deallocate)(void* p, void* ctx) noexcept;
  /// Waits until all work enqueued through this table finished.
  void (*synchronize)(void* ctx);
  /// Opaque context passed to every function.
  void* ctx;
};

} // namespace dpkit
