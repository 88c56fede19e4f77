// launch_main.hpp: how an example program joins its job. Under an MPI
// launcher (mpirun, mpiexec, srun with PMI) it runs over dpkit::mpi, as it
// always has; started without one, with --rendezvous URL --rank R
// --world-size W or the environment torchrun sets for torch.distributed's
// env:// init method (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; or
// DPKIT_RENDEZVOUS, DPKIT_RANK, DPKIT_WORLD_SIZE), it runs over a
// dpkit::gloo_transport built by dpkit/transport/launch.hpp:
//
//   mpirun -np 2 build/examples/ddp_step data/models/gpt2-124m.tsv
//   build/examples/ddp_step data/models/gpt2-124m.tsv --rendezvous tcp://127.0.0.1:29500 --rank 0 --world-size 2 &
//   build/examples/ddp_step data/models/gpt2-124m.tsv --rendezvous tcp://127.0.0.1:29500 --rank 1 --world-size 2
//
// The program's body is one generic lambda, `[&](auto& comm) -> int`, called
// with a `dpkit::mpi&` or a `dpkit::gloo_transport&`.
//
// Errors: a bad launch value (a rank outside the world, a malformed URL, a
// missing MASTER_PORT) is a dpkit::invalid_argument naming the flag or
// variable and its value (resolve_launch); the flags under mpirun, or in a
// build without the Gloo transport, are refused the same way. They and
// every other error reach run_main (run_main.hpp), which prints
// "<program>: rank R: <what>" (the launched rank, once known) and exits 1;
// a launched rank that exits closes its connections, so its peers' waits
// fail at once (peer_error) instead of at their deadline. The rendezvous
// itself waits at most DPKIT_TIMEOUT seconds (default 30 minutes) for the
// other ranks.
//
// The build defines DPKIT_WITH_GLOO (Meson feature gloo) and DPKIT_WITH_MPI
// when it has them; copy this file with run_main.hpp.
#pragma once

#include "run_main.hpp"

#include <dpkit/core/errors.hpp>
#if defined(DPKIT_WITH_GLOO)
#include <dpkit/transport/launch.hpp>
#endif
#if defined(DPKIT_WITH_MPI)
#include <dpkit/transport/mpi.hpp>
#include <mpi.h>
#endif

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace dpkit_programs {

/// The launch flags as typed (nullopt: not given): --rendezvous URL, --rank R,
/// --world-size W (also --flag=value).
struct launch_args {
  std::optional<std::string> rendezvous; ///< --rendezvous URL
  std::optional<std::string> rank;       ///< --rank R
  std::optional<std::string> world_size; ///< --world-size W
  /// Whether any of the three was given.
  bool any() const noexcept { return rendezvous || rank || world_size; }
};

/// The environment variable by which an MPI launcher (mpirun, mpiexec, srun
/// with PMI) marks the processes it started (OMPI_COMM_WORLD_SIZE,
/// PMI_SIZE, PMIX_RANK, MV2_COMM_WORLD_SIZE), or nullptr when none is set.
inline const char* mpi_launcher_variable() noexcept {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(var)) return var;
  return nullptr;
}

/// True when an MPI launcher started this process (mpi_launcher_variable).
inline bool started_by_mpi_launcher() noexcept { return mpi_launcher_variable() != nullptr; }

/// Takes the launch flags out of argv (argc and argv are shortened; the
/// other arguments keep their order), so a program's own parsing never sees
/// them. Accepts "--rendezvous URL" and "--rendezvous=URL", likewise --rank
/// and --world-size; a flag given twice keeps its last value.
/// @throws dpkit::invalid_argument naming the flag when its value is missing
///         (the flag is the last argument, or its value is empty).
inline launch_args take_launch_flags(int& argc, char** argv) {
  launch_args l;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view s = argv[i];
    std::optional<std::string>* slot = nullptr;
    std::string_view name;
    for (auto [n, p] : {std::pair{std::string_view("--rendezvous"), &l.rendezvous},
                        std::pair{std::string_view("--rank"), &l.rank},
                        std::pair{std::string_view("--world-size"), &l.world_size}}) {
      if (s == n || (s.size() > n.size() && s.starts_with(n) && s[n.size()] == '=')) {
        slot = p;
        name = n;
      }
    }
    if (!slot) {
      argv[out++] = argv[i];
      continue;
    }
    std::string value;
    if (s.size() > name.size()) value = std::string(s.substr(name.size() + 1));
    else if (i + 1 < argc) value = argv[++i];
    else throw dpkit::invalid_argument(std::string(name) + " needs a value (" + std::string(name) + " VALUE)");
    if (value.empty()) throw dpkit::invalid_argument(std::string(name) + " needs a value, got ''");
    *slot = std::move(value);
  }
  argc = out;
  argv[out] = nullptr;
  return l;
}

/// Runs `body` over a dpkit::gloo_transport when this process was launched
/// without mpirun: no MPI launcher started it, and the flags or the
/// environment describe a launch (dpkit::resolve_launch: --rendezvous /
/// DPKIT_RENDEZVOUS / MASTER_ADDR+MASTER_PORT, --rank / DPKIT_RANK / RANK,
/// --world-size / DPKIT_WORLD_SIZE / WORLD_SIZE). The transport is connected
/// (dpkit::connect_launch; a collective call of every rank, bounded by
/// DPKIT_TIMEOUT) before `body` runs, and run_main names the launched rank
/// in its error messages from then on.
/// @param flags the launch flags (take_launch_flags).
/// @param body  `int(dpkit::gloo_transport&)` (a generic lambda).
/// @returns what `body` returns, or nullopt when this is no such launch
///          (under an MPI launcher, or neither flags nor variables): the
///          program runs as it did before.
/// @throws dpkit::invalid_argument when flags are given under an MPI
///         launcher or in a build without the Gloo transport, or a launch
///         value is bad (naming the flag or variable and its value); what
///         connect_launch and `body` throw.
template <class Body>
std::optional<int> run_if_launched(const launch_args& flags, Body&& body) {
  if (const char* var = mpi_launcher_variable()) {
    if (flags.any())
      throw dpkit::invalid_argument(std::string("--rendezvous/--rank/--world-size launch a program without mpirun, "
                                                "and an MPI launcher started this one (") +
                                    var + "=" + std::getenv(var) +
                                    "): drop the flags under mpirun, or start each rank without it");
    return std::nullopt;
  }
#if defined(DPKIT_WITH_GLOO)
  const std::optional<dpkit::launch_info> job = dpkit::resolve_launch({flags.rendezvous, flags.rank, flags.world_size});
  if (!job) return std::nullopt;
  detail::launched_rank() = job->rank;
  dpkit::gloo_transport comm = dpkit::connect_launch(*job);
  return std::forward<Body>(body)(comm);
#else
  (void)body;
  if (flags.any() || std::getenv("DPKIT_RENDEZVOUS"))
    throw dpkit::invalid_argument(
        std::string(flags.rendezvous ? "--rendezvous='" + *flags.rendezvous + "'"
                    : flags.rank     ? "--rank='" + *flags.rank + "'"
                    : flags.world_size ? "--world-size='" + *flags.world_size + "'"
                                       : "DPKIT_RENDEZVOUS='" + std::string(std::getenv("DPKIT_RENDEZVOUS")) + "'") +
        ": a launch without mpirun runs over the Gloo transport, and this build has none (Meson feature gloo, "
        "Debian libgloo-dev): run under mpirun");
  return std::nullopt;
#endif
}

/// The thread support a program asks MPI_Init_thread for.
enum class mpi_threads {
  serialized, ///< MPI_THREAD_SERIALIZED
  multiple,   ///< MPI_THREAD_MULTIPLE
};

/// The whole transport choice of a program: run_if_launched, else (an MPI
/// build) MPI_Init_thread at `threads`, `body` over a dpkit::mpi of
/// MPI_COMM_WORLD, MPI_Finalize, exactly as under mpirun before (a plain
/// run without flags or variables is a one-rank MPI job).
/// @param argc, argv     main's, for MPI_Init_thread (launch flags taken out).
/// @param flags          the launch flags (take_launch_flags).
/// @param threads        the thread level MPI is initialized with (ignored
///                       without MPI; the dpkit::mpi transport's
///                       communication thread needs multiple, unless only
///                       one thread calls MPI at a time).
/// @param body           `int(auto& comm)`: a generic lambda taking
///                       dpkit::mpi& or dpkit::gloo_transport&.
/// @returns what `body` returns.
/// @throws as run_if_launched; dpkit::error in a build with neither MPI nor a
///         launch; what `body` throws (under MPI it is not caught: run_main
///         ends the job).
template <class Body>
int run_on_transport(int& argc, char**& argv, const launch_args& flags, mpi_threads threads, Body&& body) {
  if (auto rc = run_if_launched(flags, body)) return *rc;
#if defined(DPKIT_WITH_MPI)
  int provided = 0;
  MPI_Init_thread(&argc, &argv, threads == mpi_threads::multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED,
                  &provided);
  int rc = 1;
  {
    // Errors are not caught: run_main ends the whole job with the message,
    // without unwinding through comm while other ranks wait in a collective.
    dpkit::mpi comm(MPI_COMM_WORLD);
    rc = body(comm);
  }
  MPI_Finalize();
  return rc;
#else
  (void)argc;
  (void)argv;
  (void)threads;
  throw dpkit::error("built without MPI: launch each rank with --rendezvous URL --rank R --world-size W (or "
                     "MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)");
#endif
}

} // namespace dpkit_programs
