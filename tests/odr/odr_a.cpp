// ODR check, TU 1 of 2: includes the umbrella header and instantiates the same
// collectives, element types and inline functions as odr_b.cpp. Linking both
// into one executable fails (multiple definition) if a non-template function
// or variable in a header is not inline.
#include <dpkit/dpkit.hpp>

#include <doctest/doctest.h>

#include <vector>

double odr_b_allreduce(int n);           // odr_b.cpp
std::uint16_t odr_b_half(float v);       // odr_b.cpp

namespace {
double odr_a_allreduce(int n) {
  dpkit::inproc_world world(n);
  std::vector<double> res(static_cast<std::size_t>(n));
  world.run([&](dpkit::inproc& comm) {
    std::vector<double> v(100, comm.rank() + 1.0);
    dpkit::allreduce(comm, v);                               // same instantiation as in odr_b.cpp
    std::vector<float> f(10, 1.0f);
    dpkit::allreduce_tree(comm, f, dpkit::reduce_op::max);
    dpkit::barrier(comm);
    res[static_cast<std::size_t>(comm.rank())] = v[99] + f[0];
  });
  return res[0];
}
} // namespace

TEST_CASE("odr: two translation units including <dpkit/dpkit.hpp> agree") {
  CHECK(odr_a_allreduce(3) == 7.0);
  CHECK(odr_b_allreduce(3) == 7.0);
  CHECK(odr_b_allreduce(4) == odr_a_allreduce(4));
  CHECK(odr_b_half(1.5f) == dpkit::f16::from_float(1.5f));
  CHECK(dpkit::parse_reduce_op("max") == dpkit::reduce_op::max);
  CHECK(dpkit::parse_algorithm("ring") == dpkit::algorithm::ring);
}
