// The NCCL transport with one rank (ncclCommInitAll on device 0): native
// collectives, ring/tree on device tensors through the transport's
// device_ops, async all-reduce, argument errors. Multi-rank runs are in
// test_nccl_mpi.cu (mpiexec, one rank per GPU).
#include "nccl_checks.hpp"

TEST_CASE_TEMPLATE("nccl (1 rank): ring, tree and native all-reduce equal the host", T, float, double, dpkit::f16,
                   dpkit::bf16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, std::int64_t, std::uint64_t) {
  dpkit::nccl_options o;
  o.kernels = dpkit::cuda_kernels();
  auto comm = dpkit::nccl::single(0, o);
  REQUIRE(comm.size() == 1);
  REQUIRE(comm.device() != nullptr);
  nccl_checks::check_allreduce<T>(comm);
  nccl_checks::check_native<T>(comm);
}

TEST_CASE("nccl (1 rank): async all-reduce, errors, no kernels") {
  dpkit::nccl_options o;
  o.kernels = dpkit::cuda_kernels();
  auto comm = dpkit::nccl::single(0, o);
  nccl_checks::check_p2p_errors(comm);
  dpkit::device_buffer<float> g(4096);
  g.copy_from_host(std::vector<float>(4096, 2.0f));
  auto h = dpkit::allreduce_async(comm, g, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::native});
  h.wait();
  CHECK(g.to_host() == std::vector<float>(4096, 2.0f));

  auto bare = dpkit::nccl::single(0); // no kernels: native works, ring on device throws
  CHECK(bare.device() == nullptr);
  bare.native_allreduce(g.data(), g.data(), g.size(), dpkit::element_type::f32, dpkit::reduce_op::sum);
  // refused on one rank too (a copy would do there), so that a program that
  // works on one GPU does not first fail at scale
  CHECK_THROWS_AS(dpkit::allreduce_ring(bare, g), dpkit::invalid_argument);
  CHECK_THROWS_AS(dpkit::nccl::single(1000), dpkit::invalid_argument);
}
