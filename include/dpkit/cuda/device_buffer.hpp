/// @file device_buffer.hpp
/// @brief `device_buffer<T>`: an owning, move-only array of T in CUDA device
/// memory (cudaMalloc), which is a dpkit::tensor in memory_space::device.
///
/// Compiles with g++ (CUDA runtime API only).
///
/// @code
/// dpkit::device_buffer<float> g(1 << 20);
/// g.copy_from_host(host_grads);
/// dpkit::allreduce(comm, g, dpkit::reduce_op::avg);  // comm accepts device memory
/// auto back = g.to_host();
/// @endcode
#pragma once

#include "../core/element.hpp"
#include "../core/tensor.hpp"
#include "error.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dpkit {

/// Owning array of `size()` elements of T in device memory of one CUDA device.
/// Contents are uninitialized after construction. Move-only; a moved-from
/// buffer is empty. Copies to/from the host return when done (on this thread's default stream).
template <element T>
class device_buffer {
public:
  using value_type = T;

  /// An empty buffer (no allocation).
  device_buffer() = default;
  /// Allocates `count` elements (count * sizeof(T) bytes) on `device` (-1: the
  /// current device). count == 0 allocates nothing.
  /// @throws dpkit::error naming cudaMalloc, the byte count and the CUDA error.
  explicit device_buffer(std::size_t count, int device = -1) : count_(count) {
    if (device < 0) cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    device_ = device;
    if (count == 0) return;
    detail::cuda_device_guard g(device_);
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc(" + std::to_string(count * sizeof(T)) + " bytes)");
    ptr_ = static_cast<T*>(p);
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  /// Takes o's allocation; o becomes empty.
  device_buffer(device_buffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)), device_(o.device_) {}
  /// Frees this buffer's allocation, then takes o's.
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  /// cudaFree (errors ignored).
  ~device_buffer() { release(); }

  /// Device pointer to the first element (nullptr when empty).
  T* data() noexcept { return ptr_; }
  /// Device pointer to the first element (nullptr when empty).
  const T* data() const noexcept { return ptr_; }
  /// Number of elements.
  std::size_t size() const noexcept { return count_; }
  /// Size in bytes.
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }
  /// True when size() == 0.
  bool empty() const noexcept { return count_ == 0; }
  /// The device ordinal the memory lives on.
  int device() const noexcept { return device_; }

  /// Copies host elements in; returns when the device memory holds them, for
  /// every stream (cudaMemcpyAsync on this thread's default stream, then
  /// cudaStreamSynchronize of it). A plain cudaMemcpy from pageable memory
  /// may return before its DMA has landed, and work on a non-blocking stream
  /// (the NCCL and inproc transports' own) then reads stale memory: seen on an
  /// H100, the tail of a 1 MiB int8 input still zero when ncclAllReduce read it.
  /// Precondition: src.size() == size().
  /// @throws dpkit::invalid_argument on a size mismatch, dpkit::error on a CUDA failure.
  void copy_from_host(std::span<const T> src) {
    check_size(src.size(), "copy_from_host");
    if (count_ == 0) return;
    cuda_check(cudaMemcpyAsync(ptr_, src.data(), bytes(), cudaMemcpyHostToDevice, cudaStreamPerThread),
               "cudaMemcpyAsync(host to device)");
    cuda_check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize(host to device)");
  }
  /// Copies the elements out to host memory; returns when dst holds them. Work
  /// enqueued on other streams (a transport's) must be waited for first.
  /// Precondition: dst.size() == size().
  /// @throws dpkit::invalid_argument on a size mismatch, dpkit::error on a CUDA failure.
  void copy_to_host(std::span<T> dst) const {
    check_size(dst.size(), "copy_to_host");
    if (count_ == 0) return;
    cuda_check(cudaMemcpyAsync(dst.data(), ptr_, bytes(), cudaMemcpyDeviceToHost, cudaStreamPerThread),
               "cudaMemcpyAsync(device to host)");
    cuda_check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize(device to host)");
  }
  /// The elements as a host vector (synchronous).
  /// @throws dpkit::error on a CUDA failure.
  std::vector<T> to_host() const {
    std::vector<T> v(count_);
    copy_to_host(v);
    return v;
  }
  /// Sets every byte to `byte`; returns when done (cudaMemset is
  /// asynchronous for device memory: cudaMemsetAsync on this thread's default
  /// stream, then cudaStreamSynchronize of it).
  /// @throws dpkit::error on a CUDA failure.
  void fill_bytes(unsigned char byte) {
    if (count_ == 0) return;
    cuda_check(cudaMemsetAsync(ptr_, byte, bytes(), cudaStreamPerThread), "cudaMemsetAsync");
    cuda_check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize(memset)");
  }

private:
  void check_size(std::size_t n, const char* what) const {
    if (n != count_)
      throw invalid_argument(std::string("device_buffer::") + what + ": host span has " + std::to_string(n) +
                             " elements, buffer has " + std::to_string(count_));
  }
  void release() noexcept {
    if (ptr_) (void)cudaFree(ptr_);
    ptr_ = nullptr;
  }

  T* ptr_ = nullptr;
  std::size_t count_ = 0;
  int device_ = 0;
};

/// device_buffer is a tensor in device memory (compile-time memory space, so a
/// host-only transport rejects it at compile time where it can).
template <element T>
struct tensor_traits<device_buffer<T>> {
  using value_type = T;
  static constexpr memory_space memory = memory_space::device;
  static T* data(device_buffer<T>& t) noexcept { return t.data(); }
  static std::size_t size(const device_buffer<T>& t) noexcept { return t.size(); }
};

} // namespace dpkit
