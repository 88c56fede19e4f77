// doctest main for the GPU tests: exits 77 (meson: SKIP) when no CUDA device
// is usable, so the suite passes on machines without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("no CUDA device (%s): skipping\n", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
