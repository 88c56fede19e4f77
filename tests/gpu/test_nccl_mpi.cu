// The NCCL transport under mpiexec, one rank per GPU (nccl_from_mpi): ring,
// tree and native collectives equal the host reference. Exits 77 (skip) on
// every rank when the node has fewer GPUs than ranks.
#define DOCTEST_CONFIG_IMPLEMENT
#include "nccl_checks.hpp"

#include <dpkit/transport/nccl_mpi.hpp>

#include <cstdio>

namespace {
dpkit::nccl* g_comm = nullptr;
}

TEST_CASE_TEMPLATE("nccl (mpi): ring, tree and native equal the host", T, float, double, dpkit::f16, dpkit::bf16,
                   std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, std::int64_t, std::uint64_t) {
  nccl_checks::check_allreduce<T>(*g_comm);
  nccl_checks::check_native<T>(*g_comm);
}

TEST_CASE("nccl (mpi): async and argument errors") {
  nccl_checks::check_p2p_errors(*g_comm);
  dpkit::device_buffer<std::int32_t> g(1 << 16);
  g.copy_from_host(std::vector<std::int32_t>(1 << 16, g_comm->rank() + 1));
  auto h = dpkit::allreduce_async(*g_comm, g, dpkit::reduce_op::sum, dpkit::allreduce_policy{dpkit::algorithm::ring});
  h.wait();
  const int n = g_comm->size();
  CHECK(g.to_host() == std::vector<std::int32_t>(1 << 16, n * (n + 1) / 2));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Every rank must take the same decision: the node-local GPU count is the
  // same on all ranks of a single-node run; take the minimum to be safe.
  int ndev = dpkit::cuda_device_count(), min_dev = 0, node_size = 0;
  MPI_Allreduce(&ndev, &min_dev, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  if (min_dev < node_size) {
    if (rank == 0) std::printf("need one GPU per rank (%d ranks on this node, %d GPUs): skipping\n", node_size, min_dev);
    MPI_Finalize();
    return 77;
  }
  int rc = 0;
  {
    dpkit::nccl_options o;
    o.kernels = dpkit::cuda_kernels();
    auto comm = dpkit::nccl_from_mpi(MPI_COMM_WORLD, -1, o);
    g_comm = &comm;
    doctest::Context ctx(argc, argv);
    rc = ctx.run();
    g_comm = nullptr;
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
