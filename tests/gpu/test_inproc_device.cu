// Ring and tree collectives on device tensors over the inproc transport (2-8
// ranks as threads on one GPU, one cudaStreamPerThread stream per rank): every
// rank's result is bitwise equal to the same algorithm run on host memory
// (whose reductions are dpkit::reduce_host), for every element type.
#include <doctest/doctest.h>

#include <dpkit/collectives.hpp>
#include <dpkit/cuda/device_ops.cuh>
#include <dpkit/transport/inproc.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace {

template <class T>
std::vector<T> input_for(int rank, std::size_t count) {
  std::mt19937 g(static_cast<unsigned>(rank * 7919 + count));
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<T> v(count);
  for (auto& x : v) {
    const int k = d(g);
    if constexpr (std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>) x = T(static_cast<float>(k) * 0.37f);
    else if constexpr (std::is_floating_point_v<T>) x = static_cast<T>(static_cast<double>(k) * 0.37);
    else if constexpr (std::is_signed_v<T>) x = static_cast<T>(k);
    else x = static_cast<T>(k + 3);
  }
  return v;
}

enum class coll { allreduce_ring, allreduce_tree, reduce_scatter, allgather, broadcast, reduce };

// Runs collective c on `world_size` ranks with tensors of type V (host vector
// or device tensor_view), returns every rank's output on the host.
template <class T>
std::vector<std::vector<T>> run(coll c, int world_size, std::size_t count, dpkit::reduce_op op, bool device,
                                const dpkit::device_ops* ops, const dpkit::collective_options& o) {
  const std::size_t n = static_cast<std::size_t>(world_size);
  const std::size_t in_count = c == coll::reduce_scatter ? count * n : count;
  const std::size_t out_count = c == coll::allgather ? count * n : count;
  std::vector<std::vector<T>> outs(n);
  dpkit::inproc_world world(world_size, device ? ops : nullptr);
  world.run([&](dpkit::inproc& comm) {
    const int r = comm.rank();
    auto in_h = input_for<T>(r, in_count);
    std::vector<T> out_h(out_count, T{});
    dpkit::device_buffer<T> in_d, out_d;
    dpkit::tensor_view<T> in{in_h.data(), in_count, dpkit::memory_space::host};
    dpkit::tensor_view<T> out{out_h.data(), out_count, dpkit::memory_space::host};
    if (device) {
      in_d = dpkit::device_buffer<T>(in_count);
      out_d = dpkit::device_buffer<T>(out_count);
      in_d.copy_from_host(in_h);
      out_d.copy_from_host(out_h);
      in = {in_d.data(), in_count, dpkit::memory_space::device};
      out = {out_d.data(), out_count, dpkit::memory_space::device};
    }
    switch (c) {
    case coll::allreduce_ring: dpkit::allreduce_ring(comm, in, out, op, o); break;
    case coll::allreduce_tree: dpkit::allreduce_tree(comm, in, out, op, o); break;
    case coll::reduce_scatter: dpkit::reduce_scatter_ring(comm, in, out, op, o); break;
    case coll::allgather: dpkit::allgather_ring(comm, in, out, o); break;
    case coll::broadcast: dpkit::broadcast_tree(comm, in, out, world_size - 1, o); break;
    case coll::reduce: dpkit::reduce_tree(comm, in, out, op, 0, o); break;
    }
    if (device) {
      DPKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
      out_d.copy_to_host(out_h);
    }
    outs[static_cast<std::size_t>(r)] = std::move(out_h);
  });
  return outs;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

} // namespace

TEST_CASE_TEMPLATE("device ring/tree over inproc equal the host run bitwise", T, float, double, dpkit::f16,
                   dpkit::bf16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, std::int64_t,
                   std::uint64_t) {
  auto ops = dpkit::make_cuda_device_ops(cudaStreamPerThread);
  dpkit::collective_options o;
  o.timeout = std::chrono::seconds(60);
  for (int ws : {2, 3, 5, 8}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{65537}}) {
      for (std::size_t seg : {std::size_t{256}, std::size_t{1} << 20}) {
        if (seg == 256 && count > 1000) continue; // many tiny segments: keep the run short
        o.segment_bytes = seg;
        for (auto c : {coll::allreduce_ring, coll::allreduce_tree, coll::reduce_scatter, coll::allgather,
                       coll::broadcast, coll::reduce}) {
          for (auto op : {dpkit::reduce_op::sum, dpkit::reduce_op::max, dpkit::reduce_op::avg}) {
            if ((c == coll::allgather || c == coll::broadcast) && op != dpkit::reduce_op::sum) continue;
            auto want = run<T>(c, ws, count, op, false, nullptr, o);
            auto got = run<T>(c, ws, count, op, true, ops.get(), o);
            for (int r = 0; r < ws; ++r) {
              if (c == coll::reduce && r != 0) continue; // only the root's output is defined
              CHECK_MESSAGE(same_bits(want[static_cast<std::size_t>(r)], got[static_cast<std::size_t>(r)]),
                            "collective ", static_cast<int>(c), " type ", dpkit::element_type_of_v<T>, " op ", op,
                            " world ", ws, " count ", count, " segment ", seg, " rank ", r);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("device allreduce_async over inproc runs on the communication thread") {
  auto ops = dpkit::make_cuda_device_ops();
  const int ws = 4;
  const std::size_t count = 10007;
  dpkit::inproc_world world(ws, ops.get());
  world.run([&](dpkit::inproc& comm) {
    std::vector<float> h(count, float(comm.rank() + 1));
    dpkit::device_buffer<float> d(count);
    d.copy_from_host(h);
    auto handle = dpkit::allreduce_async(comm, d, dpkit::reduce_op::sum);
    handle.wait();
    auto back = d.to_host();
    CHECK(back == std::vector<float>(count, 10.0f));
  });
}

TEST_CASE("host-only inproc world rejects device tensors") {
  dpkit::inproc_world world(2);
  world.run([](dpkit::inproc& comm) {
    dpkit::device_buffer<float> d(8);
    CHECK_THROWS_AS(dpkit::allreduce_ring(comm, d), dpkit::invalid_argument);
  });
}
