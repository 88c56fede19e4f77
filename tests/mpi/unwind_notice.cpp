// Rank 0 leaves its transport by an exception that is not dpkit's (a file it
// cannot open, say) and catches it in main, while rank 1 waits in an
// all-reduce with a 30 s deadline. ~mpi, running during the unwinding, tells
// rank 1 (a fault notice), which must throw peer_error within seconds, not
// at its deadline (before: rank 0 waited in MPI_Win_free for rank 1, which
// waited out its 30 s). Both ranks then finalize. Run by meson under
// mpiexec -n 2 (mpi_unwind_notice); exits 0 on success.
#include <dpkit/dpkit.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int ok = 0;
  try {
    dpkit::mpi comm(MPI_COMM_WORLD);
    std::vector<float> v(1000, 1.0f);
    dpkit::allreduce(comm, v); // healthy
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200)); // rank 1 is waiting by now
      throw std::runtime_error("cannot open 'missing.jsonl'");
    }
    dpkit::collective_options o;
    o.timeout = std::chrono::seconds(30);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      dpkit::allreduce(comm, v, dpkit::reduce_op::sum, {}, o);
      std::printf("rank 1: the all-reduce returned\n");
    } catch (const dpkit::peer_error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ok = s < 5.0;
      std::printf("rank 1: peer_error after %.3f s: %s\n", s, e.what());
    }
  } catch (const std::runtime_error& e) {
    ok = rank == 0;
    std::printf("rank %d: caught '%s' after the transport was destroyed\n", rank, e.what());
  }
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  std::printf("rank %d: %s\n", rank, all ? "ok" : "FAILED");
  return all ? 0 : 1;
}
