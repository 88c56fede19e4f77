// Shared checks of the NCCL transport, run by test_nccl.cu (one rank) and
// test_nccl_mpi.cu (one rank per GPU under mpiexec). Every rank can compute
// every rank's input, so the expected result is computed on the host. Inputs
// are small multiples of 0.5, so every partial sum is exact in every type and
// the reduction order (ring, tree, NCCL) cannot change a bit.
#pragma once

#include <doctest/doctest.h>

#include <dpkit/collectives.hpp>
#include <dpkit/cuda/device_ops.cuh>
#include <dpkit/transport/nccl.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace nccl_checks {

template <class T>
std::vector<T> input_for(int rank, std::size_t count) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    const int k = static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 9) - 4; // -4..4
    if constexpr (std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>) v[i] = T(0.5f * float(k));
    else if constexpr (std::is_floating_point_v<T>) v[i] = static_cast<T>(0.5 * k);
    else if constexpr (std::is_signed_v<T>) v[i] = static_cast<T>(k);
    else v[i] = static_cast<T>(k + 4);
  }
  return v;
}

template <class T>
std::vector<T> expected(int world, std::size_t count, dpkit::reduce_op op) {
  auto acc = input_for<T>(0, count);
  for (int r = 1; r < world; ++r) {
    auto x = input_for<T>(r, count);
    dpkit::reduce_host(acc.data(), acc.data(), x.data(), count, op);
  }
  if (op == dpkit::reduce_op::avg) dpkit::divide_host(acc.data(), count, static_cast<std::size_t>(world));
  return acc;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Where two results first differ, and how many elements differ (for the failure message).
template <class T>
std::string first_difference(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
  std::size_t first = got.size(), count = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (first == got.size()) first = i;
      ++count;
    }
  if (count == 0) return "none";
  const auto value = [](const T& x) {
    if constexpr (std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>) return static_cast<double>(static_cast<float>(x));
    else return static_cast<double>(x);
  };
  return std::to_string(count) + " elements, first at " + std::to_string(first) + ": got " + std::to_string(value(got[first])) +
         ", expected " + std::to_string(value(want[first]));
}

/// All-reduce with ring, tree and native on `comm` for type T equals the host.
template <class T>
void check_allreduce(dpkit::nccl& comm) {
  const int n = comm.size(), r = comm.rank();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{(1u << 20) + 5}}) {
    for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::min, dpkit::reduce_op::max, dpkit::reduce_op::avg}) {
      for (auto algo : {dpkit::algorithm::ring, dpkit::algorithm::tree, dpkit::algorithm::native}) {
        // ncclAvg on floating types pre-multiplies by 1/n (may round
        // differently from sum-then-divide): compared for integers only.
        if (algo == dpkit::algorithm::native && op == dpkit::reduce_op::avg && !std::is_integral_v<T> && n > 1)
          continue;
        auto in_h = input_for<T>(r, count);
        dpkit::device_buffer<T> in(count), out(count);
        in.copy_from_host(in_h);
        dpkit::collective_options o;
        o.timeout = std::chrono::seconds(120);
        o.segment_bytes = 64 << 10;
        dpkit::allreduce(comm, in, out, op, dpkit::allreduce_policy{algo}, o);
        DPKIT_CUDA_CHECK(cudaStreamSynchronize(comm.stream()));
        const auto got = out.to_host(), want = expected<T>(n, count, op);
        CHECK_MESSAGE(same_bits(got, want), "type ", dpkit::element_type_of_v<T>, " op ", op, " algo ", algo, " count ",
                      count, " rank ", r, " of ", n, ", differences: ", first_difference(got, want));
      }
    }
  }
}

/// Native reduce-scatter, all-gather, broadcast, reduce and barrier.
template <class T>
void check_native(dpkit::nccl& comm) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t ns = static_cast<std::size_t>(n), count = 1003;
  const auto t = dpkit::element_type_of_v<T>;
  { // reduce-scatter: in has count*n, out count
    auto in_h = input_for<T>(r, count * ns);
    dpkit::device_buffer<T> in(count * ns), out(count);
    in.copy_from_host(in_h);
    comm.native_reduce_scatter(in.data(), out.data(), count, t, dpkit::reduce_op::sum);
    auto all = expected<T>(n, count * ns, dpkit::reduce_op::sum);
    std::vector<T> want(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * count),
                        all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * count));
    CHECK(same_bits(out.to_host(), want));
  }
  { // all-gather
    auto in_h = input_for<T>(r, count);
    dpkit::device_buffer<T> in(count), out(count * ns);
    in.copy_from_host(in_h);
    comm.native_allgather(in.data(), out.data(), count, t);
    std::vector<T> want;
    for (int k = 0; k < n; ++k) {
      auto x = input_for<T>(k, count);
      want.insert(want.end(), x.begin(), x.end());
    }
    CHECK(same_bits(out.to_host(), want));
  }
  { // broadcast from the last rank, reduce to rank 0
    const int root = n - 1;
    auto in_h = input_for<T>(r, count);
    dpkit::device_buffer<T> in(count), out(count);
    in.copy_from_host(in_h);
    comm.native_broadcast(in.data(), out.data(), count, t, root);
    CHECK(same_bits(out.to_host(), input_for<T>(root, count)));
    comm.native_reduce(in.data(), out.data(), count, t, dpkit::reduce_op::max, 0);
    if (r == 0) CHECK(same_bits(out.to_host(), expected<T>(n, count, dpkit::reduce_op::max)));
  }
  // avg over a count that is no multiple of NCCL's block count: a one-rank
  // ncclAvg leaves the tail unwritten in NCCL <= 2.29.6 (NVIDIA/nccl#1950);
  // floating types only on one rank (ncclAvg pre-multiplies by 1/n there)
  if (std::is_integral_v<T> || n == 1) {
    const std::size_t big = (std::size_t{1} << 20) + 5;
    auto in_h = input_for<T>(r, big * ns);
    dpkit::device_buffer<T> in(big * ns), out(big * ns);
    in.copy_from_host(in_h);
    comm.native_reduce_scatter(in.data(), out.data(), big, t, dpkit::reduce_op::avg);
    auto all = expected<T>(n, big * ns, dpkit::reduce_op::avg);
    std::vector<T> want(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * big),
                        all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * big));
    auto got = out.to_host();
    got.resize(big);
    CHECK_MESSAGE(same_bits(got, want), "reduce-scatter avg: ", first_difference(got, want));
    comm.native_reduce(in.data(), out.data(), big * ns, t, dpkit::reduce_op::avg, 0);
    if (r == 0) {
      const auto got2 = out.to_host();
      CHECK_MESSAGE(same_bits(got2, all), "reduce avg: ", first_difference(got2, all));
    }
  }
  comm.native_barrier();
  CHECK_THROWS_AS(comm.native_broadcast(nullptr, nullptr, 0, t, n), dpkit::invalid_argument);
}

/// Point-to-point edge cases.
inline void check_p2p_errors(dpkit::nccl& comm) {
  std::byte* p = nullptr;
  CHECK_THROWS_AS(comm.isend({p, std::size_t{0}}, comm.rank(), 0), dpkit::invalid_argument);
  CHECK_THROWS_AS(comm.irecv({p, std::size_t{0}}, comm.size(), 0), dpkit::invalid_argument);
  static_assert(!dpkit::nccl::accepts(dpkit::memory_space::host));
  static_assert(dpkit::native_collectives<dpkit::nccl> && dpkit::async_transport<dpkit::nccl>);
}

} // namespace nccl_checks
