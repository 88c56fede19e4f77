// A collective on a transport that outlived its process's MPI_Finalize must
// throw communicator_error, not crash (before the fix: a segfault in the
// shared-memory all-reduce, its segment unmapped by MPI_Finalize). Run by
// meson under mpiexec -n 2 (mpi_after_finalize); exits 0 when every rank threw.
#include <dpkit/dpkit.hpp>

#include <mpi.h>

#include <cstdio>
#include <optional>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  std::optional<dpkit::mpi> comm;
  comm.emplace(MPI_COMM_WORLD);
  const int rank = comm->rank();
  std::vector<float> v(1000, 1.0f);
  dpkit::allreduce(*comm, v); // healthy
  MPI_Finalize();
  int rc = 1;
  for (auto a : {dpkit::algorithm::automatic, dpkit::algorithm::shm, dpkit::algorithm::ring,
                 dpkit::algorithm::native}) {
    try {
      dpkit::allreduce(*comm, v, dpkit::reduce_op::sum, dpkit::allreduce_policy{a});
      std::printf("rank %d: %s returned after MPI_Finalize\n", rank, dpkit::algorithm_name(a).data());
      return 1;
    } catch (const dpkit::communicator_error& e) {
      std::printf("rank %d: %s\n", rank, e.what());
      rc = 0;
    }
  }
  comm.reset(); // after MPI_Finalize: frees nothing, no MPI call
  return rc;
}
