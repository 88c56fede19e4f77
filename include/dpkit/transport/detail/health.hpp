// dpkit internals: what a checked transport (inproc, mpi) keeps about its
// collectives: the fingerprint of each call, the sequence numbers per stream,
// the first failure, and the tag layout that carries (sequence, fingerprint
// hash) on every message so a peer running something else never matches them.
// docs/design.md "Errors" and docs/reliability.md describe the model. Not for
// users.
#pragma once

#include "../../core/element.hpp"
#include "../../core/errors.hpp"
#include "../../core/reduce_op.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpkit::detail {

/// The collectives a fingerprint names.
enum class coll_kind : std::uint8_t { allreduce, reduce_scatter, allgather, broadcast, reduce, barrier, gather, scatter, alltoall, alltoallv };

inline const char* coll_kind_name(coll_kind k) noexcept {
  switch (k) {
  case coll_kind::allreduce: return "allreduce";
  case coll_kind::reduce_scatter: return "reduce_scatter";
  case coll_kind::allgather: return "allgather";
  case coll_kind::broadcast: return "broadcast";
  case coll_kind::reduce: return "reduce";
  case coll_kind::barrier: return "barrier";
  case coll_kind::gather: return "gather";
  case coll_kind::scatter: return "scatter";
  case coll_kind::alltoall: return "alltoall";
  case coll_kind::alltoallv: return "alltoallv";
  }
  return "?";
}

/// What one rank runs: operation, algorithm, element type, count, reduce op,
/// root, stream (options.tag) and sequence number. Trivially copyable: the
/// MPI transport sends it in fault notices and native agreement steps.
struct fingerprint {
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::int32_t root = -1;
  std::int32_t stream = 0;
  std::uint8_t kind = 0;    // coll_kind
  std::uint8_t type = 0;    // element_type
  std::uint8_t op = 0xff;   // reduce_op, 0xff: none
  std::uint8_t valid = 0;   // 1 once set
  char algo[8] = {};        // "ring", "tree", "native", "dissem"

  /// A 32-bit hash of every field but seq (two ranks at the same seq agree iff
  /// equal, up to collisions): the fields packed into four words, mixed
  /// (splitmix64 finalizer); a few nanoseconds per collective.
  std::uint32_t hash() const noexcept {
    auto mix = [](std::uint64_t z) {
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    std::uint64_t a = 0;
    std::memcpy(&a, algo, sizeof a);
    const std::uint64_t w = static_cast<std::uint64_t>(static_cast<std::uint32_t>(root)) |
                            static_cast<std::uint64_t>(static_cast<std::uint32_t>(stream)) << 32;
    const std::uint64_t k = static_cast<std::uint64_t>(kind) | static_cast<std::uint64_t>(type) << 8 |
                            static_cast<std::uint64_t>(op) << 16;
    const std::uint64_t h = mix(mix(mix(count ^ 0x9e3779b97f4a7c15ull) ^ w) ^ (k + a * 0x100000001b3ull));
    return static_cast<std::uint32_t>(h ^ (h >> 32));
  }
  bool same_call(const fingerprint& o) const noexcept {
    return count == o.count && root == o.root && stream == o.stream && kind == o.kind && type == o.type &&
           op == o.op && std::memcmp(algo, o.algo, sizeof algo) == 0;
  }
  /// "allreduce(float, 1000, sum, ring, seq 17)"; "broadcast(int32, 8, root 1, tree, seq 3)".
  std::string str() const {
    if (!valid) return "no collective";
    std::string s = coll_kind_name(static_cast<coll_kind>(kind));
    s += "(";
    if (static_cast<coll_kind>(kind) != coll_kind::barrier) {
      // an uneven all-to-all's counts differ between ranks: its count is the world size
      s += std::string(element_type_name(static_cast<element_type>(type))) + ", " +
           (static_cast<coll_kind>(kind) == coll_kind::alltoallv ? "splits" : std::to_string(count));
      if (op != 0xff) s += ", " + std::string(reduce_op_name(static_cast<reduce_op>(op)));
      if (root >= 0) s += ", root " + std::to_string(root);
      s += ", ";
    }
    s += std::string(algo, strnlen(algo, sizeof algo)) + ", seq " + std::to_string(seq) + ")";
    return s;
  }
};
static_assert(std::is_trivially_copyable_v<fingerprint>);

/// Tag layout of checked transports: bit 30 marks a collective message; bits
/// 18-29 are the sequence number's low 12 bits, bits 4-17 the fingerprint hash's
/// low 14 bits, bits 0-3 the algorithm part (tags.hpp). Needs MPI_TAG_UB >=
/// 2^31 - 1 (Open MPI, MPICH ch3/ch4 defaults); transports with a smaller
/// bound fall back to unchecked tags.
inline constexpr int checked_tag_bit = 1 << 30;
inline constexpr int control_tag = 1;   ///< fault notices (MPI)
inline constexpr int settle_tag = 2;    ///< "settled" notices after a failed collective (MPI: mpi::settle)
inline int checked_tag_base(std::uint64_t seq, std::uint32_t hash) noexcept {
  return checked_tag_bit | static_cast<int>((seq & 0xFFFu) << 18) | static_cast<int>((hash & 0x3FFFu) << 4);
}
inline bool is_checked_tag(int tag) noexcept { return (tag & checked_tag_bit) != 0; }
inline int tag_seq_bits(int tag) noexcept { return (tag >> 18) & 0xFFF; }
inline int tag_hash_bits(int tag) noexcept { return (tag >> 4) & 0x3FFF; }
/// True when `seen` (a message tag from a peer) belongs to a different
/// collective at the same sequence number as `mine` (this rank's tag).
inline bool foreign_tag(int mine, int seen) noexcept {
  return is_checked_tag(mine) && is_checked_tag(seen) && tag_seq_bits(mine) == tag_seq_bits(seen) &&
         tag_hash_bits(mine) != tag_hash_bits(seen);
}

/// Per-transport health: sequence numbers per stream, the current call's
/// fingerprint, and the first failure. Thread-safe (the caller's thread and
/// the transport's communication thread both use it).
class comm_health {
public:
  /// True once a collective on this transport failed.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// The first failure's description ("" if none).
  std::string failure() const {
    std::lock_guard lk(mu_);
    return first_;
  }
  /// Records `what` as the failure unless one is recorded; true if it was the first.
  bool fail(const std::string& what) {
    std::lock_guard lk(mu_);
    if (failed_.load(std::memory_order_relaxed)) return false;
    first_ = what;
    failed_.store(true, std::memory_order_release);
    return true;
  }
  /// Throws when the transport failed: peer_error the first time this rank's
  /// user hears of it (another rank's failure, recorded while this rank was
  /// not in a collective: it only now calls in), communicator_error after
  /// that (reuse after an error); both name the first failure.
  void check(const char* op_name, int rank) {
    if (!failed()) return;
    if (!observed_.exchange(true, std::memory_order_acq_rel))
      throw peer_error(std::string(op_name) + ": rank " + std::to_string(rank) +
                       ": a peer's collective failed before this call (first failure: " + failure() +
                       "); the transport cannot be used; create a new transport on every rank (docs/reliability.md)");
    throw communicator_error(std::string(op_name) + ": rank " + std::to_string(rank) +
                             ": the transport failed earlier and cannot be used (first failure: " + failure() +
                             "); create a new transport on every rank (docs/reliability.md)");
  }
  /// Records that a collective of this rank threw the failure to its user
  /// (later check()s are reuse: communicator_error).
  void observed() noexcept { observed_.store(true, std::memory_order_release); }
  /// Assigns the next sequence number of fp's stream to fp (and marks it
  /// valid) and records fp as this rank's current call.
  void begin(fingerprint& fp) {
    std::lock_guard lk(mu_);
    std::uint64_t* s = nullptr;
    for (auto& [k, v] : seqs_)
      if (k == fp.stream) s = &v;
    if (!s) s = &seqs_.emplace_back(fp.stream, 0).second;
    fp.seq = (*s)++;
    fp.valid = 1;
    last_ = static_cast<std::uint32_t>(fp.seq % history_.size());
    history_[last_] = fp;
  }
  /// What this rank ran at sequence number `seq` of `stream` (the last few
  /// calls are kept), or an invalid fingerprint.
  fingerprint at(std::uint64_t seq, int stream) const {
    std::lock_guard lk(mu_);
    const fingerprint& f = history_[seq % history_.size()];
    if (f.valid && f.seq == seq && f.stream == stream) return f;
    return {};
  }
  /// The fingerprint of the collective this rank runs (or ran last).
  fingerprint current() const {
    std::lock_guard lk(mu_);
    return history_[last_];
  }
  /// Whether messages carry checked tags (set by the transport).
  bool tags_enabled = true;

private:
  std::atomic<bool> failed_{false};
  std::atomic<bool> observed_{false};
  mutable std::mutex mu_;
  std::string first_;
  std::uint32_t last_ = 0; // history_[last_]: the current (or last) call
  std::array<fingerprint, 8> history_{};
  std::vector<std::pair<int, std::uint64_t>> seqs_;
};

/// How the next native collective runs (set by call_native on transports that
/// take it): its deadline, fingerprint, whether to wait against the deadline
/// (non-blocking collectives) and whether to agree on fingerprints first.
struct native_call {
  std::chrono::steady_clock::time_point due{};
  fingerprint fp{};
  bool with_deadline = true;
  /// collective_options::check: at 1 the transport checks that every rank
  /// runs the same call before it starts MPI's collective (one small
  /// collective of a fixed size; 2 has agreed already, 0 checks nothing).
  int check = 0;
};

/// "rank A runs X; rank B runs Y".
inline std::string mismatch_text(int a, const fingerprint& fa, int b, const fingerprint& fb) {
  return "collective mismatch: rank " + std::to_string(a) + " runs " + fa.str() + "; rank " + std::to_string(b) +
         " runs " + fb.str();
}

} // namespace dpkit::detail
