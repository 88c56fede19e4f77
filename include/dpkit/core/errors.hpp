/// @file errors.hpp
/// @brief dpkit's exception types (docs/design.md, "Errors"; docs/reliability.md).
///
/// Every message names the offending value, the rank (where one exists) and
/// the operation, e.g. "allreduce_ring: rank 3 of 4: out-of-place output has
/// 10 elements, input has 12".
#pragma once

#include <stdexcept>
#include <string>

namespace dpkit {

/// Base of dpkit's runtime failures (transport errors, MPI/NCCL/CUDA error
/// codes, I/O errors). Derives std::runtime_error.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A precondition on an argument was violated: rank out of range, mismatched
/// lengths, a tensor in a memory space the transport cannot move, a zero world
/// size, an unsupported element type for a native collective. Derives
/// std::invalid_argument so callers that catch the standard type still do.
class invalid_argument : public std::invalid_argument {
public:
  using std::invalid_argument::invalid_argument;
};

/// A collective or point-to-point request could not complete before its
/// deadline (typically a peer rank never joined). Thrown on the ranks that were
/// waiting instead of hanging; the transport should be considered unusable for
/// the collective that timed out (as after ncclCommAbort). Derives dpkit::error.
class timeout_error : public error {
public:
  using error::error;
};

/// Ranks disagree about the collective they run: a different operation,
/// algorithm, element type, count, reduce op or root at the same sequence
/// number. The message names both sides, e.g. "rank 0 runs allreduce(float,
/// 1000, sum, ring, seq 17); rank 1 runs allreduce(float, 2000, sum, ring, seq
/// 17)". Thrown instead of a silently wrong result; the transport is failed
/// afterwards (docs/reliability.md). Derives dpkit::error.
class mismatch_error : public error {
public:
  using error::error;
};

/// A transport was used after a collective on it failed (timeout, mismatch,
/// peer failure, transport error). The message names the first failure (rank,
/// operation, sequence number). Recovery: a new transport (a fresh dpkit::mpi
/// over the same MPI communicator, a new inproc_world). Derives dpkit::error.
class communicator_error : public error {
public:
  using error::error;
};

/// Another rank failed (threw, returned early, or reported a fault), so this
/// rank's collective cannot complete. The message names that rank and its
/// cause. Derives dpkit::error.
class peer_error : public error {
public:
  using error::error;
};

/// A file is malformed, damaged, from another version, or stale relative to the
/// file it describes (e.g. a JSONL index whose source changed). The message
/// names the file and what differs. Derives dpkit::error.
class format_error : public error {
public:
  using error::error;
};

// ---- data errors (JSONL index; docs/data.md, docs/jsonl-index-format.md) ----

/// A JSONL index build was cancelled (progress callback returned false, or the
/// stop token was triggered). No index file and no temporary file are left
/// behind. Derives dpkit::error.
class build_cancelled : public error {
public:
  using error::error;
};

/// An index file is well-formed but describes another version of its source
/// (size, modification time or head/tail fingerprint differ). The message names
/// both files and what differs. Derives dpkit::format_error.
class stale_index_error : public format_error {
public:
  using format_error::format_error;
};

// ---- end of data errors ----

} // namespace dpkit
