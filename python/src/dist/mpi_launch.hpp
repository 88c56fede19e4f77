// dpkit._dist_ext under an MPI launcher (mpirun): starting and ending MPI
// for the groups, and the helpers dpkit.distributed's init_process_group
// uses before any group exists.
#pragma once

#include "common.hpp"

namespace dpkit_dist {

#if DPKIT_DIST_MPI
/// True when this module called MPI_Init_thread (then finalize() calls
/// MPI_Finalize).
inline bool mpi_started_here = false;

/// MPI_Init_thread(MPI_THREAD_MULTIPLE) unless MPI is already initialized
/// (by mpi4py, say). Returns the thread level provided.
inline int init_mpi() {
  int inited = 0;
  MPI_Initialized(&inited);
  int provided = MPI_THREAD_SINGLE;
  if (!inited) {
    int argc = 0;
    char** argv = nullptr;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw dpkit::error("dpkit backend: MPI_Init_thread failed");
    mpi_started_here = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    throw dpkit::error("dpkit backend: MPI provides thread level " + std::to_string(provided) +
                       "; the backend calls MPI from its worker thread and needs MPI_THREAD_SERIALIZED or more");
  return provided;
}

/// MPI_Abort(MPI_COMM_WORLD, code) if MPI is initialized and not finalized
/// (else nothing): the launcher then ends every rank of the job. Called by
/// dpkit.distributed's sys.excepthook after a rank's unhandled exception, so
/// that its exit does not wait in MPI_Finalize for ranks that wait for it.
inline void abort_mpi(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

/// `s` from world rank `root` to every rank (MPI_Bcast of its length, then
/// its bytes): the rendezvous address of init_process_group.
inline std::string broadcast_string(std::string s, int root) {
  init_mpi();
  unsigned long long n = s.size();
  if (MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD) != MPI_SUCCESS)
    throw dpkit::error("dpkit backend: MPI_Bcast failed");
  s.resize(static_cast<std::size_t>(n));
  if (n > 0 && MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD) != MPI_SUCCESS)
    throw dpkit::error("dpkit backend: MPI_Bcast failed");
  return s;
}
#endif

} // namespace dpkit_dist
