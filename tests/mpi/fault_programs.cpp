// The MPI fault programs, one subcommand each, in one translation unit
// (five programs of one small all-reduce each compiled the same dpkit
// instantiations five times: 90 s of CI's release build, as much again
// under ASan). Run by meson under mpiexec as
//   mpi_fault_programs <program> [args...]
// where <program> is after_finalize, mismatch_exit, unwind_notice,
// free_after_timeout or free_after_stall; each section says what it checks
// and how it exits.

#include <dpkit/dpkit.hpp>
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

// MPI_Init_thread (MPI_THREAD_MULTIPLE, as dpkit::mpi wants); returns this
// process's rank in MPI_COMM_WORLD.
int init_mpi(int& argc, char**& argv) {
  int provided = 0, rank = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Every rank's verdict (`ok`: 1 or 0) combined with MPI_MIN, then
// MPI_Finalize. With `progress_first`, MPI runs on for 200 ms and a barrier
// before finalizing: its progress would touch whatever an abandoned transfer
// still held. Returns the exit code: 0 when every rank was ok.
int agree_and_finalize(int ok, int rank, bool progress_first) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (progress_first) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
  std::printf("rank %d: finalized, %s\n", rank, all ? "ok" : "FAILED");
  return all ? 0 : 1;
}

} // namespace

// ---- after_finalize --------------------------------------------------------
// A collective on a transport that outlived its process's MPI_Finalize must
// throw communicator_error, not crash (before the fix: a segfault in the
// shared-memory all-reduce, its segment unmapped by MPI_Finalize). Run by
// meson under mpiexec -n 2 (mpi_after_finalize); exits 0 when every rank threw.
namespace after_finalize {

int run(int argc, char** argv) {
  init_mpi(argc, argv);
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

} // namespace after_finalize

// ---- mismatch_exit ---------------------------------------------------------
// A program whose ranks disagree (rank 1 takes the max, the others sum) and
// that does not catch the error: the job must end non-zero with the
// mismatch_error's message, never return as if nothing happened. Run by meson
// under mpiexec as a test that must fail (should_fail).
namespace mismatch_exit {

int run(int argc, char** argv) {
  init_mpi(argc, argv);
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    std::vector<float> v(1000, 1.0f);
    dpkit::allreduce(comm, v, comm.rank() == 1 ? dpkit::reduce_op::max : dpkit::reduce_op::sum);
    std::printf("rank %d: returned without an error\n", comm.rank());
  }
  MPI_Finalize();
  return 0;
}

} // namespace mismatch_exit

// ---- unwind_notice ---------------------------------------------------------
// Rank 0 leaves its transport by an exception that is not dpkit's (a file it
// cannot open, say) and catches it in main, while rank 1 waits in an
// all-reduce with a 30 s deadline. ~mpi, running during the unwinding, tells
// rank 1 (a fault notice), which must throw peer_error within seconds, not
// at its deadline (before: rank 0 waited in MPI_Win_free for rank 1, which
// waited out its 30 s). Both ranks then finalize. Run by meson under
// mpiexec -n 2 (mpi_unwind_notice); exits 0 on success.
namespace unwind_notice {

int run(int argc, char** argv) {
  const int rank = init_mpi(argc, argv);
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
  return agree_and_finalize(ok, rank, false);
}

} // namespace unwind_notice

// ---- free_after_timeout ----------------------------------------------------
// A caller frees its buffer after a collective timed out, before it destroys
// the transport, and goes on using MPI, while the late peer arrives after the
// deadline: the send the timed-out rank abandoned (MPI cannot cancel a send)
// must never be matched, or MPI's progress would read the freed buffer
// (Open MPI: a segfault in the vader btl's send scheduling; seen before the
// fix in 3 of 3 runs). The late rank must throw peer_error at the start of
// its call, before it posts a receive. Exits 0 when both ranks got their
// errors and finalized; run by meson under mpiexec -n 2 (mpi_free_after_timeout).
namespace free_after_timeout {

int run(int argc, char** argv) {
  const int rank = init_mpi(argc, argv);
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
  return agree_and_finalize(ok, rank, true);
}

} // namespace free_after_timeout

// ---- free_after_stall ------------------------------------------------------
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
namespace free_after_stall {

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

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: free_after_stall ring|tree|native [MIB]\n");
    return 64;
  }
  const dpkit::algorithm algo = dpkit::parse_algorithm(argv[1]);
  const std::size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64;
  const int rank = init_mpi(argc, argv);
  int size = 0;
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
  return agree_and_finalize(ok, rank, true);
}

} // namespace free_after_stall

int main(int argc, char** argv) {
  struct program {
    const char* name;
    int (*run)(int, char**);
  };
  const program programs[] = {{"after_finalize", after_finalize::run},
                              {"mismatch_exit", mismatch_exit::run},
                              {"unwind_notice", unwind_notice::run},
                              {"free_after_timeout", free_after_timeout::run},
                              {"free_after_stall", free_after_stall::run}};
  if (argc >= 2)
    for (const auto& p : programs)
      if (std::string_view(argv[1]) == p.name) {
        argv[1] = argv[0]; // the program sees its own arguments only
        return p.run(argc - 1, argv + 1);
      }
  std::fprintf(stderr, "usage: %s after_finalize|mismatch_exit|unwind_notice|free_after_timeout|free_after_stall [args]\n",
               argv[0]);
  return 2;
}
