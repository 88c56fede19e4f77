// A collective fails on one rank while its live peer is inside the same
// collective but stalled (SIGSTOP for 400 ms, as a descheduled or swapping
// process): the failed rank's caller then frees its buffer (a mapping of its
// own, unmapped at once), destroys the transport and finalizes, while the
// peer, resumed, still matches the sends the failed rank abandoned before it
// learns of the failure. Before the fix: with a native all-reduce MPI's
// abandoned non-blocking collective went on reading and writing the freed
// buffer; with ring and tree the peer's receive read the unmapped memory
// (CMA), Open MPI fell back to sending it from the failed rank's own
// progress, and rank 0 segfaulted in mca_pml_ob1_send_request_schedule_once.
// Now the native path runs on the transport's staging area, and a failed
// collective settles (mpi::settle) before its exception reaches the caller.
//
//   free_after_stall ALGO [MIB]     (ALGO: ring | tree | native; 2 ranks)
//
// Exits 0 when rank 0 got an error, rank 1 an error or the right sum (a
// tree root may have sent it everything before it gave up), and both
// finalized; run by meson under
// mpiexec -n 2 (mpi_free_after_stall_*).
#include <dpkit/dpkit.hpp>

#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

namespace {
// `n` floats of 1.0 in a mapping of their own (unmapped on release)
struct mapped_floats {
  explicit mapped_floats(std::size_t n) : n(n), bytes(n * sizeof(float)) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    data = static_cast<float*>(p);
    for (std::size_t i = 0; i < n; ++i) data[i] = 1.0f;
  }
  ~mapped_floats() { munmap(data, bytes); }
  mapped_floats(const mapped_floats&) = delete;
  mapped_floats& operator=(const mapped_floats&) = delete;
  std::size_t n, bytes;
  float* data = nullptr;
};
} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: free_after_stall ring|tree|native [MIB]\n");
    return 64;
  }
  const dpkit::algorithm algo = dpkit::parse_algorithm(argv[1]);
  const std::size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    std::fprintf(stderr, "free_after_stall: needs 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 64);
  }
  int pids[2] = {};
  const int me = static_cast<int>(getpid());
  MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  int ok = 0;
  {
    auto buffer = std::make_unique<mapped_floats>(mib << 18);
    auto comm = std::make_unique<dpkit::mpi>(MPI_COMM_WORLD);
    const dpkit::allreduce_policy policy{algo};
    const std::span<float> v(buffer->data, buffer->n);
    dpkit::allreduce(*comm, v, dpkit::reduce_op::sum, policy); // connections, first steps
    MPI_Barrier(MPI_COMM_WORLD);
    dpkit::collective_options o;
    o.timeout = std::chrono::milliseconds(300);
    std::thread stall;
    if (rank == 0) // rank 1 stops inside the collective, for longer than its deadline
      stall = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        kill(pids[1], SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        kill(pids[1], SIGCONT);
      });
    std::string what;
    try {
      dpkit::allreduce(*comm, v, dpkit::reduce_op::sum, policy, o);
      // rank 1 may finish: everything it needed had been sent before rank 0
      // gave up (a tree root's last sends); then its sum must be right
      bool right = true;
      for (float x : v) right = right && x == 4.0f;
      what = right ? "no error, the sum is right" : "no error, but a WRONG sum";
      ok = rank == 1 && right ? 1 : 0;
    } catch (const dpkit::error& e) {
      what = e.what();
      ok = 1;
    }
    buffer.reset(); // the caller frees its buffer first (unmapped)
    comm.reset();
    if (stall.joinable()) stall.join();
    std::printf("rank %d (%s): %s\n", rank, argv[1], what.substr(0, 200).c_str());
    std::fflush(stdout);
  }
  // MPI goes on: its progress would run whatever still held the buffer
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  std::printf("rank %d: finalized, %s\n", rank, all ? "ok" : "FAILED");
  return all ? 0 : 1;
}
