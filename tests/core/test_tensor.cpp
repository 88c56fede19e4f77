// The tensor concept, tensor_traits customization, as_span, memory spaces.
#include <dpkit/dpkit.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace user {
// A tensor type that only has data_ptr() and numel() (libtorch-like).
struct my_tensor {
  std::vector<float> storage;
  float* data_ptr() { return storage.data(); }
  std::int64_t numel() const { return static_cast<std::int64_t>(storage.size()); }
};
// A device-memory tensor type with the space known at compile time.
struct device_buffer {
  std::int32_t* ptr = nullptr;
  std::size_t n = 0;
};
// A type with data()/size() of a non-element type and no traits.
struct not_a_tensor {
  int x = 0;
};
struct char_buffer { // char is not a dpkit element type
  char* data() { return nullptr; }
  std::size_t size() const { return 0; }
};
} // namespace user

template <>
struct dpkit::tensor_traits<user::my_tensor> {
  using value_type = float;
  static float* data(user::my_tensor& t) { return t.data_ptr(); }
  static std::size_t size(const user::my_tensor& t) { return static_cast<std::size_t>(t.numel()); }
};
template <>
struct dpkit::tensor_traits<user::device_buffer> {
  using value_type = std::int32_t;
  static constexpr dpkit::memory_space memory = dpkit::memory_space::device;
  static std::int32_t* data(user::device_buffer& t) { return t.ptr; }
  static std::size_t size(const user::device_buffer& t) { return t.n; }
};

using dpkit::bf16;
using dpkit::f16;
using dpkit::memory_space;
using dpkit::tensor;

// Positive cases.
static_assert(tensor<std::vector<float>>);
static_assert(tensor<const std::vector<float>&>);
static_assert(tensor<std::vector<double>&&>);
static_assert(tensor<std::span<bf16>>);
static_assert(tensor<std::span<const f16>>);
static_assert(tensor<std::array<std::int32_t, 4>>);
static_assert(tensor<std::uint8_t[16]>);
static_assert(tensor<std::int64_t (&)[3]>);
static_assert(tensor<dpkit::tensor_view<std::uint64_t>>);
static_assert(tensor<dpkit::tensor_view<const float>>);
static_assert(tensor<user::my_tensor>);
static_assert(tensor<user::device_buffer>);
// Negative cases.
static_assert(!tensor<std::vector<std::string>>);
static_assert(!tensor<std::vector<bool>>);
static_assert(!tensor<std::vector<long double>>);
static_assert(!tensor<std::string>); // char is not an element type
static_assert(!tensor<user::not_a_tensor>);
static_assert(!tensor<user::char_buffer>);
static_assert(!tensor<int>);
static_assert(!tensor<float*>);
static_assert(!tensor<std::string[4]>);
// Element and value types.
static_assert(std::is_same_v<dpkit::tensor_value_t<std::span<const f16>>, f16>);
static_assert(std::is_same_v<dpkit::tensor_value_t<const std::array<std::int32_t, 4>&>, std::int32_t>);
static_assert(std::is_same_v<dpkit::tensor_value_t<user::my_tensor>, float>);
// as_span constness follows the tensor.
static_assert(std::is_same_v<decltype(dpkit::as_span(std::declval<std::vector<float>&>())), std::span<float>>);
static_assert(std::is_same_v<decltype(dpkit::as_span(std::declval<const std::vector<float>&>())),
                             std::span<const float>>);
static_assert(std::is_same_v<decltype(dpkit::as_span(std::declval<std::span<const bf16>&>())),
                             std::span<const bf16>>);
static_assert(std::is_same_v<decltype(dpkit::as_span(std::declval<dpkit::tensor_view<const double>&>())),
                             std::span<const double>>);
// Static memory spaces.
static_assert(dpkit::static_memory_space_v<std::vector<float>> == memory_space::host);
static_assert(dpkit::static_memory_space_v<user::my_tensor> == memory_space::host);
static_assert(dpkit::static_memory_space_v<user::device_buffer> == memory_space::device);
static_assert(!dpkit::static_memory_space_v<dpkit::tensor_view<float>>.has_value());
// The inproc transport and its request model the concepts.
static_assert(dpkit::transport<dpkit::inproc>);
static_assert(dpkit::async_transport<dpkit::inproc>);
static_assert(dpkit::request<dpkit::inproc_request>);
static_assert(!dpkit::native_collectives<dpkit::inproc>);

TEST_CASE("tensor: as_span, size_of, space_of on standard and user types") {
  std::vector<float> v{1, 2, 3};
  CHECK(dpkit::as_span(v).data() == v.data());
  CHECK(dpkit::size_of(v) == 3);
  CHECK(dpkit::space_of(v) == memory_space::host);

  std::array<std::int32_t, 4> a{1, 2, 3, 4};
  CHECK(dpkit::as_span(a).size() == 4);
  CHECK(dpkit::as_span(a)[3] == 4);

  std::int8_t c[5] = {1, 2, 3, 4, 5};
  auto cs = dpkit::as_span(c);
  CHECK(cs.data() == c);
  CHECK(cs.size() == 5);

  std::vector<bf16> bv(7);
  std::span<bf16> bs(bv);
  CHECK(dpkit::as_span(bs).data() == bv.data());
  CHECK(dpkit::size_of(bs) == 7);

  user::my_tensor t{{1, 2, 3, 4, 5, 6}};
  CHECK(dpkit::as_span(t).data() == t.storage.data());
  CHECK(dpkit::size_of(t) == 6);
  CHECK(dpkit::space_of(t) == memory_space::host);

  user::device_buffer d{nullptr, 9};
  CHECK(dpkit::size_of(d) == 9);
  CHECK(dpkit::space_of(d) == memory_space::device);

  double buf[8] = {};
  dpkit::tensor_view<double> tv{buf + 2, 4, memory_space::device};
  CHECK(dpkit::as_span(tv).data() == buf + 2);
  CHECK(dpkit::size_of(tv) == 4);
  CHECK(dpkit::space_of(tv) == memory_space::device);
  tv.where = memory_space::host;
  CHECK(dpkit::space_of(tv) == memory_space::host);

  std::ostringstream os;
  os << memory_space::host << ' ' << memory_space::device;
  CHECK(os.str() == "host device");
}

TEST_CASE("tensor: a user type adapted via tensor_traits plugs into allreduce") {
  dpkit::inproc_world world(3);
  std::vector<std::vector<float>> results(3);
  world.run([&](dpkit::inproc& comm) {
    user::my_tensor t{std::vector<float>(5, static_cast<float>(comm.rank() + 1))};
    dpkit::allreduce(comm, t, dpkit::reduce_op::sum);
    user::my_tensor out{std::vector<float>(5)};
    dpkit::allreduce_ring(comm, t, out, dpkit::reduce_op::max);
    std::vector<float> r = t.storage;
    r.insert(r.end(), out.storage.begin(), out.storage.end());
    results[static_cast<std::size_t>(comm.rank())] = r;
  });
  for (const auto& r : results) {
    REQUIRE(r.size() == 10);
    for (std::size_t i = 0; i < 10; ++i) CHECK(r[i] == 6.0f);
  }
}

TEST_CASE("tensor: C arrays, std::array, spans and views plug into collectives") {
  dpkit::inproc_world world(4);
  world.run([&](dpkit::inproc& comm) {
    const auto r = comm.rank();
    std::int64_t c[3] = {r, 2 * r, 3 * r};
    dpkit::allreduce_tree(comm, c);
    CHECK(c[0] == 6);
    CHECK(c[2] == 18);
    std::array<std::int32_t, 4> a{r, r, r, r};
    dpkit::allreduce(comm, a, dpkit::reduce_op::max);
    CHECK(a == std::array<std::int32_t, 4>{3, 3, 3, 3});
    std::vector<bf16> bv(6, bf16(static_cast<float>(r)));
    dpkit::allreduce(comm, std::span<bf16>(bv), dpkit::reduce_op::sum);
    for (auto x : bv) CHECK(static_cast<float>(x) == 6.0f);
    std::vector<double> big(10, 1.0);
    dpkit::tensor_view<double> slice{big.data() + 2, 5, memory_space::host};
    dpkit::allreduce_ring(comm, slice);
    CHECK(big[1] == 1.0);
    CHECK(big[2] == 4.0);
    CHECK(big[6] == 4.0);
    CHECK(big[7] == 1.0);
  });
}
