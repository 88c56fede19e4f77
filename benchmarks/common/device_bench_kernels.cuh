// Small CUDA kernels shared by the device benchmarks (allreduce_device_perf.cu,
// fusion_device_perf.cu): fill a buffer and count the elements that differ
// from an expected value, on the device, so a result is checked without
// copying gigabytes back, and their main's no-device exit. Include from one
// .cu file per program.
#pragma once

#include <dpkit/cuda/error.hpp>

#include <cstddef>
#include <cstdio>
#include <exception>

namespace dpkit_device_bench {

/// Sets p[0, n) to v (grid-stride loop; any launch shape).
__global__ void fill_kernel(float* p, std::size_t n, float v) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

/// Adds to *wrong the number of elements of p[0, n) that differ from want
/// (*wrong is device memory, zeroed by the caller).
__global__ void count_wrong_kernel(const float* p, std::size_t n, float want, unsigned long long* wrong) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    local += p[i] != want;
  if (local) atomicAdd(wrong, local);
}

/// A device benchmark's main: exits 77 (skip) with a line on stdout when no
/// CUDA device is visible, else returns run()'s code; an exception prints
/// "<program>: <what>" on stderr and returns 1.
template <class Run>
int device_main(const char* program, Run&& run) {
  if (dpkit::cuda_device_count() == 0) {
    std::printf("# no CUDA device: nothing to measure\n");
    return 77;
  }
  try {
    return run();
  } catch (const std::exception& ex) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", program, ex.what());
    return 1;
  }
}

} // namespace dpkit_device_bench
