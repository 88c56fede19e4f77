// doctest main for tests run under mpiexec: every rank runs the same test
// cases in the same order (collectives inside them must match across ranks);
// the exit code is non-zero on every rank if any rank failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  doctest::Context ctx(argc, argv);
  ctx.setOption("order-by", "file");
  if (rank != 0) ctx.setOption("no-intro", true);
  int failed = ctx.run();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("[mpi] %d ranks, MPI thread level %d: %s\n", size, provided, any ? "FAILED" : "all passed");
  MPI_Finalize();
  return any ? 1 : 0;
}
