/// @file error.hpp
/// @brief CUDA error checking that throws dpkit::error naming the failed call.
///
/// Needs the CUDA runtime headers (cuda_runtime_api.h); compiles with g++ or
/// nvcc. Only the CUDA build (DPKIT_WITH_CUDA) includes this header.
#pragma once

#include "../core/errors.hpp"

#include <cuda_runtime_api.h>

#include <string>

namespace dpkit {

/// Throws dpkit::error if `e` is not cudaSuccess. The message is
/// "<what>: <cudaGetErrorString(e)> (<cudaGetErrorName(e)>)", where `what`
/// names the CUDA call and, ideally, its arguments.
/// @throws dpkit::error on failure.
inline void cuda_check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  throw error(what + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}

/// Number of CUDA devices visible to this process; 0 when there is no device
/// or no usable driver (never throws). Clears the sticky "no device" error.
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

namespace detail {
/// Makes `device` current for the guard's lifetime (no-op when device < 0 or
/// already current); restores the previous device on destruction.
class cuda_device_guard {
public:
  explicit cuda_device_guard(int device) {
    if (device < 0) return;
    cuda_check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ == device) {
      prev_ = -1;
      return;
    }
    cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;
  ~cuda_device_guard() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);
  }

private:
  int prev_ = -1;
};
} // namespace detail

} // namespace dpkit

/// Evaluates a CUDA runtime call and throws dpkit::error naming the call's
/// source text and the CUDA error string when it does not return cudaSuccess.
#define DPKIT_CUDA_CHECK(call) ::dpkit::cuda_check((call), #call)
