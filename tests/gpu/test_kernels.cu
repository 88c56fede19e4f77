// Reduction kernels vs the host reference (dpkit::reduce_host /
// dpkit::divide_host): bitwise equal for every op, element type, length and
// alignment; device_buffer; CUDA error reporting.
#include <doctest/doctest.h>

#include <dpkit/cuda/device_ops.cuh>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

template <class T>
T value_from(std::mt19937& g, dpkit::reduce_op op) {
  // Small magnitudes so integer sums/products never overflow on the host (UB
  // there) and floats stay finite.
  std::uniform_int_distribution<int> small(-4, 4);
  std::uniform_int_distribution<int> usmall(0, 8);
  std::uniform_real_distribution<float> real(-2.0f, 2.0f);
  (void)op;
  if constexpr (std::is_same_v<T, dpkit::f16> || std::is_same_v<T, dpkit::bf16>) return T(real(g));
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(real(g));
  else if constexpr (std::is_signed_v<T>) return static_cast<T>(small(g));
  else return static_cast<T>(usmall(g));
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
void check_reduce(std::size_t n, std::size_t off_dst, std::size_t off_a, std::size_t off_b, dpkit::reduce_op op,
                  int mode /*0 out of place, 1 dst==a, 2 dst==b*/) {
  std::mt19937 g(static_cast<unsigned>(n * 131 + off_dst * 7 + off_a * 3 + off_b + static_cast<unsigned>(op)));
  const std::size_t pad = 16;
  std::vector<T> ha(n + pad), hb(n + pad);
  for (auto& x : ha) x = value_from<T>(g, op);
  for (auto& x : hb) x = value_from<T>(g, op);
  dpkit::device_buffer<T> da(n + pad), db(n + pad), dd(n + pad);
  da.copy_from_host(ha);
  db.copy_from_host(hb);
  dd.fill_bytes(0);
  T* dst = mode == 1 ? da.data() + off_a : mode == 2 ? db.data() + off_b : dd.data() + off_dst;
  dpkit::reduce_device<T>(dst, da.data() + off_a, db.data() + off_b, n, op, cudaStreamPerThread);
  DPKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  std::vector<T> want(n), got(n);
  dpkit::reduce_host(want.data(), ha.data() + off_a, hb.data() + off_b, n, op);
  const auto& src = mode == 1 ? da : mode == 2 ? db : dd;
  const std::size_t off = mode == 1 ? off_a : mode == 2 ? off_b : off_dst;
  if (n) DPKIT_CUDA_CHECK(cudaMemcpy(got.data(), src.data() + off, n * sizeof(T), cudaMemcpyDeviceToHost));
  CHECK_MESSAGE(bitwise_equal(want, got), "type ", dpkit::element_type_of_v<T>, " op ", op, " n ", n, " offsets ",
                off_dst, "/", off_a, "/", off_b, " mode ", mode);
}

} // namespace

TEST_CASE_TEMPLATE("reduce_device equals reduce_host bitwise", T, float, double, dpkit::f16, dpkit::bf16, std::int8_t,
                   std::uint8_t, std::int32_t, std::uint32_t, std::int64_t, std::uint64_t) {
  using dpkit::reduce_op;
  for (auto op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{33},
                          std::size_t{1000}, std::size_t{(1u << 20) + 3}}) {
      check_reduce<T>(n, 0, 0, 0, op, 0);                 // all aligned: vector path
      check_reduce<T>(n, 1, 1, 1, op, 0);                 // same misalignment: head peel
      check_reduce<T>(n, 0, 1, 3, op, 0);                 // mixed: scalar path
      check_reduce<T>(n, 0, 2, 0, op, 1);                 // in place dst == a
      check_reduce<T>(n, 0, 0, 5, op, 2);                 // in place dst == b
    }
  }
}

TEST_CASE_TEMPLATE("divide_device equals divide_host bitwise", T, float, double, dpkit::f16, dpkit::bf16, std::int8_t,
                   std::uint8_t, std::int32_t, std::uint32_t, std::int64_t, std::uint64_t) {
  for (std::size_t divisor : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{8}}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{1000}, std::size_t{(1u << 18) + 1}}) {
      for (std::size_t off : {std::size_t{0}, std::size_t{1}}) {
        std::mt19937 g(static_cast<unsigned>(n + divisor * 17 + off));
        std::vector<T> h(n + off);
        for (auto& x : h) x = value_from<T>(g, dpkit::reduce_op::sum);
        for (auto& x : h) dpkit::reduce_host(&x, &x, &x, 1, dpkit::reduce_op::sum); // widen the range a bit
        dpkit::device_buffer<T> d(n + off);
        d.copy_from_host(h);
        dpkit::divide_device<T>(d.data() + off, n, divisor, cudaStreamPerThread);
        DPKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
        auto got = d.to_host();
        dpkit::divide_host(h.data() + off, n, divisor);
        CHECK_MESSAGE(bitwise_equal(h, got), "type ", dpkit::element_type_of_v<T>, " n ", n, " divisor ", divisor);
      }
    }
  }
}

TEST_CASE("device_ops table: type-erased reduce/divide/copy/allocate on a stream") {
  cudaStream_t s{};
  DPKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    auto ops = dpkit::make_cuda_device_ops(s);
    const dpkit::device_ops& t = *ops.get();
    const std::size_t n = 1001;
    std::vector<float> a(n), b(n), want(n), got(n);
    for (std::size_t i = 0; i < n; ++i) a[i] = float(i), b[i] = float(2 * i);
    auto* da = static_cast<float*>(t.allocate(n * sizeof(float), t.ctx));
    auto* db = static_cast<float*>(t.allocate(n * sizeof(float), t.ctx));
    t.copy(da, a.data(), n * sizeof(float), t.ctx);
    t.copy(db, b.data(), n * sizeof(float), t.ctx);
    t.reduce(da, da, db, n, dpkit::element_type::f32, dpkit::reduce_op::avg, t.ctx);
    t.divide(da, n, dpkit::element_type::f32, 2, t.ctx);
    t.synchronize(t.ctx);
    t.copy(got.data(), da, n * sizeof(float), t.ctx);
    for (std::size_t i = 0; i < n; ++i) want[i] = (a[i] + b[i]) / 2.0f;
    CHECK(got == want);
    t.deallocate(da, t.ctx);
    t.deallocate(db, t.ctx);
    t.synchronize(t.ctx);
  }
  DPKIT_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST_CASE("device_buffer is a move-only device tensor") {
  static_assert(dpkit::tensor<dpkit::device_buffer<float>>);
  static_assert(dpkit::static_memory_space_v<dpkit::device_buffer<float>> == dpkit::memory_space::device);
  static_assert(!std::is_copy_constructible_v<dpkit::device_buffer<float>>);
  dpkit::device_buffer<int> a(10);
  std::vector<int> h(10, 7);
  a.copy_from_host(h);
  dpkit::device_buffer<int> b(std::move(a));
  CHECK(a.size() == 0);
  CHECK(a.data() == nullptr);
  CHECK(b.to_host() == h);
  CHECK_THROWS_AS(b.copy_from_host(std::vector<int>(3)), dpkit::invalid_argument);
  CHECK(dpkit::as_span(b).data() == b.data());
}

TEST_CASE("CUDA errors throw dpkit::error naming the call") {
  try {
    dpkit::device_buffer<double> huge(std::size_t{1} << 60);
    FAIL("expected an allocation failure");
  } catch (const dpkit::error& e) {
    CHECK(std::string(e.what()).find("cudaMalloc") != std::string::npos);
  }
}
