// Implementation of device_support.hpp (compiled by nvcc: it instantiates the
// reduction kernels behind dpkit::cuda_kernels()).
#include "device_support.hpp"

#include <dpkit/cuda/device_ops.cuh>

#include <cstdint>
#include <cstring>
#include <string>

namespace dpkit::bench {

const device_ops* kernels() noexcept { return cuda_kernels(); }

int device_count() noexcept { return cuda_device_count(); }

void set_device(int device) { cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"); }

void device_sync() {
  cuda_check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize(cudaStreamPerThread)");
  cuda_check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize(default stream)");
}

namespace {
int resolve(int device) {
  if (device < 0) cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}
cuda_device_ops make_world_ops(int device) {
  device = resolve(device);
  cudaMemPool_t pool{};
  cuda_check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  std::uint64_t keep = UINT64_MAX;
  cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
             "cudaMemPoolSetAttribute(ReleaseThreshold)");
  return cuda_device_ops(*cuda_kernels(), cudaStreamPerThread, device);
}

template <class T>
T value_at(std::size_t i, int rank, int seed) {
  const int k = static_cast<int>((i * 2654435761u + static_cast<std::size_t>(rank) * 40503u +
                                  static_cast<std::size_t>(seed) * 977u) % 9) - 4; // -4..4
  if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) return T(0.5f * static_cast<float>(k));
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(0.5 * k);
  else if constexpr (std::is_signed_v<T>) return static_cast<T>(k);
  else return static_cast<T>(k + 4);
}
} // namespace

device_world::device_world(int device) : ops_(make_world_ops(device)) {}

device_array::device_array(std::size_t count, element_type t, int device)
    : buf_(count * element_size(t), resolve(device)), count_(count), type_(t) {}

std::vector<std::byte> host_values(std::size_t count, element_type t, int rank, int seed) {
  std::vector<std::byte> out(count * element_size(t));
  visit_element_type(t, [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < count; ++i) {
      const T v = value_at<T>(i, rank, seed);
      std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
    }
  });
  return out;
}

void fill(device_array& a, int rank, int seed) {
  const auto h = host_values(a.size(), a.type(), rank, seed);
  if (h.empty()) return;
  cuda_check(cudaMemcpy(a.data(), h.data(), h.size(), cudaMemcpyHostToDevice), "cudaMemcpy(fill)");
}

std::vector<std::byte> expected_allreduce(std::size_t count, element_type t, reduce_op op, int world, int seed) {
  auto acc = host_values(count, t, 0, seed);
  visit_element_type(t, [&](auto tag) {
    using T = decltype(tag);
    auto* a = reinterpret_cast<T*>(acc.data());
    for (int r = 1; r < world; ++r) {
      const auto x = host_values(count, t, r, seed);
      reduce_host(a, a, reinterpret_cast<const T*>(x.data()), count, op);
    }
    if (op == reduce_op::avg) divide_host(a, count, static_cast<std::size_t>(world));
  });
  return acc;
}

std::size_t count_wrong(const device_array& a, std::span<const std::byte> expected) {
  if (expected.size() != a.bytes())
    throw invalid_argument("count_wrong: expected " + std::to_string(expected.size()) + " bytes, array has " +
                           std::to_string(a.bytes()));
  std::vector<std::byte> h(a.bytes());
  if (!h.empty())
    cuda_check(cudaMemcpy(h.data(), a.data(), h.size(), cudaMemcpyDeviceToHost),
               "cudaMemcpy(count_wrong)");
  const std::size_t es = element_size(a.type());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(h.data() + i * es, expected.data() + i * es, es) != 0) ++wrong;
  return wrong;
}

} // namespace dpkit::bench
