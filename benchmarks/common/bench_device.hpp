// dpkit benchmarks: the hook for device (CUDA) buffers.
//
// The host build measures host-memory collectives (MPI, inproc). -g > 1 and
// --memory device need device buffers; until the CUDA build provides them they
// stop with a clear message. The CUDA build plugs in by defining
// DPKIT_WITH_CUDA and providing "bench_cuda.hpp" next to this file with
//
//   namespace dpkit_bench::cuda {
//     // Validates -g / --memory device; returns an empty string when supported.
//     std::string check_device_options(const options& o, int world_size);
//     // One line per rank for "#  Rank ... device %2d [0x%02x] %s" (device
//     // index, PCI bus id, name), after selecting the rank's GPU.
//     rank_device describe_device(int local_rank);
//   }
//
// The harness calls device_support_error() before any collective runs.
#pragma once

#include "bench_options.hpp"

#include <string>

namespace dpkit_bench {

/// What the "#  Rank" header line says about a rank's device.
struct rank_device {
  int index = -1;            ///< -1: host memory
  unsigned pci_bus = 0;      ///< printed as [0x%02x]
  std::string name = "host"; ///< rest of the line
};

} // namespace dpkit_bench

#if defined(DPKIT_WITH_CUDA) && __has_include("bench_cuda.hpp")
#include "bench_cuda.hpp"
#define DPKIT_BENCH_HAVE_CUDA_HOOK 1
#endif

namespace dpkit_bench {

/// Empty when the requested device options can run in this build; otherwise
/// the error to print.
inline std::string device_support_error(const options& o, [[maybe_unused]] int world_size) {
#if defined(DPKIT_BENCH_HAVE_CUDA_HOOK)
  return cuda::check_device_options(o, world_size);
#else
  if (o.ngpus > 1)
    return "-g " + std::to_string(o.ngpus) +
           ": several GPUs per thread need the CUDA build of dpkit (meson -Dcuda=enabled); this build measures "
           "host-memory collectives only";
  if (o.device_memory)
    return std::string("--memory device needs the CUDA build of dpkit (meson -Dcuda=enabled)") +
#if defined(DPKIT_WITH_CUDA)
           " and the device hook benchmarks/common/bench_cuda.hpp, which this tree does not have yet";
#else
           "; this build measures host-memory collectives only";
#endif
  return {};
#endif
}

} // namespace dpkit_bench
