// A rank dies in the middle of a 64 MiB all-reduce; the survivors must throw
// within the deadline and then leave: destroy the transport, MPI_Finalize and
// exit, each in bounded time. Run under mpirun with
// `--mca orte_abort_on_non_zero_status 0` (a job that handles its own errors)
// by scripts/rank_death_matrix.sh, which makes the table of
// docs/reliability.md, and by the meson tests mpi_rank_death_* (timeout).
//
//   rank_death ALGO HOW [VICTIM] [MIB] [ORDER]
//     ALGO   ring | tree | native | shm | auto
//     HOW    exit (the victim calls _exit(3)) | kill (SIGKILL to itself) |
//            finalize (the victim calls MPI_Finalize without destroying its
//            transport, then exits 0)
//     VICTIM the rank that dies (default: the last)
//     MIB    message size in MiB (default 64)
//     ORDER  transport-first (default: the buffer outlives the transport) |
//            buffer-first (a survivor frees its buffer before it destroys
//            the transport, as a program that declares the transport first
//            and the buffer after it does, and as a Python user whose
//            tensor goes out of scope does). The buffer is then its own
//            mapping, unmapped at once: any later access by MPI to the
//            caller's memory is a segfault, not a silent write into memory
//            malloc gave to someone else.
//
// Every rank agrees on the moment of death (t0, 300 ms after a barrier,
// CLOCK_MONOTONIC is one clock for every process of a host) and prints
// "rank R pid P t0 NS" first. Each survivor then prints one line:
//   survivor R: error +E s (<type>: <message>); transport destroyed +D s; MPI_Finalize +F s
// with times after t0, and exits 0; a survivor whose collective returned
// normally after t0 prints "survivor R: no error" and exits 2.
//
// With RANK_DEATH_DIR set (scripts/rank_death_matrix.py sets it), each rank
// also writes its pid line to DIR/rank.R and a survivor its last line to
// DIR/survivor.R (each written whole under another name, then renamed): in
// CI, Open MPI 4.1's mpirun twice forwarded no pid line of rank 0 although
// the rank printed it and its later lines arrived, and the case failed.
#include <dpkit/dpkit.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <typeinfo>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

namespace {
using steady = std::chrono::steady_clock;
double since(steady::time_point t0) { return std::chrono::duration<double>(steady::now() - t0).count(); }

const char* type_name(const std::exception& e) {
  if (dynamic_cast<const dpkit::timeout_error*>(&e)) return "timeout_error";
  if (dynamic_cast<const dpkit::mismatch_error*>(&e)) return "mismatch_error";
  if (dynamic_cast<const dpkit::peer_error*>(&e)) return "peer_error";
  if (dynamic_cast<const dpkit::communicator_error*>(&e)) return "communicator_error";
  if (dynamic_cast<const dpkit::error*>(&e)) return "error";
  return "std::exception";
}

// Writes `line` and a newline to $RANK_DEATH_DIR/NAME whole (a temporary
// name, then rename); nothing when the variable is unset. Exits 70 when the
// file cannot be written, so that the script does not wait for it.
void report(const char* name, const std::string& line) {
  const char* dir = std::getenv("RANK_DEATH_DIR");
  if (dir == nullptr || *dir == '\0') return;
  const std::string path = std::string(dir) + "/" + name, tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr && std::fprintf(f, "%s\n", line.c_str()) >= 0;
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::perror(("rank_death: " + path).c_str());
    std::_Exit(70);
  }
}

// The collective's buffer: `n` floats of 1.0 in a mapping of their own
// (munmap on release, whatever malloc's thresholds are).
class mapped_floats {
public:
  explicit mapped_floats(std::size_t n) : bytes_(std::max<std::size_t>(n * sizeof(float), 1)) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("rank_death: mmap");
      std::exit(70);
    }
    data_ = static_cast<float*>(p);
    n_ = n;
    for (std::size_t i = 0; i < n; ++i) data_[i] = 1.0f;
  }
  mapped_floats(const mapped_floats&) = delete;
  mapped_floats& operator=(const mapped_floats&) = delete;
  ~mapped_floats() { munmap(data_, bytes_); }
  std::span<float> span() const { return {data_, n_}; }

private:
  std::size_t bytes_;
  float* data_ = nullptr;
  std::size_t n_ = 0;
};
} // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: rank_death ring|tree|native|shm|auto exit|kill|finalize [VICTIM] [MIB] "
                         "[transport-first|buffer-first]\n");
    return 64;
  }
  const dpkit::algorithm algo = dpkit::parse_algorithm(argv[1]);
  const std::string how = argv[2];
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int victim = argc > 3 ? std::atoi(argv[3]) : size - 1;
  const std::size_t mib = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 64;
  const std::string order = argc > 5 ? argv[5] : "transport-first";
  if (order != "transport-first" && order != "buffer-first") {
    std::fprintf(stderr, "rank_death: ORDER must be transport-first or buffer-first, got '%s'\n", order.c_str());
    return 64;
  }
  auto buffer = std::make_unique<mapped_floats>(mib << 18);
  const std::span<float> v = buffer->span();
  std::optional<dpkit::mpi> comm;
  comm.emplace(MPI_COMM_WORLD);
  dpkit::allreduce_policy policy{algo};
  // one healthy call first (connections, the segment's first steps)
  dpkit::allreduce(*comm, v, dpkit::reduce_op::sum, policy);
  MPI_Barrier(MPI_COMM_WORLD);
  long long t0_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        (steady::now() + std::chrono::milliseconds(300)).time_since_epoch()).count();
  MPI_Bcast(&t0_ns, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const steady::time_point t0{std::chrono::nanoseconds(t0_ns)};
  std::printf("rank %d pid %d t0 %lld\n", rank, static_cast<int>(getpid()), t0_ns);
  std::fflush(stdout);
  report(("rank." + std::to_string(rank)).c_str(),
         "rank " + std::to_string(rank) + " pid " + std::to_string(getpid()) + " t0 " + std::to_string(t0_ns));
  if (rank == victim) {
    std::thread([&] {
      std::this_thread::sleep_until(t0);
      if (how == "kill") raise(SIGKILL);
      if (how == "exit") _exit(3);
    }).detach();
    if (how == "finalize") {
      std::this_thread::sleep_until(t0);
      MPI_Finalize(); // the transport is never destroyed
      std::_Exit(0);
    }
    for (;;) dpkit::allreduce(*comm, v, dpkit::reduce_op::sum, policy);
  }
  std::string line;
  for (;;) {
    try {
      dpkit::allreduce(*comm, v, dpkit::reduce_op::sum, policy);
      if (since(t0) > 120) { // the deadline should have ended this long ago
        std::printf("survivor %d: no error\n", rank);
        std::fflush(stdout);
        report(("survivor." + std::to_string(rank)).c_str(), "survivor " + std::to_string(rank) + ": no error");
        return 2;
      }
    } catch (const std::exception& e) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "survivor %d: error %+.3f s (%s: ", rank, since(t0), type_name(e));
      line = buf + std::string(e.what()).substr(0, 160) + ")";
      std::fprintf(stderr, "%s\n", line.c_str()); // progress, in case a later step hangs
      break;
    }
  }
  if (order == "buffer-first") buffer.reset(); // unmapped: MPI must not hold it any more
  comm.reset();
  char buf[96];
  std::snprintf(buf, sizeof buf, "; transport destroyed %+.3f s", since(t0));
  line += buf;
  std::fprintf(stderr, "survivor %d%s\n", rank, buf);
  MPI_Finalize();
  std::snprintf(buf, sizeof buf, "; MPI_Finalize %+.3f s", since(t0));
  line += buf;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  report(("survivor." + std::to_string(rank)).c_str(), line);
  return 0;
}
