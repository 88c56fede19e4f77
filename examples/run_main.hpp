// run_main.hpp: the main() of dpkit's example, tool and benchmark programs,
// and where their default data files are.
//
// An error on one rank of an MPI job must end the whole job with its message,
// never leave it waiting: the other ranks may be blocked in a collective (or a
// plain MPI_Barrier) that the failed rank will never join, and the failed
// rank itself must not unwind through destructors that do collective work
// (a communicator's free, a barrier in a user's destructor: they wait for the
// peers; dpkit::mpi's own destructor never waits and tells its peers).
// So with MPI, run_main does not catch: an exception no handler catches calls
// std::terminate before any destructor runs (the Itanium C++ ABI every Linux
// compiler uses searches for a handler first and unwinds only if it finds
// one), and run_main's terminate handler prints
//   <program>: rank <R>: <what>
// on stderr and calls MPI_Abort(MPI_COMM_WORLD, 1) when MPI is initialized
// and the world has more than one rank (std::_Exit(1) otherwise). Without MPI
// it catches std::exception, prints the same line and returns 1.
//
// Copy this file along with an example: it depends only on dpkit's error
// types and, in an MPI build, on <mpi.h>.
#pragma once

#include <dpkit/core/errors.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#if !defined(DPKIT_NO_MPI) && (defined(DPKIT_WITH_MPI) || __has_include(<mpi.h>))
#include <mpi.h>
#define DPKIT_RUN_MAIN_MPI 1
#endif

namespace dpkit_programs {

namespace detail {

/// The name run_main prints (set by run_main; "program" before).
inline const char*& program_name() noexcept {
  static const char* name = "program";
  return name;
}

/// True while MPI can be called: initialized and not finalized.
inline bool mpi_active() noexcept {
#ifdef DPKIT_RUN_MAIN_MPI
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
#else
  return false;
#endif
}

/// The rank of a launch without mpirun (launch_main.hpp sets it once the
/// launch is resolved); -1 before, or in any other run.
inline int& launched_rank() noexcept {
  static int rank = -1;
  return rank;
}

/// This process's rank in MPI_COMM_WORLD when MPI is active, else the rank of
/// a launch without mpirun (launched_rank), else the launcher's (mpirun, srun
/// and hydra set one of these before MPI_Init), else -1 (a plain run).
inline int current_rank() noexcept {
#ifdef DPKIT_RUN_MAIN_MPI
  if (mpi_active()) {
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
#endif
  if (launched_rank() >= 0) return launched_rank();
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"}) {
    if (const char* v = std::getenv(var); v && *v) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (*end == '\0' && r >= 0) return static_cast<int>(r);
    }
  }
  return -1;
}

/// Prints "<program>: rank R: <what>" (or "<program>: <what>" with no rank)
/// on stderr, after flushing stdout so the error comes after the output.
inline void report(const char* what) noexcept {
  std::fflush(stdout);
  const int rank = current_rank();
  if (rank >= 0) std::fprintf(stderr, "%s: rank %d: %s\n", program_name(), rank, what);
  else std::fprintf(stderr, "%s: %s\n", program_name(), what);
  std::fflush(stderr);
}

/// Ends the process with status 1, and the whole MPI job when this rank has
/// peers (they may be waiting for it in a collective).
[[noreturn]] inline void end_job() noexcept {
  std::fflush(nullptr);
#ifdef DPKIT_RUN_MAIN_MPI
  if (mpi_active()) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  }
#endif
  std::_Exit(1);
}

/// The terminate handler: reports the exception in flight (uncaught, or
/// escaping a thread or a noexcept function) and ends the job.
[[noreturn]] inline void on_terminate() noexcept {
  std::string what = "std::terminate called without an active exception";
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
      what = "an exception that is not a std::exception";
    }
  }
  report(what.c_str());
  end_job();
}

} // namespace detail

/// Runs a program's main body and turns any error into its message and a
/// non-zero exit on every rank, never a hang.
///
/// `body` is called once and its result returned. With MPI compiled in (the
/// build defines DPKIT_WITH_MPI, or <mpi.h> is on the include path, and not
/// DPKIT_NO_MPI) an exception escaping `body` is not caught: it calls
/// std::terminate before any destructor runs (nothing to unwind through that
/// could wait for peers), and the terminate handler installed here prints
/// "<program>: rank R: <what>" on stderr (the rank of MPI_COMM_WORLD, else the
/// launcher's; "<program>: <what>" in a plain run), then calls
/// MPI_Abort(MPI_COMM_WORLD, 1) if MPI is initialized, not finalized, and the
/// world has more than one rank, else std::_Exit(1) (stdio flushed). The same
/// handler reports exceptions escaping other threads and noexcept functions.
/// Without MPI, a std::exception is caught (destructors run), printed the same
/// way, and 1 is returned.
///
/// Preconditions: called once, from main; `program` outlives the process
/// (a string literal). Handlers the body installs for its own exceptions
/// (e.g. a usage error every rank throws alike) still work: only exceptions
/// nothing catches end the job.
/// @param program the program's name, the first word of every message.
/// @param body    the program: `int()`, returning main's exit status.
/// @returns what `body` returns; 1 after an exception in a build without MPI.
template <class F>
int run_main(const char* program, F&& body) {
  detail::program_name() = program;
  std::set_terminate(&detail::on_terminate);
#ifdef DPKIT_RUN_MAIN_MPI
  return std::forward<F>(body)(); // not caught: see above
#else
  try {
    return std::forward<F>(body)();
  } catch (const std::exception& e) {
    detail::report(e.what());
    return 1;
  }
#endif
}

/// The directory of the running executable (from /proc/self/exe); empty if
/// it cannot be read.
inline std::filesystem::path executable_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

/// Where to look for a file the build puts in its build directory (e.g.
/// "data/debian-descriptions.jsonl", decompressed there by the build), in
/// order: next to this program's build directory (<executable dir>/../<rel>:
/// programs live in <build>/examples, <build>/benchmarks, <build>/tools),
/// the build directory baked in at build time (DPKIT_PROGRAM_BUILD_ROOT, if
/// defined), then build/<rel> under the working directory.
inline std::vector<std::filesystem::path> build_file_candidates(const std::filesystem::path& rel) {
  std::vector<std::filesystem::path> c;
  if (const auto dir = executable_dir(); !dir.empty()) c.push_back((dir.parent_path() / rel).lexically_normal());
#ifdef DPKIT_PROGRAM_BUILD_ROOT
  c.push_back((std::filesystem::path(DPKIT_PROGRAM_BUILD_ROOT) / rel).lexically_normal());
#endif
  c.push_back(std::filesystem::path("build") / rel);
  return c;
}

/// Where to look for a file of the source tree (e.g.
/// "data/debian-bpe-8k.model"), in order: the source directory baked in at
/// build time (DPKIT_PROGRAM_SOURCE_ROOT, if defined), above this program's
/// build directory (<executable dir>/../../<rel>: a build directory inside the
/// repository), then <rel> under the working directory.
inline std::vector<std::filesystem::path> source_file_candidates(const std::filesystem::path& rel) {
  std::vector<std::filesystem::path> c;
#ifdef DPKIT_PROGRAM_SOURCE_ROOT
  c.push_back((std::filesystem::path(DPKIT_PROGRAM_SOURCE_ROOT) / rel).lexically_normal());
#endif
  if (const auto dir = executable_dir(); !dir.empty()) c.push_back((dir.parent_path().parent_path() / rel).lexically_normal());
  c.push_back(rel);
  return c;
}

/// The first of `candidates` that is a regular file (symbolic links
/// followed), for a default a program uses when its option is not given.
/// @param what       what the file is, for the message (e.g. "corpus").
/// @param option     the option that names it instead (e.g. "--corpus").
/// @param candidates the places to look, in order (build_file_candidates,
///                   source_file_candidates).
/// @throws dpkit::invalid_argument naming every place it looked:
///         "no corpus found (looked for 'a', 'b', 'c'); give --corpus PATH".
inline std::filesystem::path find_default_file(std::string_view what, std::string_view option,
                                               const std::vector<std::filesystem::path>& candidates) {
  std::string looked;
  std::vector<std::filesystem::path> seen;
  for (const auto& p : candidates) {
    bool dup = false;
    for (const auto& s : seen) dup = dup || s == p;
    if (dup) continue;
    seen.push_back(p);
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p;
    looked += (looked.empty() ? "'" : ", '") + p.string() + "'";
  }
  throw dpkit::invalid_argument("no " + std::string(what) + " found (looked for " + looked + "); give " +
                                std::string(option) + " PATH");
}

} // namespace dpkit_programs
