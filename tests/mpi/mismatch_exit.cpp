// A program whose ranks disagree (rank 1 takes the max, the others sum) and
// that does not catch the error: the job must end non-zero with the
// mismatch_error's message, never return as if nothing happened. Run by meson
// under mpiexec as a test that must fail (should_fail).
#include <dpkit/dpkit.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    std::vector<float> v(1000, 1.0f);
    dpkit::allreduce(comm, v, comm.rank() == 1 ? dpkit::reduce_op::max : dpkit::reduce_op::sum);
    std::printf("rank %d: returned without an error\n", comm.rank());
  }
  MPI_Finalize();
  return 0;
}
