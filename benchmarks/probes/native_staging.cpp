// native_staging: what dpkit's default native all-reduce pays for running
// MPI's collective on the transport's staging area (a copy in, a copy out)
// instead of the caller's buffers, side by side in one run. Per size,
// out of place and in place, rounds alternate three modes of
// dpkit::allreduce(..., algorithm::native):
//   blocking  MPI_Allreduce on the caller's buffers (native_deadline = false:
//             the baseline, how allreduce_perf times MPI; zero-copy)
//   staged    MPI_Iallreduce on the staging area, waited against the deadline,
//             without the default level's check (check = 0): the staging
//   default   the same with the check (check = 1, dpkit's default): at most
//             32 B of payload ride in the check's own 64-byte all-reduce,
//             larger calls run one 64-byte all-reduce before MPI's
//   nb-user   MPI_Iallreduce straight on the caller's buffers, waited with
//             MPI_Test (no dpkit): what the deadline costs without staging,
//             i.e. Open MPI's non-blocking algorithms (libnbc) against its
//             blocking ones
// Times are the slowest rank's mean per call, median over the rounds.
//
//   mpirun -np 2 build/benchmarks/probes/native_staging [-b 8] [-e 256M] [--rounds 5] [--batch-ms 40]
//
// (benchmarks/results/2026-12-02-native-staging.md)
#include <dpkit/dpkit.hpp>

#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;

std::size_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  double v = std::stod(s, &pos);
  const char u = pos < s.size() ? s[pos] : '\0';
  if (u == 'K' || u == 'k') v *= 1024;
  else if (u == 'M' || u == 'm') v *= 1024 * 1024;
  else if (u == 'G' || u == 'g') v *= 1024.0 * 1024 * 1024;
  return static_cast<std::size_t>(v);
}

struct mode {
  const char* name;
  bool deadline;
  int check;
  bool raw_nonblocking = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
} // namespace

int main(int argc, char** argv) {
  CLI::App app{"native all-reduce: blocking on the caller's buffers vs staged with the deadline"};
  std::string b = "8", e = "256M";
  int rounds = 5;
  double batch_ms = 40;
  app.add_option("-b", b, "smallest size in bytes (K/M/G), default 8");
  app.add_option("-e", e, "largest size in bytes (K/M/G), default 256M");
  app.add_option("--rounds", rounds, "rounds per size (median), default 5");
  app.add_option("--batch-ms", batch_ms, "milliseconds per batch of one mode, default 40");
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    const int rc = app.exit(err);
    MPI_Finalize();
    return rc;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::size_t lo = std::max<std::size_t>(parse_bytes(b), 4), hi = parse_bytes(e);
  constexpr int nmodes = 4;
  const mode modes[nmodes] = {{"blocking", false, 0}, {"staged", true, 0}, {"default", true, 1}, {"nb-user", false, 0, true}};
  {
    dpkit::mpi comm(MPI_COMM_WORLD);
    const dpkit::allreduce_policy native{dpkit::algorithm::native};
    std::vector<float> in(hi / 4, 1.0f), out(hi / 4, 0.0f);
    if (rank == 0) {
      std::printf("# native all-reduce, %d ranks, float sum; us per call (slowest rank), median of %d rounds\n", size,
                  rounds);
      std::printf("# staged = MPI_Iallreduce on the staging area waited against the deadline, no check; default = "
                  "staged + the default check\n");
      std::printf("%12s %6s %12s %12s %12s %12s %9s %9s %9s %9s\n", "bytes", "place", "blocking", "nb-user", "staged",
                  "default", "nb-user/b", "staged/b", "default/b", "staged/nb");
    }
    for (std::size_t bytes = lo; bytes <= hi; bytes *= 2) {
      const std::size_t n = bytes / 4;
      for (int inplace = 0; inplace < 2; ++inplace) {
        std::span<const float> src(in.data(), n);
        std::span<float> dst(inplace ? in.data() : out.data(), n);
        auto call = [&](const mode& m) {
          if (m.raw_nonblocking) {
            MPI_Request r = MPI_REQUEST_NULL;
            MPI_Iallreduce(inplace ? MPI_IN_PLACE : static_cast<const void*>(src.data()), dst.data(),
                           static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm.native_handle(), &r);
            for (int done = 0; !done;) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
            return;
          }
          dpkit::collective_options o;
          o.native_deadline = m.deadline;
          o.check = m.check;
          if (inplace) dpkit::allreduce(comm, dst, dpkit::reduce_op::sum, native, o);
          else dpkit::allreduce(comm, src, dst, dpkit::reduce_op::sum, native, o);
        };
        // calls per batch: from a timed doubling loop (slowest rank), same on every rank
        long iters = 1;
        for (;;) {
          MPI_Barrier(MPI_COMM_WORLD);
          const auto t0 = clock_type::now();
          for (long i = 0; i < iters; ++i) call(modes[0]);
          double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
          MPI_Allreduce(MPI_IN_PLACE, &ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          if (ms >= batch_ms / 4 || iters >= (1L << 22)) {
            iters = std::max<long>(1, static_cast<long>(iters * batch_ms / std::max(ms, 1e-3)));
            break;
          }
          iters *= 2;
        }
        std::vector<double> us[nmodes];
        for (int r = 0; r < rounds; ++r)
          for (int k = 0; k < nmodes; ++k) {
            const mode& m = modes[(k + r) % nmodes]; // rotate the order between rounds
            call(m);                            // warm (the staging area grows once)
            MPI_Barrier(MPI_COMM_WORLD);
            const auto t0 = clock_type::now();
            for (long i = 0; i < iters; ++i) call(m);
            double t = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / iters;
            MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            us[(k + r) % nmodes].push_back(t);
          }
        if (rank == 0) {
          const double bl = median(us[0]), st = median(us[1]), df = median(us[2]), nb = median(us[3]);
          std::printf("%12zu %6s %12.2f %12.2f %12.2f %12.2f %9.2f %9.2f %9.2f %9.2f\n", bytes, inplace ? "in" : "out",
                      bl, nb, st, df, nb / bl, st / bl, df / bl, st / nb);
          std::fflush(stdout);
        }
      }
    }
  }
  MPI_Finalize();
  return 0;
}
