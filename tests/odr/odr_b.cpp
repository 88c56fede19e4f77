// ODR check, TU 2 of 2 (see odr_a.cpp). No doctest here: plain functions
// called from odr_a.cpp, using the same headers and instantiations.
#include <dpkit/dpkit.hpp>

#include <sstream>
#include <vector>

double odr_b_allreduce(int n) {
  dpkit::inproc_world world(n);
  std::vector<double> res(static_cast<std::size_t>(n));
  world.run([&](dpkit::inproc& comm) {
    std::vector<double> v(100, comm.rank() + 1.0);
    dpkit::allreduce(comm, v);
    std::vector<float> f(10, 1.0f);
    dpkit::allreduce_ring(comm, f, dpkit::reduce_op::max);
    std::vector<std::int32_t> g(3 * static_cast<std::size_t>(n), 1), part(3);
    dpkit::reduce_scatter_ring(comm, g, part);
    dpkit::allgather_ring(comm, part, g);
    dpkit::broadcast_tree(comm, v, 0);
    dpkit::reduce_tree(comm, g, g);
    dpkit::barrier(comm);
    auto h = dpkit::allreduce_async(comm, v);
    h.wait();
    res[static_cast<std::size_t>(comm.rank())] = comm.rank() == 0 ? v[99] / n + f[0] : 0;
  });
  std::ostringstream os;
  os << dpkit::collective_options{} << dpkit::allreduce_policy{} << dpkit::reduce_op::sum << dpkit::element_type::f16
     << dpkit::memory_space::host << dpkit::algorithm::tree;
  return res[0];
}

std::uint16_t odr_b_half(float v) { return dpkit::f16::from_float(v) + dpkit::bf16::from_float(v) * 0; }
