// A caller frees its buffer after a collective timed out, before it destroys
// the transport, and goes on using MPI, while the late peer arrives after the
// deadline: the send the timed-out rank abandoned (MPI cannot cancel a send)
// must never be matched, or MPI's progress would read the freed buffer
// (Open MPI: a segfault in the vader btl's send scheduling; seen before the
// fix in 3 of 3 runs). The late rank must throw peer_error at the start of
// its call, before it posts a receive. Exits 0 when both ranks got their
// errors and finalized; run by meson under mpiexec -n 2 (mpi_free_after_timeout).
#include <dpkit/dpkit.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int ok = 0;
  {
    auto comm = std::make_unique<dpkit::mpi>(MPI_COMM_WORLD);
    const dpkit::allreduce_policy ring{dpkit::algorithm::ring};
    dpkit::collective_options o;
    if (rank == 0) {
      // 64 MiB: above every eager limit, so the sends wait for the receiver
      auto v = std::make_unique<std::vector<float>>(std::size_t{16} << 20, 1.0f);
      o.timeout = std::chrono::milliseconds(300);
      try {
        dpkit::allreduce(*comm, *v, dpkit::reduce_op::sum, ring, o);
      } catch (const dpkit::timeout_error& e) {
        ok = 1;
        std::printf("rank 0: timeout_error as expected\n");
      }
      v.reset(); // the caller frees its buffer first
      comm.reset();
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(1)); // joins after rank 0 gave up
      std::vector<float> v(std::size_t{16} << 20, 1.0f);
      o.timeout = std::chrono::seconds(5);
      try {
        dpkit::allreduce(*comm, v, dpkit::reduce_op::sum, ring, o);
      } catch (const dpkit::peer_error& e) {
        const std::string what = e.what();
        ok = what.find("before this call") != std::string::npos ? 1 : 0;
        std::printf("rank 1: %s\n", what.substr(0, 200).c_str());
      } catch (const std::exception& e) {
        std::printf("rank 1: unexpected %s\n", e.what());
      }
      comm.reset();
    }
  }
  // MPI goes on (its progress would run the abandoned send's schedule)
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  std::printf("rank %d: finalized, %s\n", rank, all ? "ok" : "FAILED");
  return all ? 0 : 1;
}
