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

TEST_CASE("nccl: a rank that never joins: init_rank throws timeout_error within the deadline, no hang") {
  // rank 0 of a 2-rank communicator whose rank 1 never calls init_rank
  // (one GPU suffices: the missing rank needs none). Blocking
  // ncclCommInitRank would wait forever here.
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  dpkit::nccl_options o;
  o.native_timeout = std::chrono::milliseconds(3000);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    auto comm = dpkit::nccl::init_rank(id, 2, 0, 0, o);
    FAIL("init_rank returned without its peer");
  } catch (const dpkit::timeout_error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("timeout_error after ", s, " s: ", std::string(e.what()));
    CHECK(s >= 2.9);
    CHECK(s < 30.0);
    CHECK(std::string(e.what()).find("rank 0 of 2") != std::string::npos);
  }
  // the GPU and NCCL still work afterwards
  auto one = dpkit::nccl::single(0);
  dpkit::device_buffer<float> g(1000);
  g.copy_from_host(std::vector<float>(1000, 3.0f));
  one.native_allreduce(g.data(), g.data(), g.size(), dpkit::element_type::f32, dpkit::reduce_op::sum);
  CHECK(g.to_host() == std::vector<float>(1000, 3.0f));
}

TEST_CASE("nccl: init_rank's non-blocking communicator runs collectives and point-to-point setup (1 rank)") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  dpkit::nccl_options o;
  o.kernels = dpkit::cuda_kernels();
  o.native_timeout = std::chrono::milliseconds(60000);
  auto comm = dpkit::nccl::init_rank(id, 1, 0, 0, o);
  REQUIRE(comm.size() == 1);
  nccl_checks::check_allreduce<float>(comm);
  nccl_checks::check_native<float>(comm);
  nccl_checks::check_native<dpkit::bf16>(comm);
}
