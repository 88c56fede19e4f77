/// @file reduce_kernels.cuh
/// @brief CUDA reduction kernels: dst = a op b and data /= divisor for every
/// dpkit element type and reduce op, enqueued on a given stream.
///
/// Must be compiled by nvcc (a .cu translation unit). Bitwise the same results
/// as dpkit::reduce_host / dpkit::divide_host (core/reduce_op.hpp), which
/// follow NCCL's ncclRedOp_t semantics:
/// - sum/prod/min/max element-wise; avg is the sum step here (finish it with
///   divide_device by the world size, integer division truncating for ints);
/// - f16/bf16 are converted to f32 (cuda_fp16.h / cuda_bf16.h), combined, and
///   rounded once to nearest even (__float2half_rn / __float2bfloat16_rn).
///   The one difference from the host: a NaN result is CUDA's canonical NaN
///   bit pattern rather than the host's quieted input NaN;
/// - signed integer sum/prod wrap modulo 2^bits (computed in unsigned).
/// Kernels are grid-stride and move 16 bytes per load/store (uint4) when dst,
/// a and b share the same alignment modulo 16, with scalar head and tail
/// elements; otherwise element by element.
#pragma once

#include "../core/element.hpp"
#include "../core/errors.hpp"
#include "../core/reduce_op.hpp"
#include "error.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dpkit {

namespace detail {

/// Storage and compute type of an element type on the device.
template <class T>
struct dev_elem {
  using storage = T;
  using compute = T;
  static __device__ __forceinline__ compute load(storage x) { return x; }
  static __device__ __forceinline__ storage store(compute x) { return x; }
};
template <>
struct dev_elem<f16> {
  using storage = std::uint16_t;
  using compute = float;
  static __device__ __forceinline__ float load(std::uint16_t x) { return __half2float(__ushort_as_half(x)); }
  static __device__ __forceinline__ std::uint16_t store(float x) { return __half_as_ushort(__float2half_rn(x)); }
};
template <>
struct dev_elem<bf16> {
  using storage = std::uint16_t;
  using compute = float;
  static __device__ __forceinline__ float load(std::uint16_t x) { return __bfloat162float(__ushort_as_bfloat16(x)); }
  static __device__ __forceinline__ std::uint16_t store(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};

/// a op b, matching detail::combine (reduce_op.hpp) on the host (avg: sum).
template <reduce_op Op, class C>
__device__ __forceinline__ C device_combine(C a, C b) {
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg || Op == reduce_op::prod) {
    if constexpr (std::is_integral_v<C> && std::is_signed_v<C> && sizeof(C) >= 4) {
      using U = std::make_unsigned_t<C>;
      const U r = Op == reduce_op::prod ? static_cast<U>(static_cast<U>(a) * static_cast<U>(b))
                                        : static_cast<U>(static_cast<U>(a) + static_cast<U>(b));
      return static_cast<C>(r);
    } else if constexpr (Op == reduce_op::prod) {
      return static_cast<C>(a * b);
    } else {
      return static_cast<C>(a + b);
    }
  } else if constexpr (Op == reduce_op::min) {
    return b < a ? b : a;
  } else {
    return a < b ? b : a;
  }
}

template <class T, reduce_op Op>
__device__ __forceinline__ typename dev_elem<T>::storage reduce_one(typename dev_elem<T>::storage a,
                                                                    typename dev_elem<T>::storage b) {
  using E = dev_elem<T>;
  return E::store(device_combine<Op>(E::load(a), E::load(b)));
}

template <class T>
__device__ __forceinline__ typename dev_elem<T>::storage divide_one(typename dev_elem<T>::storage x,
                                                                    std::size_t divisor) {
  using E = dev_elem<T>;
  using C = typename E::compute;
  if constexpr (std::is_same_v<C, float> && !std::is_same_v<T, float>) {
    return E::store(E::load(x) / static_cast<float>(divisor));
  } else if constexpr (std::is_floating_point_v<C>) {
    return x / static_cast<C>(divisor);
  } else {
    return static_cast<C>(x / static_cast<C>(divisor));
  }
}

/// Elements per 16-byte vector.
template <class S>
inline constexpr std::size_t vec_elems = 16 / sizeof(S);

/// dst[i] = a[i] op b[i] for i < n. Elements [0, head) and [head + nvec*V, n)
/// are scalar; [head, head + nvec*V) moves as nvec 16-byte vectors (dst, a, b
/// all 16-byte aligned at index head). dst may equal a or b.
template <class T, reduce_op Op>
__global__ void __launch_bounds__(256)
reduce_kernel(typename dev_elem<T>::storage* dst, const typename dev_elem<T>::storage* a,
              const typename dev_elem<T>::storage* b, std::size_t head, std::size_t nvec, std::size_t n) {
  using S = typename dev_elem<T>::storage;
  constexpr std::size_t V = vec_elems<S>;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const uint4* va = reinterpret_cast<const uint4*>(a + head);
  const uint4* vb = reinterpret_cast<const uint4*>(b + head);
  uint4* vd = reinterpret_cast<uint4*>(dst + head);
  for (std::size_t v = tid; v < nvec; v += stride) {
    const uint4 ua = va[v];
    const uint4 ub = vb[v];
    S ea[V], eb[V];
    memcpy(ea, &ua, 16);
    memcpy(eb, &ub, 16);
#pragma unroll
    for (std::size_t k = 0; k < V; ++k) ea[k] = reduce_one<T, Op>(ea[k], eb[k]);
    uint4 ud;
    memcpy(&ud, ea, 16);
    vd[v] = ud;
  }
  for (std::size_t i = tid; i < head; i += stride) dst[i] = reduce_one<T, Op>(a[i], b[i]);
  for (std::size_t i = head + nvec * V + tid; i < n; i += stride) dst[i] = reduce_one<T, Op>(a[i], b[i]);
}

/// data[i] = data[i] / divisor for i < n (layout as reduce_kernel).
template <class T>
__global__ void __launch_bounds__(256)
divide_kernel(typename dev_elem<T>::storage* data, std::size_t divisor, std::size_t head, std::size_t nvec,
              std::size_t n) {
  using S = typename dev_elem<T>::storage;
  constexpr std::size_t V = vec_elems<S>;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  uint4* vd = reinterpret_cast<uint4*>(data + head);
  for (std::size_t v = tid; v < nvec; v += stride) {
    const uint4 u = vd[v];
    S e[V];
    memcpy(e, &u, 16);
#pragma unroll
    for (std::size_t k = 0; k < V; ++k) e[k] = divide_one<T>(e[k], divisor);
    uint4 w;
    memcpy(&w, e, 16);
    vd[v] = w;
  }
  for (std::size_t i = tid; i < head; i += stride) data[i] = divide_one<T>(data[i], divisor);
  for (std::size_t i = head + nvec * V + tid; i < n; i += stride) data[i] = divide_one<T>(data[i], divisor);
}

/// Split of n elements of size `elem` at the given addresses into a scalar
/// head, 16-byte vectors and a scalar tail.
struct vec_split {
  std::size_t head = 0, nvec = 0;
};
inline vec_split split_for_vectors(std::size_t n, std::size_t elem, std::uintptr_t d, std::uintptr_t a,
                                   std::uintptr_t b) {
  const std::uintptr_t off = d % 16;
  if (a % 16 != off || b % 16 != off || off % elem != 0) return {0, 0}; // all scalar (tail covers [0, n))
  std::size_t head = off == 0 ? 0 : (16 - off) / elem;
  if (head > n) head = n;
  return {head, (n - head) / (16 / elem)};
}

/// Grid size for `work` items per launch: enough blocks of 256 threads to
/// cover it, at most 8 per SM of the current device (grid-stride beyond).
inline unsigned grid_for(std::size_t work) {
  constexpr std::size_t threads = 256;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms <= 0)
    sms = 132;
  const std::size_t cap = static_cast<std::size_t>(sms) * 8;
  std::size_t blocks = (work + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks);
}

} // namespace detail

/// Enqueues dst[i] = a[i] op b[i] for n elements (avg: the sum step) on
/// `stream` and returns without waiting. Pointers are device pointers (or
/// managed/mapped memory); dst may equal a or b, otherwise ranges must not
/// overlap. Bitwise equal to dpkit::reduce_host.
/// @throws dpkit::error if the launch fails (names the kernel and the CUDA error).
template <element T>
void reduce_device(T* dst, const T* a, const T* b, std::size_t n, reduce_op op, cudaStream_t stream) {
  if (n == 0) return;
  using S = typename detail::dev_elem<T>::storage;
  static_assert(sizeof(S) == sizeof(T));
  auto* d = reinterpret_cast<S*>(dst);
  auto* pa = reinterpret_cast<const S*>(a);
  auto* pb = reinterpret_cast<const S*>(b);
  const auto sp = detail::split_for_vectors(n, sizeof(S), reinterpret_cast<std::uintptr_t>(d),
                                                 reinterpret_cast<std::uintptr_t>(pa),
                                                 reinterpret_cast<std::uintptr_t>(pb));
  const std::size_t work = sp.nvec > 0 ? sp.nvec : n;
  const unsigned grid = detail::grid_for(work);
  switch (op) {
  case reduce_op::sum: case reduce_op::avg:
    detail::reduce_kernel<T, reduce_op::sum><<<grid, 256, 0, stream>>>(d, pa, pb, sp.head, sp.nvec, n); break;
  case reduce_op::prod:
    detail::reduce_kernel<T, reduce_op::prod><<<grid, 256, 0, stream>>>(d, pa, pb, sp.head, sp.nvec, n); break;
  case reduce_op::min:
    detail::reduce_kernel<T, reduce_op::min><<<grid, 256, 0, stream>>>(d, pa, pb, sp.head, sp.nvec, n); break;
  case reduce_op::max:
    detail::reduce_kernel<T, reduce_op::max><<<grid, 256, 0, stream>>>(d, pa, pb, sp.head, sp.nvec, n); break;
  }
  cuda_check(cudaGetLastError(), std::string("reduce_kernel<") + std::string(element_type_name(element_type_of_v<T>)) +
                                     ", " + std::string(reduce_op_name(op)) + "> launch (" + std::to_string(n) +
                                     " elements)");
}

/// Enqueues data[i] = data[i] / divisor for n elements on `stream` (finishes
/// an avg; integer types truncate, f16/bf16 divide in f32 and round once).
/// divisor <= 1 does nothing. Bitwise equal to dpkit::divide_host.
/// @throws dpkit::error if the launch fails.
template <element T>
void divide_device(T* data, std::size_t n, std::size_t divisor, cudaStream_t stream) {
  if (n == 0 || divisor <= 1) return;
  using S = typename detail::dev_elem<T>::storage;
  auto* d = reinterpret_cast<S*>(data);
  const auto addr = reinterpret_cast<std::uintptr_t>(d);
  const auto sp = detail::split_for_vectors(n, sizeof(S), addr, addr, addr);
  const unsigned grid = detail::grid_for(sp.nvec > 0 ? sp.nvec : n);
  detail::divide_kernel<T><<<grid, 256, 0, stream>>>(d, divisor, sp.head, sp.nvec, n);
  cuda_check(cudaGetLastError(), std::string("divide_kernel<") + std::string(element_type_name(element_type_of_v<T>)) +
                                     "> launch (" + std::to_string(n) + " elements)");
}

/// Type-erased reduce_device: n elements of runtime type t.
/// @throws dpkit::error if the launch fails.
inline void reduce_device(void* dst, const void* a, const void* b, std::size_t n, element_type t, reduce_op op,
                          cudaStream_t stream) {
  visit_element_type(t, [&](auto tag) {
    using T = decltype(tag);
    reduce_device<T>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n, op, stream);
  });
}

/// Type-erased divide_device: n elements of runtime type t.
/// @throws dpkit::error if the launch fails.
inline void divide_device(void* data, std::size_t n, element_type t, std::size_t divisor, cudaStream_t stream) {
  visit_element_type(t, [&](auto tag) {
    using T = decltype(tag);
    divide_device<T>(static_cast<T*>(data), n, divisor, stream);
  });
}

} // namespace dpkit
