/// @file nccl_mpi.hpp
/// @brief Creating a dpkit::nccl transport under MPI: rank 0's ncclUniqueId is
/// broadcast with MPI_Bcast, each rank takes the GPU of its node-local rank,
/// and ncclCommInitRank builds the communicator (the nccl-tests recipe).
///
/// Needs mpi.h, cuda_runtime_api.h and nccl.h. MPI must be initialized by the
/// caller (dpkit never calls MPI_Init).
#pragma once

#include "nccl.hpp"

#include <mpi.h>

#include <string>

namespace dpkit {

namespace detail {
inline void nccl_mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw error(std::string("nccl_from_mpi: ") + what + ": " + std::string(msg, static_cast<std::size_t>(len)));
}
} // namespace detail

/// This process's rank among the ranks of `comm` on the same node
/// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED), used to pick its GPU.
/// Collective over comm.
/// @throws dpkit::error on an MPI failure.
inline int mpi_local_rank(MPI_Comm comm) {
  int rank = 0, local = 0;
  detail::nccl_mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  MPI_Comm node = MPI_COMM_NULL;
  detail::nccl_mpi_check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
                         "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  detail::nccl_mpi_check(MPI_Comm_rank(node, &local), "MPI_Comm_rank(node communicator)");
  MPI_Comm_free(&node);
  return local;
}

/// Creates an NCCL transport over the ranks of MPI communicator `comm` (same
/// ranks and size). Rank 0 calls ncclGetUniqueId and MPI_Bcasts it; every
/// rank selects CUDA device `device` (default -1: node-local rank modulo the
/// number of visible devices, i.e. one rank per GPU), makes it current and
/// calls ncclCommInitRank. Collective over comm; the transport owns the NCCL
/// communicator. Options as dpkit::nccl (o.kernels enables ring/tree).
/// @throws dpkit::invalid_argument if no CUDA device is visible;
///         dpkit::error on an MPI, CUDA or NCCL failure.
inline nccl nccl_from_mpi(MPI_Comm comm, int device = -1, const nccl_options& o = {}) {
  int rank = 0, size = 0;
  detail::nccl_mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  detail::nccl_mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  const int ndev = cuda_device_count();
  if (ndev == 0)
    throw invalid_argument("nccl_from_mpi: rank " + std::to_string(rank) + ": no CUDA device visible");
  if (device < 0) device = mpi_local_rank(comm) % ndev;
  ncclUniqueId id{};
  if (rank == 0) nccl_check(ncclGetUniqueId(&id), "nccl_from_mpi: ncclGetUniqueId");
  detail::nccl_mpi_check(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm), "MPI_Bcast(ncclUniqueId)");
  return nccl::init_rank(id, size, rank, device, o);
}

} // namespace dpkit
