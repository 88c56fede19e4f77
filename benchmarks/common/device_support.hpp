// Device support for the *_perf benchmarks (CUDA builds only: include under
// #ifdef DPKIT_WITH_CUDA and add common/device_support.cu to the target's
// sources with cuda_dep and nccl_dep; the .cu file holds the kernels, so this
// header and the benchmark itself stay plain C++ compiled by g++).
//
//   -g / --device (inproc): one GPU, N rank threads, each with its own stream
//       dpkit::bench::device_world ops;                 // per-thread streams
//       dpkit::inproc_world world(nranks, ops.get());
//       world.run([&](dpkit::inproc& c) {
//         dpkit::bench::device_array buf(count, dpkit::element_type::f32);
//         dpkit::bench::fill(buf, rank, 0);  ...  time dpkit::allreduce(c, buf.view<float>(), ...)
//         dpkit::bench::device_sync();  wrong = dpkit::bench::count_wrong(buf, expected_host);
//       });
//   under mpirun (one rank per GPU): dpkit::bench::make_nccl(MPI_COMM_WORLD)
//       gives a dpkit::nccl transport with the kernels bound to its stream, so
//       -A ring|tree|native all run on device memory.
#pragma once

#include <dpkit/core/device_ops.hpp>
#include <dpkit/core/element.hpp>
#include <dpkit/core/tensor.hpp>
#include <dpkit/cuda/device_buffer.hpp>
#include <dpkit/cuda/stream_ops.hpp>
#include <dpkit/transport/nccl.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#if defined(DPKIT_WITH_MPI) || defined(DPKIT_BENCH_NCCL_MPI)
#include <dpkit/transport/nccl_mpi.hpp>
#endif

namespace dpkit::bench {

/// The CUDA kernel table (dpkit::cuda_kernels(), compiled in device_support.cu).
const device_ops* kernels() noexcept;

/// Number of visible CUDA devices (0 without a GPU or driver; never throws).
int device_count() noexcept;

/// Makes `device` current for the calling thread.
/// @throws dpkit::error on failure.
void set_device(int device);

/// Waits for all work on the calling thread's per-thread stream
/// (cudaStreamPerThread: what device_world's tables enqueue on) and on the
/// legacy default stream.
/// @throws dpkit::error on failure.
void device_sync();

/// A device_ops table on cudaStreamPerThread of `device` (-1: current), for
/// dpkit::inproc_world(n, table.get()): every rank thread gets its own stream.
/// Also raises the device's default memory-pool release threshold so scratch
/// allocations (cudaMallocAsync) are reused between iterations.
class device_world {
public:
  explicit device_world(int device = -1);
  /// The table; valid while this object lives.
  const device_ops* get() const noexcept { return ops_.get(); }

private:
  cuda_device_ops ops_;
};

/// A typed-at-runtime device array (count elements of type t).
class device_array {
public:
  device_array(std::size_t count, element_type t, int device = -1);
  void* data() noexcept { return buf_.data(); }
  const void* data() const noexcept { return buf_.data(); }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return count_ * element_size(type_); }
  element_type type() const noexcept { return type_; }
  /// A device tensor_view of E (E must match type()).
  template <element E>
  tensor_view<E> view() {
    return {static_cast<E*>(data()), count_, memory_space::device};
  }

private:
  device_buffer<std::uint8_t> buf_;
  std::size_t count_;
  element_type type_;
};

/// Fills `a` with nccl-tests-like deterministic data for `rank` (`seed`
/// varies it): element i of rank r is a small value from (i, r, seed), exactly
/// representable in every type, so sums stay exact. Synchronous.
/// @throws dpkit::error on a CUDA failure.
void fill(device_array& a, int rank, int seed);

/// The same values on the host, as raw bytes of a's type (for references).
std::vector<std::byte> host_values(std::size_t count, element_type t, int rank, int seed);

/// Expected all-reduce result of fill() data over `world` ranks with op
/// (reduced in rank order with dpkit::reduce_host; exact for the fill data),
/// as raw bytes of type t.
std::vector<std::byte> expected_allreduce(std::size_t count, element_type t, reduce_op op, int world, int seed);

/// Copies a to the host and counts elements whose bytes differ from
/// `expected` (raw bytes of a.type(), a.size() elements): nccl-tests' #wrong.
/// @throws dpkit::error on a CUDA failure, dpkit::invalid_argument on a size mismatch.
std::size_t count_wrong(const device_array& a, std::span<const std::byte> expected);

/// An NCCL transport with the kernels bound to its stream, over the ranks of
/// an MPI communicator (one rank per GPU: device = node-local rank % GPUs).
/// Collective; MPI must be initialized.
#if defined(DPKIT_WITH_MPI) || defined(DPKIT_BENCH_NCCL_MPI)
inline nccl make_nccl(MPI_Comm comm, int device = -1) {
  nccl_options o;
  o.kernels = kernels();
  return nccl_from_mpi(comm, device, o);
}
#endif

/// A one-rank NCCL transport on `device` with the kernels bound (for
/// single-GPU native baselines).
inline nccl make_nccl_single(int device = 0) {
  nccl_options o;
  o.kernels = kernels();
  return nccl::single(device, o);
}

} // namespace dpkit::bench
