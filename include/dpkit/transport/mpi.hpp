/// @file mpi.hpp
/// @brief The MPI transport: wraps an MPI communicator (never calls MPI_Init
/// or MPI_Finalize itself), host memory.
///
/// @code
/// int provided;
/// MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
/// {
///   dpkit::mpi comm(MPI_COMM_WORLD);      // duplicates the communicator
///   dpkit::allreduce(comm, grads, dpkit::reduce_op::avg);
/// }                                       // frees the duplicate
/// MPI_Finalize();
/// @endcode
///
/// Point-to-point requests are MPI_Isend/MPI_Irecv of MPI_BYTE on the
/// duplicated communicator (messages over 1 GiB are split into several
/// requests, since MPI counts are int; messages to ranks on other nodes into
/// fragments of inter_fragment_bytes() where that is set). wait(deadline)
/// polls MPI_Testall, so a
/// peer that never arrives yields dpkit::timeout_error rather than a hang; the
/// timed-out requests are cancelled.
///
/// Threading: blocking collectives may be called from any one thread at a
/// time. The *_async collectives run on the transport's communication thread,
/// which calls MPI concurrently with the caller only if the caller also calls
/// MPI meanwhile: initialize MPI with MPI_THREAD_MULTIPLE for that (or
/// MPI_THREAD_SERIALIZED if the caller does not touch MPI while a handle is
/// pending).
#pragma once

#include "../core/async.hpp"
#include "../core/element.hpp"
#include "../core/errors.hpp"
#include "../core/options.hpp"
#include "../core/reduce_op.hpp"
#include "../core/tensor.hpp"
#include "../core/tuning_table.hpp"
#include "detail/scratch_arena.hpp"
#include "concept.hpp"
#include "detail/health.hpp"
#include "detail/shm_mapping.hpp"
#include "detail/shm_segment.hpp"

#include <mpi.h>

#include <cerrno>
#include <csignal>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <climits>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dpkit {

namespace detail {
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}
inline void mpi_check(int code, const char* call, int rank) {
  if (code != MPI_SUCCESS)
    throw error(std::string(call) + " failed on rank " + std::to_string(rank) + ": " + mpi_error_string(code));
}
/// Largest message one MPI request carries (bytes).
inline constexpr std::size_t mpi_max_message = std::size_t{1} << 30;

/// The most bytes dpkit::mpi stages for one native collective with a
/// deadline (mpi::stage: an input and an output region, MPI's collective
/// running out of place between them): larger calls run as several MPI
/// collectives, each on at most this many bytes of staging (an all-gather
/// or reduce-scatter counts all the ranks' blocks), so the transport holds
/// at most this much.
inline constexpr std::size_t mpi_stage_max = std::size_t{64} << 20;

/// Checks a fragment size for dpkit::mpi's messages to other nodes: 0 (whole
/// messages) or 4 KiB to 1 GiB. `what` names its source in the error.
/// @throws dpkit::invalid_argument naming the value.
inline std::size_t checked_inter_fragment(unsigned long long v, const std::string& what) {
  if (v != 0 && (v < 4096 || v > mpi_max_message))
    throw invalid_argument(what + ": fragment of " + std::to_string(v) +
                           " bytes is out of range (0 for whole messages, or 4096 to 1073741824)");
  return static_cast<std::size_t>(v);
}

/// The fragment size of dpkit::mpi's messages to ranks on other nodes, as the
/// environment sets it: DPKIT_MPI_INTER_FRAGMENT (bytes; 0: whole messages),
/// else the `fragment inter BYTES` line of DPKIT_TUNING_FILE, else 0.
/// @throws dpkit::invalid_argument on a malformed or out-of-range value;
///         dpkit::error / dpkit::format_error on a tuning file that cannot be
///         read or parsed.
inline std::size_t inter_fragment_from_env() {
  if (const char* s = std::getenv("DPKIT_MPI_INTER_FRAGMENT"); s && *s) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (!end || *end != '\0' || s[0] == '-')
      throw invalid_argument(std::string("DPKIT_MPI_INTER_FRAGMENT: expected a byte count, got '") + s + "'");
    return checked_inter_fragment(v, "DPKIT_MPI_INTER_FRAGMENT");
  }
  const tuning_table* t = env_tuning(); // its parser checked the range
  return t && t->inter_fragment_bytes ? *t->inter_fragment_bytes : 0;
}

/// True once MPI_Finalize has begun in this process: set by the delete
/// callback of an attribute on MPI_COMM_SELF, which MPI_Finalize frees first
/// (MPI 4.0, 11.2.4), so a collective can refuse a finalized MPI with one
/// atomic load, where MPI_Finalized takes Open MPI's bootstrap lock (about
/// 20 ns on each call: 2-4% of an 8-byte tree all-reduce). Process-wide, as
/// MPI_Finalize is.
inline std::atomic<bool>& mpi_finalizing() noexcept {
  static std::atomic<bool> finalizing{false};
  return finalizing;
}
inline int mpi_on_finalize(MPI_Comm, int, void*, void*) {
  mpi_finalizing().store(true, std::memory_order_release);
  return MPI_SUCCESS;
}
/// Hooks mpi_finalizing() to MPI_Finalize (once per process; MPI must be
/// initialized). Never throws: without the hook the flag stays false and
/// check_usable falls back to MPI_Finalized.
inline bool mpi_watch_finalize() noexcept {
  static const bool hooked = [] {
    int key = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &mpi_on_finalize, &key, nullptr) != MPI_SUCCESS) return false;
    return MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr) == MPI_SUCCESS;
  }();
  return hooked;
}

/// Lets MPI_Finalize return without waiting for every process of the job,
/// called when a transport is torn down after a rank's process ended. Open
/// MPI 4.1's MPI_Finalize ends with a fence over every process, which a rank
/// that _exited can keep from completing forever (seen in 2 of 5 runs of
/// `rank_death ring exit`); Open MPI's own switch for skipping it is the
/// library variable ompi_async_mpi_finalize (OMPI_MCA_async_mpi_finalize=1
/// at launch sets it), set here where the symbol exists. Only then: a rank
/// that skips the fence while its live peers enter it leaves them waiting
/// there forever (a timeout between live ranks must not set it). Other
/// MPIs: nothing.
inline void mpi_finalize_without_fence() noexcept {
#if defined(OPEN_MPI) && OPEN_MPI
  if (void* p = ::dlsym(RTLD_DEFAULT, "ompi_async_mpi_finalize")) *static_cast<bool*>(p) = true;
#endif
}

/// A fault notice, sent on control_tag to every other rank by a rank whose
/// collective failed (fixed size, so it is one eager message).
struct mpi_notice {
  std::int32_t kind = 0; // 1: failure, 2: mismatch, 3: a rank's process has ended
  std::int32_t rank = -1;
  fingerprint fp{};
  char text[472] = {};
  /// "rank R reported: <text>".
  std::string reported() const {
    return "rank " + std::to_string(rank) + " reported: " + std::string(text, strnlen(text, sizeof text));
  }
};

/// One block of dpkit::mpi's default-level check of a native call: the
/// call's (hash, ~hash) pair, max-reduced; what the payload is; and the
/// payload of a small all-reduce (at most 32 bytes of elements) reduced in
/// the same MPI_Iallreduce: 64 bytes, one cache line (a 96-byte block with
/// 64 bytes of payload cost about 1% more at 8 B).
struct mpi_fused_block {
  std::uint64_t h, nh;
  std::uint32_t type, op, count, differ;
  std::byte payload[32];
};
static_assert(sizeof(mpi_fused_block) == 64 && alignof(mpi_fused_block) == 8);
/// 64-bit words in one mpi_fused_block: MPI moves it as that many
/// MPI_UINT64_T (a predefined type: no datatype engine on the path, about
/// 20 ns less per call than a derived type of the same bytes here).
inline constexpr int mpi_fused_words = static_cast<int>(sizeof(mpi_fused_block) / sizeof(std::uint64_t));

/// A send or receive of a failed collective that MPI could not finish or
/// cancel when its request was dropped (mpi_request::cancel): kept, never
/// freed, for mpi::settle to drain.
struct mpi_abandoned {
  MPI_Request request = MPI_REQUEST_NULL;
  int peer = -1;
  bool is_send = false;
};

/// How long mpi::settle waits at most for the peers of a failed collective
/// (bounded further by the collective's own timeout).
inline constexpr std::chrono::milliseconds mpi_settle_grace{1000};

/// State shared by an mpi transport and its requests (stable address).
struct mpi_shared {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  comm_health health;
  native_call call{};
  mpi_notice notice{};                 // what this rank sent (one failure per transport)
  std::vector<MPI_Request> notice_sends;
  shm_segment* shm = nullptr;          // the shared segment, if any (its abort words)
  mpi_shared* parent = nullptr;        // the transport whose hierarchy this one serves (node or cross)
  bool abandoned = false;              // its destructor left the collective frees to MPI (~mpi)
  bool peer_dead = false;              // a rank's process ended (found here or told by a notice of kind 3)
  bool check_pending = false;          // the native call's default-level check has not run yet
  // Buffers of dpkit's own non-blocking collectives (the check, the
  // agreement, split's exchange): here, not on a stack, because a wait that
  // throws abandons its request and MPI may still write into them later;
  // this state outlives the transport's use (it is leaked when the
  // transport failed, see ~mpi).
  mpi_fused_block check_block{}, check_result{};
  std::vector<fingerprint> agree_all;
  std::vector<int> split_all;
  // The staging area of native collectives with a deadline (mpi::stage):
  // MPI's non-blocking collective reads and writes it instead of the
  // caller's buffers, so a call abandoned at its deadline or on a peer's
  // failure, which MPI may go on running, never touches memory the caller
  // frees afterwards. Leaked with this state when the transport failed.
  std::unique_ptr<std::byte[]> stage;
  std::size_t stage_bytes = 0;
  std::size_t stage_limit = mpi_stage_max;
  // Requests of failed collectives that MPI still holds (`held`), the
  // ranks whose "settled" notice has arrived, and whether this rank sent its
  // own (mpi::settle); the mutex: requests may be dropped on the
  // communication thread and the caller's.
  std::mutex abandon_mu;
  std::vector<mpi_abandoned> held;
  std::vector<char> settled_from;
  bool settled_sent = false;
  std::vector<MPI_Request> settle_sends;
  char settle_byte = 1;

  /// Drops a request of this transport that may be incomplete: a receive is
  /// cancelled (MPI_Cancel succeeds while it is unmatched); what MPI can
  /// neither finish nor cancel (a send, or a receive already matched) is
  /// kept in `held`, never freed, since MPI may still read or write its
  /// buffer until it completes (mpi::settle waits for that).
  void abandon(MPI_Request& r, int peer, bool is_send) noexcept {
    if (r == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done && !is_send) {
      MPI_Cancel(&r);
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    }
    if (!done) {
      try {
        const std::lock_guard lk(abandon_mu);
        held.push_back({r, peer, is_send});
      } catch (...) {
        // out of memory: the request stays with MPI (as MPI_Request_free would leave it)
      }
    }
    r = MPI_REQUEST_NULL;
  }
  /// Whether rank p's process is known to have ended (on one node).
  bool peer_gone(int p) const noexcept {
    return shm && p >= 0 && p < size && !shm->left(p) &&
           process_ended(shm->control(p).pid.load(std::memory_order_relaxed), false);
  }
  /// Takes the "settled" notices that have arrived (mpi::settle).
  void take_settled() noexcept {
    for (;;) {
      int flag = 0;
      MPI_Message msg = MPI_MESSAGE_NULL;
      MPI_Status st;
      if (MPI_Improbe(MPI_ANY_SOURCE, settle_tag, comm, &flag, &msg, &st) != MPI_SUCCESS || !flag) return;
      char b = 0;
      MPI_Mrecv(&b, 1, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
      if (st.MPI_SOURCE >= 0 && st.MPI_SOURCE < size) settled_from[static_cast<std::size_t>(st.MPI_SOURCE)] = 1;
    }
  }

  /// Takes one pending fault notice from `source` (MPI_ANY_SOURCE: any) with
  /// a matched probe (MPI_Improbe + MPI_Mrecv), so two threads polling one
  /// communicator (a hierarchy's stages poll their parent) never race for
  /// the same message; false when none is pending.
  bool take_notice(int source, mpi_notice& n) {
    int flag = 0;
    MPI_Message msg = MPI_MESSAGE_NULL;
    MPI_Status st;
    if (MPI_Improbe(source, control_tag, comm, &flag, &msg, &st) != MPI_SUCCESS || !flag) return false;
    MPI_Mrecv(&n, sizeof n, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    return true;
  }
  /// Records the first failure and tells every other rank (once).
  void fail_and_notify(const std::string& what, int kind, const fingerprint* fp = nullptr) {
    if (kind == 3) peer_dead = true;
    if (!health.fail(what)) {
      if (kind == 3 && parent) parent->peer_dead = true;
      return;
    }
    notice.kind = kind;
    notice.rank = rank;
    notice.fp = fp ? *fp : health.current();
    std::strncpy(notice.text, what.c_str(), sizeof notice.text - 1);
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Isend(&notice, sizeof notice, MPI_BYTE, p, control_tag, comm, &r) == MPI_SUCCESS)
        notice_sends.push_back(r);
    }
    // The shm abort words last: a peer that stops on them and sends its own
    // (less specific) notice does so after this one is on its way.
    if (shm) shm->abort_all();
    // A node or cross-node transport of a hierarchy fails its parent too:
    // the ranks waiting in the hierarchy's other stages poll the parent.
    if (parent) parent->fail_and_notify(what, kind);
  }
  /// Handles a notice received from another rank: throws mismatch_error or
  /// peer_error (after failing this transport and telling the others).
  [[noreturn]] void on_notice(const mpi_notice& n) {
    if (n.kind == 3) peer_dead = true;
    answer_mismatch(n);
    // A peer's failure notice may be the echo of a mismatch another peer
    // found in a call this rank has finished (a broadcast root that sent and
    // went on): take the notices that have arrived too and answer such a
    // mismatch first, so that peer names both calls.
    for (int more = 0; more < size; ++more) {
      mpi_notice other;
      if (!take_notice(MPI_ANY_SOURCE, other)) break;
      answer_mismatch(other);
    }
    const std::string what = n.reported();
    fail_and_notify(what, n.kind);
    if (n.kind == 2) throw mismatch_error(what);
    throw peer_error("mpi: rank " + std::to_string(rank) + " stops: " + what);
  }
  /// If notice n reports a mismatch at a sequence number where this rank ran
  /// another call: fails the transport, sends this rank's side (its notice
  /// carries that call's fingerprint) and throws mismatch_error naming both.
  void answer_mismatch(const mpi_notice& n) {
    // What this rank ran at the sequence number the notice names (it may
    // have finished that collective already, e.g. a broadcast root).
    const fingerprint mine = n.fp.valid ? health.at(n.fp.seq, n.fp.stream) : fingerprint{};
    if (n.kind == 2 && n.fp.valid && mine.valid && !n.fp.same_call(mine)) {
      const std::string what = mismatch_text(n.rank, n.fp, rank, mine);
      fail_and_notify(what, 2, &mine);
      throw mismatch_error(what);
    }
  }
  /// Called by waits that have waited a while: takes a pending fault notice,
  /// and looks for a message from `peer` (or any rank, peer < 0) that belongs
  /// to another collective at this collective's sequence number.
  void poll(int peer, int my_tag) {
    // This rank waits: put its current call in the shared segment, where a
    // peer waiting in a shm collective reads it (collective_scope publishes
    // nothing for calls that never wait).
    if (shm) {
      const fingerprint mine = health.current();
      shm->publish(mine);
      check_alive();
      check_published(mine);
    }
    if (mpi_notice n; take_notice(MPI_ANY_SOURCE, n)) on_notice(n);
    if (parent) parent->poll_notices();
    if (!is_checked_tag(my_tag)) return;
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(peer >= 0 ? peer : MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &st);
    if (flag && foreign_tag(my_tag, st.MPI_TAG)) on_foreign(st.MPI_SOURCE, st.MPI_TAG);
  }
  /// On one node: a peer whose process has ended (killed, _exit, or gone
  /// after MPI_Finalize) will never answer; fail now with peer_error naming
  /// it instead of waiting for the deadline (kill(pid, 0) per peer, about a
  /// microsecond each, from waits that have lasted a millisecond).
  void check_alive() {
    if (const int p = gone_peer(); p >= 0) {
      const std::string what = "rank " + std::to_string(p) + " (process " +
                               std::to_string(shm->control(p).pid.load(std::memory_order_relaxed)) +
                               " on this node) has ended without leaving the collective";
      fail_and_notify(what, 3);
      throw peer_error("mpi: rank " + std::to_string(rank) + " stops: " + what);
    }
  }
  /// A rank of this node whose process no longer exists, or -1 (also -1
  /// without a segment).
  int gone_peer() const noexcept { return shm ? shm->ended_peer(false) : -1; }

  /// On one node: a peer that waits too publishes its call in the segment;
  /// one at this call's sequence number and stream running another call is
  /// a mismatch even when no message of it can reach this rank (a tree
  /// all-reduce's root waits to receive from its child while the child, in a
  /// broadcast, waits to receive from the root: neither sends).
  void check_published(const fingerprint& mine) {
    fingerprint theirs;
    if (const int p = shm->other_call(mine, theirs); p >= 0) {
      const std::string what = mismatch_text(rank, mine, p, theirs);
      fail_and_notify(what, 2, &mine);
      throw mismatch_error(what);
    }
  }

  /// Takes a pending fault notice (throws peer_error or mismatch_error), as
  /// poll() does, without looking at other messages; then the parent's.
  void poll_notices() {
    if (mpi_notice n; take_notice(MPI_ANY_SOURCE, n)) on_notice(n);
    if (health.failed()) throw peer_error("mpi: rank " + std::to_string(rank) + " stops: " + health.failure());
    if (parent) parent->poll_notices();
  }
  /// A peer's message carries another collective's fingerprint at our
  /// sequence number: tell everyone, give the peer up to 500 ms to name its
  /// side (its notice), then throw mismatch_error.
  [[noreturn]] void on_foreign(int peer, int tag) {
    const fingerprint mine = health.current();
    const std::string partial = "collective mismatch: rank " + std::to_string(rank) + " runs " + mine.str() +
                                "; rank " + std::to_string(peer) +
                                " sent a message of another collective at the same sequence number (tag " +
                                std::to_string(tag) + ")";
    fail_and_notify(partial, 2);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (std::chrono::steady_clock::now() < until) {
      if (mpi_notice n; take_notice(peer, n)) {
        // its side only if the notice is about this call (a notice it sent
        // for another reason carries a later call)
        if (n.fp.valid && n.fp.seq == mine.seq && n.fp.stream == mine.stream && !n.fp.same_call(mine))
          throw mismatch_error(mismatch_text(rank, mine, n.rank, n.fp));
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    throw mismatch_error(partial);
  }
  /// Waits a (native collective) request against call.due, polling as above.
  void wait_native(MPI_Request& r, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    auto next_poll = start + std::chrono::milliseconds(1);
    const int my_tag = health.tags_enabled && call.fp.valid ? checked_tag_base(call.fp.seq, call.fp.hash()) : 0;
    for (unsigned spins = 1;; ++spins) {
      int flag = 0;
      mpi_check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), what, rank);
      if (flag) return;
      if ((spins & 63u) == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (now > call.due)
          throw timeout_error(std::string("mpi: rank ") + std::to_string(rank) + ": " + what +
                              " did not complete (MPI keeps the request, on memory of the transport's own)");
        if (now >= next_poll) {
          poll(-1, my_tag);
          next_poll = now + std::chrono::milliseconds(1);
        }
        if (spins > 1024) std::this_thread::yield();
      }
    }
  }
};
} // namespace detail

/// A pending MPI send or receive (models dpkit::request). Holds one MPI
/// request per 1 GiB piece (inline for the usual single piece, so a message
/// costs no heap allocation). Destroying it while incomplete cancels it.
class mpi_request {
public:
  mpi_request() = default;
  /// Internal: takes ownership of `count` requests (first inline, rest in more).
  mpi_request(MPI_Request first, std::vector<MPI_Request> more, int rank, int peer, int tag, bool is_send,
              detail::mpi_shared* sh = nullptr, std::size_t bytes = 0)
      : first_(first), more_(std::move(more)), sh_(sh), bytes_(bytes), rank_(rank), peer_(peer), tag_(tag),
        is_send_(is_send) {}
  mpi_request(mpi_request&& o) noexcept { swap(o); }
  mpi_request& operator=(mpi_request&& o) noexcept {
    if (this != &o) {
      cancel();
      swap(o);
    }
    return *this;
  }
  ~mpi_request() { cancel(); }

  /// True once complete (progresses MPI).
  /// @throws dpkit::error if MPI reports an error.
  /// @throws dpkit::error if MPI reports an error, or when a receive
  ///         matched a message of another length (a receive must be exactly
  ///         as long as its send, on every dpkit transport: MPI would
  ///         complete a longer receive silently), naming both lengths.
  bool test() {
    if (first_ != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Status st;
      detail::mpi_check(MPI_Test(&first_, &flag, is_send_ ? MPI_STATUS_IGNORE : &st), "MPI_Test", rank_);
      if (!flag) return false;
      if (!is_send_) count_received(st);
    }
    if (!more_.empty()) {
      int flag = 0;
      std::vector<MPI_Status> st(is_send_ ? 0 : more_.size());
      detail::mpi_check(MPI_Testall(static_cast<int>(more_.size()), more_.data(), &flag,
                                    is_send_ ? MPI_STATUSES_IGNORE : st.data()),
                        "MPI_Testall", rank_);
      if (!flag) return false;
      for (const auto& one : st) count_received(one);
      more_.clear();
    }
    if (!is_send_ && received_ != bytes_)
      throw error("mpi: rank " + std::to_string(rank_) + ": receive from rank " + std::to_string(peer_) + " (tag " +
                  std::to_string(tag_) + ", " + std::to_string(bytes_) + " bytes) matched a message of " +
                  std::to_string(received_) + " bytes: a receive must be exactly as long as its send");
    return true;
  }
  /// Polls until complete. After 1 ms it also watches for fault notices from
  /// other ranks and for a peer message of another collective at this
  /// sequence number (checked tags), every millisecond.
  /// @throws dpkit::timeout_error past deadline d (naming rank, peer, tag);
  ///         dpkit::peer_error (another rank reported a failure);
  ///         dpkit::mismatch_error (the peer runs another collective);
  ///         dpkit::error if MPI reports an error.
  void wait(deadline d) {
    unsigned spins = 0;
    deadline next_poll{};
    while (!test()) {
      if ((++spins & 63u) == 0) {
        const auto now = clock::now();
        if (now > d) {
          cancel();
          throw timeout_error("mpi: rank " + std::to_string(rank_) + " timed out waiting for " +
                              (is_send_ ? "send to rank " + std::to_string(peer_)
                               : peer_ == MPI_ANY_SOURCE ? std::string("receive from any rank")
                                                         : "receive from rank " + std::to_string(peer_)) +
                              " (tag " + std::to_string(tag_) + ")");
        }
        if (sh_) {
          if (next_poll == deadline{}) next_poll = now + std::chrono::milliseconds(1);
          else if (now >= next_poll) {
            sh_->poll(peer_, tag_);
            next_poll = now + std::chrono::milliseconds(1);
          }
        }
        // Long waits back off: yield at first, then sleep briefly, so a
        // communication thread waiting on a slow peer leaves the cores to the
        // caller's compute (backward) instead of spinning on MPI_Test.
        if (spins > (1u << 16)) std::this_thread::sleep_for(std::chrono::microseconds(20));
        else if (spins > 1024) std::this_thread::yield(); // let an oversubscribed peer run
      }
    }
  }
  /// Payload bytes of this request.
  std::size_t bytes() const noexcept { return bytes_; }
  /// The peer: for a receive from any rank (mpi::irecv_any), the rank the
  /// message came from once complete, -1 before.
  int source() const noexcept { return peer_ == MPI_ANY_SOURCE ? source_ : peer_; }

private:
  void count_received(const MPI_Status& st) noexcept {
    if (peer_ == MPI_ANY_SOURCE) source_ = st.MPI_SOURCE;
    int n = 0;
    if (MPI_Get_count(&st, MPI_BYTE, &n) == MPI_SUCCESS && n > 0) received_ += static_cast<std::size_t>(n);
  }
  void swap(mpi_request& o) noexcept {
    std::swap(received_, o.received_);
    std::swap(source_, o.source_);
    std::swap(first_, o.first_);
    std::swap(more_, o.more_);
    std::swap(sh_, o.sh_);
    std::swap(bytes_, o.bytes_);
    std::swap(rank_, o.rank_);
    std::swap(peer_, o.peer_);
    std::swap(tag_, o.tag_);
    std::swap(is_send_, o.is_send_);
  }
  static void cancel_one(MPI_Request& r) noexcept {
    if (r == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    r = MPI_REQUEST_NULL;
  }
  // Drops the request: through the transport's state when it has one (a
  // send or matched receive MPI cannot drop is kept there for mpi::settle),
  // else cancelled and freed.
  void cancel() noexcept {
    if (first_ == MPI_REQUEST_NULL && more_.empty()) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (sh_) {
      sh_->abandon(first_, peer_, is_send_);
      for (auto& r : more_) sh_->abandon(r, peer_, is_send_);
    } else {
      cancel_one(first_);
      for (auto& r : more_) cancel_one(r);
    }
    more_.clear();
  }

  MPI_Request first_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> more_;
  detail::mpi_shared* sh_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t received_ = 0; // bytes the completed pieces of a receive brought
  int source_ = -1;          // a receive from any rank: the rank it came from, once complete
  int rank_ = 0, peer_ = 0, tag_ = 0;
  bool is_send_ = false;
};

/// MPI transport over a communicator (models dpkit::transport,
/// dpkit::native_collectives, dpkit::async_transport,
/// dpkit::shared_memory_transport, dpkit::splittable_transport,
/// dpkit::hierarchical_transport). Host memory only (a CUDA-aware MPI could
/// accept device memory; not assumed). Move-only.
///
/// Topology: the constructor finds each rank's node with
/// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) (Open MPI groups the ranks of
/// one host). When every rank is on one node the transport maps a shared
/// segment (shm()); when the ranks span several nodes it has none, and it
/// builds the sub-transports the hierarchical collectives run on instead:
/// node_transport() over the node's ranks (with the node's shared segment)
/// and cross_transport() over the peers on the other nodes.
/// DPKIT_RANKS_PER_NODE=k (k >= 1) divides each host into virtual nodes of k
/// consecutive local ranks, so a multi-node layout runs on one machine
/// (tests; the shared segment then spans one virtual node).
///
/// Fragments between nodes: with inter_fragment_bytes() = F > 0, a message
/// to or from a rank on another node that is longer than F goes as
/// ceil(bytes / F) MPI messages of F bytes (the last shorter), all posted at
/// once with the same tag (MPI's non-overtaking order matches them). Why: on
/// Open MPI's tcp btl a message above its eager limit (64 KiB) takes the
/// rendezvous protocol, and on the emulated cluster two such messages
/// crossing a link in opposite directions (every ring step and swap between
/// nodes) each moved at half the rate one direction gets; fragments below the
/// limit kept both directions at the full rate (64 MiB all-reduce between
/// two nodes: 502 ms whole, 284 ms in 60 KiB fragments, the link's bound
/// 283 ms; benchmarks/results/2026-11-26-cluster-fragments.md). Off by
/// default (0); set by DPKIT_MPI_INTER_FRAGMENT or the tuning file's
/// `fragment inter` line, which `allreduce_perf --tune` writes when it
/// measured fragments faster on the cluster at hand.
class mpi {
public:
  /// Wraps `comm`. With `duplicate` (default), dpkit works on an
  /// MPI_Comm_dup of it (collective over comm), so its messages never match
  /// the application's; the duplicate is freed by the destructor, which must
  /// run before MPI_Finalize. Collective over comm: also finds the nodes and,
  /// across nodes, splits the node and cross-node communicators (above).
  /// @throws dpkit::error if MPI is not initialized or a call fails;
  ///         dpkit::invalid_argument on a malformed DPKIT_RANKS_PER_NODE or
  ///         DPKIT_SHM_BYTES.
  ///         Also invalid_argument on every rank when the ranks' fragment
  ///         settings (DPKIT_MPI_INTER_FRAGMENT, the tuning file) differ or
  ///         one is out of range, since fragments only match fragments.
  explicit mpi(MPI_Comm comm = MPI_COMM_WORLD, bool duplicate = true) {
    open(comm, duplicate);
    discover_topology();
    finish_setup();
  }

  /// Fragment size in bytes of messages to ranks on other nodes (0: whole
  /// messages; see the class comment).
  std::size_t inter_fragment_bytes() const noexcept { return inter_fragment_; }
  /// Sets the fragment size of messages to ranks on other nodes, on this
  /// transport and its node and cross-node sub-transports. Every rank must
  /// set the same value, between collectives (no message in flight), as for
  /// any collective argument: a fragment only matches a fragment.
  /// @param bytes 0 (whole messages) or 4096 to 1073741824.
  /// @throws dpkit::invalid_argument naming the value and the rank.
  void set_inter_fragment_bytes(std::size_t bytes) {
    inter_fragment_ = detail::checked_inter_fragment(bytes, "mpi::set_inter_fragment_bytes: rank " + std::to_string(rank_));
    if (node_) node_->set_inter_fragment_bytes(bytes);
    if (cross_) cross_->set_inter_fragment_bytes(bytes);
  }

  /// Splits this transport as MPI_Comm_split (splittable_transport): a
  /// collective call of every rank; the ranks that pass the same `color`
  /// form a new transport on a communicator of their own, ranked by (key,
  /// rank). Its nodes are this transport's, restricted to its ranks (a shared
  /// segment when they are on one node, a hierarchy when they span several).
  /// The ranks first exchange (color, key) under `timeout`, so a rank that
  /// never calls split yields timeout_error instead of a hang (and fails this
  /// transport: the exchange it abandoned may still complete into it).
  /// @param color >= 0.
  /// @throws dpkit::invalid_argument if color < 0; dpkit::timeout_error;
  ///         dpkit::communicator_error if this transport failed earlier;
  ///         dpkit::error if an MPI call fails.
  mpi split(int color, int key, std::chrono::milliseconds timeout = env_default_timeout()) {
    if (color < 0)
      throw invalid_argument("mpi::split: rank " + std::to_string(rank_) + ": color must be >= 0, got " +
                             std::to_string(color));
    sh_->health.check("mpi::split", rank_);
    // (color, key) of every rank, waited against the deadline: once every
    // rank has sent it, MPI_Comm_split no longer waits for a missing rank.
    // (in the transport's state: a wait that throws abandons the request,
    // and the transport, failed then, keeps the buffer)
    std::vector<int>& all = sh_->split_all;
    all.assign(2 * static_cast<std::size_t>(size_) + 2, 0);
    int* mine = all.data() + 2 * static_cast<std::size_t>(size_);
    mine[0] = color;
    mine[1] = key;
    MPI_Request r = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_, &r), "MPI_Iallgather (split)",
                      rank_);
    sh_->call = detail::native_call{deadline_after(timeout), {}, true};
    struct reset_call {
      detail::mpi_shared& s;
      ~reset_call() { s.call = {}; }
    } reset{*sh_};
    try {
      sh_->wait_native(r, "MPI_Iallgather (split)");
    } catch (const std::exception& e) {
      sh_->fail_and_notify(std::string("mpi::split: rank ") + std::to_string(rank_) + ": " + e.what(), 1);
      throw;
    }
    MPI_Comm sub = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split", rank_);
    // the new transport's ranks in this one's order give its layout
    std::vector<long long> labels;
    std::vector<std::pair<int, int>> members; // (key, rank) of my color
    for (int p = 0; p < size_; ++p)
      if (all[2 * static_cast<std::size_t>(p)] == color) members.emplace_back(all[2 * static_cast<std::size_t>(p) + 1], p);
    std::stable_sort(members.begin(), members.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& m : members) labels.push_back(topo_.node_of(m.second));
    mpi child(sub, node_layout::canonicalize(labels), nullptr);
    child.set_inter_fragment_bytes(inter_fragment_);
    return child;
  }

  /// True when MPI was initialized with MPI_THREAD_MULTIPLE, so this
  /// transport's communication thread may call MPI while another thread
  /// does (the hierarchical all-reduce then overlaps its stages).
  static bool concurrent_calls() noexcept {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided == MPI_THREAD_MULTIPLE;
  }

  /// Which node each rank is on (hierarchical_transport; see the class comment).
  const node_topology& topology() const noexcept { return topo_; }
  /// The transport over this rank's node (its shared segment), or nullptr when
  /// !topology().hierarchical() (hierarchical_transport). Owned by this one.
  mpi* node_transport() noexcept { return node_.get(); }
  /// The transport over this rank's peers on the other nodes (uniform layout:
  /// the ranks with its local rank; otherwise the nodes' leaders, and
  /// nullptr on the other ranks), or nullptr when !topology().hierarchical()
  /// (hierarchical_transport). Owned by this one.
  mpi* cross_transport() noexcept { return cross_.get(); }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  mpi(mpi&& o) noexcept
      : comm_(o.comm_), owned_(o.owned_), rank_(o.rank_), size_(o.size_), half_ops_(o.half_ops_),
        fused_op_(std::exchange(o.fused_op_, MPI_OP_NULL)),
        arena_(std::move(o.arena_)), progress_(std::move(o.progress_)), sh_(std::move(o.sh_)),
        shm_(std::move(o.shm_)), shm_map_(std::move(o.shm_map_)), topo_(std::move(o.topo_)),
        inter_fragment_(o.inter_fragment_), node_(std::move(o.node_)), cross_(std::move(o.cross_)) {
    o.owned_ = false;
    o.half_ops_.fill(MPI_OP_NULL);
  }
  /// Unmaps the shared segment and frees the duplicated communicator; never
  /// waits for another rank (a dead or departed peer cannot keep a survivor
  /// here) and never throws. When the transport failed earlier (a
  /// collective threw: its requests may still be pending in MPI, a peer may
  /// be gone) or an exception is unwinding through it, the communicator and
  /// the memory MPI may still read or write for this transport (the fault
  /// notices, the scratch arena) are left to MPI until the process exits
  /// (a small leak on the failure path only); during unwinding it also sends
  /// its peers a fault notice, so a rank waiting in a collective with it
  /// throws peer_error within milliseconds instead of at its deadline. Does
  /// nothing MPI-related after MPI_Finalize. The caller's own buffers need
  /// not outlive it: a failed collective handed them back only once MPI no
  /// longer held them (native calls run on the staging area; settle() for
  /// the rest; the limit is in docs/reliability.md).
  ~mpi() {
    progress_.reset(); // finish queued async collectives first
    if (!sh_) return;  // moved from
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& op : half_ops_)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    if (fused_op_ != MPI_OP_NULL) MPI_Op_free(&fused_op_);
    // notices that arrived since this rank's last collective (a dead peer
    // among them changes how MPI_Finalize must end)
    if (!sh_->parent)
      for (detail::mpi_notice n; sh_->take_notice(MPI_ANY_SOURCE, n);) {
        if (n.kind == 3) sh_->peer_dead = true;
        sh_->health.fail(n.reported());
      }
    if (sh_->health.failed() && sh_->gone_peer() >= 0) sh_->peer_dead = true;
    if (sh_->peer_dead) detail::mpi_finalize_without_fence();
    if (!healthy_teardown()) {
      sh_->abandoned = true;
      node_.reset(); // they see the parent abandoned
      cross_.reset();
      (void)sh_.release();
      (void)arena_.release();
      return;
    }
    for (auto& r : sh_->notice_sends)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    // requests a healthy transport's caller dropped incomplete (no
    // collective failed): as MPI_Request_free leaves them
    for (auto& a : sh_->held)
      if (a.request != MPI_REQUEST_NULL) MPI_Request_free(&a.request);
    if (owned_) MPI_Comm_free(&comm_);
  }

  /// This rank in the communicator.
  int rank() const noexcept { return rank_; }
  /// Number of ranks.
  int size() const noexcept { return size_; }
  /// Host memory only.
  static constexpr bool accepts(memory_space s) noexcept { return s == memory_space::host; }
  /// The (duplicated) communicator dpkit uses.
  MPI_Comm native_handle() const noexcept { return comm_; }

  /// MPI_Isend of `data` (bytes) to `peer` with `tag`.
  /// @throws dpkit::invalid_argument if peer is out of range; dpkit::error on MPI failure.
  mpi_request isend(std::span<const std::byte> data, int peer, int tag) {
    check_peer(peer, "isend");
    return start(data.size(), peer, tag, true, [&](std::size_t off, int n, MPI_Request* r) {
      detail::mpi_check(MPI_Isend(data.data() + off, n, MPI_BYTE, peer, tag, comm_, r), "MPI_Isend", rank_);
    });
  }
  /// MPI_Irecv of exactly data.size() bytes with `tag` from any rank
  /// (MPI_ANY_SOURCE; any_source_transport): the request's source() names
  /// the sender once complete. Messages above 1 GiB cannot be received from
  /// any rank (their pieces could match different senders).
  /// @throws dpkit::invalid_argument above 1 GiB; dpkit::error on MPI failure.
  mpi_request irecv_any(std::span<std::byte> data, int tag) {
    if (data.size() > detail::mpi_max_message)
      throw invalid_argument("mpi::irecv_any: rank " + std::to_string(rank_) + ": " + std::to_string(data.size()) +
                             " bytes: a receive from any rank takes at most 1 GiB");
    MPI_Request r = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Irecv(data.data(), static_cast<int>(data.size()), MPI_BYTE, MPI_ANY_SOURCE, tag, comm_, &r),
                      "MPI_Irecv", rank_);
    return mpi_request(r, {}, rank_, MPI_ANY_SOURCE, tag, false, sh_.get(), data.size());
  }
  /// MPI_Irecv of exactly data.size() bytes from `peer` with `tag`.
  /// @throws dpkit::invalid_argument if peer is out of range; dpkit::error on MPI failure.
  mpi_request irecv(std::span<std::byte> data, int peer, int tag) {
    check_peer(peer, "irecv");
    return start(data.size(), peer, tag, false, [&](std::size_t off, int n, MPI_Request* r) {
      detail::mpi_check(MPI_Irecv(data.data() + off, n, MPI_BYTE, peer, tag, comm_, r), "MPI_Irecv", rank_);
    });
  }

  /// The communication thread running *_async collectives in order.
  progress_thread& progress() { return *progress_; }
  /// Collective health (checked_transport): sequence numbers, current
  /// fingerprint, first failure.
  detail::comm_health& health() noexcept { return sh_->health; }
  /// Called by every collective before anything else (collective_scope):
  /// - a transport whose process has called MPI_Finalize cannot be used (MPI
  ///   may not be called any more): communicator_error;
  /// - a peer's fault notice that arrived while this rank was between
  ///   collectives fails the transport now, before this call posts a single
  ///   receive, so its message then names the failure (health's check:
  ///   peer_error) and, above all, this rank never matches a send the failed
  ///   peer abandoned: that send would otherwise go on reading the peer's
  ///   buffer, which its caller may have freed (a segfault in MPI's
  ///   progress). On one node it costs one atomic load (the segment's abort
  ///   word, which a failing rank sets with its notices), elsewhere one
  ///   MPI_Improbe.
  /// @throws dpkit::communicator_error naming the operation and the rank;
  ///         dpkit::peer_error or dpkit::mismatch_error (a peer's notice).
  void check_usable(const char* op_name) {
    int finalized = detail::mpi_finalizing().load(std::memory_order_acquire) ? 1 : 0;
    if (!detail::mpi_watch_finalize()) MPI_Finalized(&finalized);
    if (finalized)
      throw communicator_error(std::string(op_name) + ": rank " + std::to_string(rank_) +
                               ": MPI_Finalize was called in this process; the transport cannot be used");
    if (sh_->health.failed() || (shm_ && !shm_->aborted())) return;
    detail::mpi_notice n;
    if (sh_->take_notice(MPI_ANY_SOURCE, n)) {
      // as a wait would: a mismatch a peer found in a call this rank has
      // finished (a broadcast root that sent and went on) names both sides
      const std::string at = std::string(op_name) + ": rank " + std::to_string(rank_) + ": ";
      // this rank posts nothing more: peers waiting on their sends to it stop
      struct settle_on_exit {
        mpi& m;
        ~settle_on_exit() { m.settle(detail::mpi_settle_grace); }
      } settle{*this};
      try {
        sh_->on_notice(n);
      } catch (const mismatch_error& e) {
        sh_->health.observed();
        throw mismatch_error(at + e.what());
      } catch (const peer_error& e) {
        sh_->health.observed();
        throw peer_error(at + e.what());
      }
    } else if (shm_) // the notice itself may still sit in the failed rank's send queue
      sh_->health.fail("a peer's collective failed (the node's abort word is set; its notice has not arrived yet)");
  }
  /// Fails this transport and sends a fault notice to every other rank, whose
  /// waits then throw peer_error within about a millisecond (checked_transport).
  void report_failure(const std::string& what) { sh_->fail_and_notify(what, 1); }
  /// Called when a failed collective ends (collective_scope, as the
  /// exception leaves it; check_usable, when a peer's notice fails this
  /// transport), so that the caller gets its buffers back with nothing in
  /// MPI still holding them. The collective's requests were dropped by then:
  /// unmatched receives cancelled; what MPI could not drop (sends, since MPI
  /// cannot cancel a send, and receives already matched) is in the
  /// transport's abandoned list. In turn:
  /// 1. its abandoned receives are progressed until each has completed or
  ///    its sender's process has ended (a matched transfer finishes while
  ///    the live sender progresses, which it does in its own settle);
  /// 2. it tells every other rank it has settled: no receive of its can
  ///    take data any more (it posts none on a failed transport);
  /// 3. its abandoned sends are progressed until each has completed, or its
  ///    receiver has settled (then an incomplete send was never matched and
  ///    never will be: nobody reads its buffer) or ended.
  /// Without this, a live peer that matched a send of this rank after the
  /// caller had freed the buffer read unmapped memory, and Open MPI's
  /// fallback then made this rank send from it (a segfault in
  /// mca_pml_ob1_send_request_schedule_once), or a matched receive wrote
  /// into memory the caller had freed. Bounded: at most min(`timeout`,
  /// detail::mpi_settle_grace); a peer that neither answers nor ends in that
  /// time (one that has not reached the collective: its next call refuses
  /// before it posts a receive, check_usable) leaves its requests in the
  /// abandoned list, which a failed transport never frees. Never throws.
  void settle(std::chrono::milliseconds timeout) noexcept {
    try {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized || detail::mpi_finalizing().load(std::memory_order_acquire)) return;
      detail::mpi_shared& s = *sh_;
      const std::lock_guard lk(s.abandon_mu);
      const auto until = std::chrono::steady_clock::now() + std::min(timeout, detail::mpi_settle_grace);
      // true when request a needs no more waiting (complete: removed)
      const auto resolved = [&](detail::mpi_abandoned& a) {
        if (a.request == MPI_REQUEST_NULL) return true;
        int done = 0;
        MPI_Test(&a.request, &done, MPI_STATUS_IGNORE);
        if (done) return true;
        if (s.peer_gone(a.peer)) return true;
        return a.is_send && s.settled_from[static_cast<std::size_t>(a.peer)] != 0;
      };
      const auto drain = [&](bool sends) {
        for (unsigned spins = 0;; ++spins) {
          s.take_settled();
          bool all = true;
          for (auto& a : s.held)
            if (a.is_send == sends && !resolved(a)) all = false;
          if (all || std::chrono::steady_clock::now() >= until) return;
          if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      };
      drain(false);
      if (!s.settled_sent) {
        s.settled_sent = true;
        for (int p = 0; p < size_; ++p) {
          if (p == rank_) continue;
          MPI_Request r = MPI_REQUEST_NULL;
          if (MPI_Isend(&s.settle_byte, 1, MPI_CHAR, p, detail::settle_tag, comm_, &r) == MPI_SUCCESS)
            s.settle_sends.push_back(r);
        }
      }
      drain(true);
      std::erase_if(s.held, [](const detail::mpi_abandoned& a) { return a.request == MPI_REQUEST_NULL; });
    } catch (...) {
    }
  }
  /// The most bytes of staging a native collective with a deadline uses
  /// (its input and output regions; default detail::mpi_stage_max, 64 MiB):
  /// larger calls run as several MPI collectives of a piece each. A piece
  /// holds at least one element per rank, so a limit below that is exceeded.
  std::size_t stage_limit() const noexcept { return sh_->stage_limit; }
  /// Sets stage_limit() (between collectives, on every rank alike: the
  /// pieces are MPI's calls, and ranks that cut them differently would pair
  /// calls of different counts, which the default level's check turns into
  /// mismatch_error). The staging already held is kept until a larger piece
  /// needs more.
  /// @throws dpkit::invalid_argument naming the value and the rank if bytes is 0.
  void set_stage_limit(std::size_t bytes) {
    if (bytes == 0)
      throw invalid_argument("mpi::set_stage_limit: rank " + std::to_string(rank_) + ": the limit must be > 0 bytes");
    sh_->stage_limit = bytes;
  }
  /// Bytes of staging this transport holds now (0 before its first native
  /// collective with a deadline).
  std::size_t staging_bytes() const noexcept { return sh_->stage_bytes; }
  /// Requests MPI still holds for failed collectives (sends never matched by
  /// a peer that settled, transfers with a rank that ended, or a peer that
  /// did not settle in time): what a failed transport leaves to MPI.
  std::size_t abandoned_requests() {
    const std::lock_guard lk(sh_->abandon_mu);
    return sh_->held.size();
  }
  /// How the next native collective runs (set by dpkit's dispatchers): its
  /// deadline and fingerprint, non-blocking or blocking, with or without the
  /// fingerprint agreement step. Calling native_* directly without it runs
  /// the blocking MPI collective, as before.
  /// At checking level 1 (with the deadline: native_deadline) the native
  /// call then first checks that every rank runs the same call (a count, op,
  /// type or root difference is mismatch_error on every rank instead of Open
  /// MPI aborting the job or returning disagreeing data): inside the
  /// all-reduce itself for all-reduces of at most fused_check_bytes, with one
  /// small collective of a fixed size before MPI's otherwise. The blocking
  /// mode (native_deadline = false, how benchmarks time MPI itself) runs
  /// MPI's call as it is.
  void begin_native(const detail::native_call& c) {
    sh_->call = c;
    sh_->check_pending = c.fp.valid && c.check == 1 && c.with_deadline;
  }
  /// All-reduces of at most this many bytes carry the default level's check
  /// in the reduction itself (one MPI_Iallreduce of a fixed
  /// 32 + fused_check_bytes bytes with dpkit's MPI_Op), so it costs no extra
  /// collective where an extra one would double the time.
  static constexpr std::size_t fused_check_bytes = sizeof(detail::mpi_fused_block::payload);
  /// The agreement step of collective_options::check: every rank all-gathers
  /// its fingerprint (MPI_Iallgather waited against `due`), and any
  /// difference throws mismatch_error on every rank, naming both sides.
  void agree(const detail::fingerprint& fp, deadline due) {
    sh_->call = detail::native_call{due, fp, true};
    struct reset_call {
      detail::mpi_shared& s;
      ~reset_call() { s.call = {}; }
    } reset{*sh_};
    agree_now(fp);
  }
  /// Host scratch reused by this transport's collectives (internal).
  detail::scratch_arena& scratch() { return *arena_; }
  /// This rank's view of the node's shared segment (shared_memory_transport):
  /// a POSIX shared-memory object every rank maps (created by the
  /// constructor when every rank of the communicator is on one node, see
  /// create_shm); nullptr otherwise (or DPKIT_SHM_BYTES=0).
  detail::shm_segment* shm() noexcept { return shm_.get(); }
  /// Takes a pending fault notice from another rank (throws peer_error or
  /// mismatch_error), looks for a message of another collective at the
  /// sequence number of `tag` from any rank (mismatch_error: a shm
  /// collective receives no messages), or throws communicator_error if this
  /// transport failed (shared_memory_transport).
  void shm_poll(int /*peer*/, int tag) {
    sh_->poll(-1, tag);
    sh_->health.check("shm", rank_);
  }

  // ---- native collectives (algorithm::native) ----
  //
  // Two modes (begin_native): with a deadline (dpkit's default), MPI's
  // non-blocking collective runs on this transport's staging area (stage):
  // the caller's data is copied in, the result copied out, so an abandoned
  // call never leaves MPI holding the caller's memory; without one (how
  // benchmarks time MPI itself, and direct calls), MPI's blocking call runs
  // on the caller's buffers (zero-copy).

  /// MPI_Allreduce of `count` elements (in == out: MPI_IN_PLACE). avg is
  /// MPI_SUM followed by a local division; f16/bf16 use dpkit's own MPI_Op
  /// (f32 arithmetic) on MPI_UINT16_T. Counts above INT_MAX are split; with
  /// a deadline, pieces of at most stage_limit() bytes of staging.
  void native_allreduce(const void* in, void* out, std::size_t count, element_type t, reduce_op op) {
    const std::size_t es = element_size(t);
    if (sh_->check_pending && count * es <= fused_check_bytes) {
      sh_->check_pending = false;
      fused_allreduce(sh_->call.fp, in, out, count, t, op);
      return;
    }
    run_pending_check();
    const auto* i = static_cast<const std::byte*>(in);
    auto* o = static_cast<std::byte*>(out);
    if (staged()) {
      for_stage_pieces(count, 2 * es, [&](std::size_t off, int n) {
        const std::size_t nb = static_cast<std::size_t>(n) * es;
        const auto region = stage(nb, nb);
        std::byte* const si = region.first;  // not a structured binding: clang 14 cannot capture one
        std::byte* const so = region.second;
        copy_bytes(si, i + off * es, nb);
        nonblocking("MPI_Allreduce",
                    [&](MPI_Request* r) { return MPI_Iallreduce(si, so, n, datatype(t), mpi_op(t, op), comm_, r); });
        copy_bytes(o + off * es, so, nb);
      });
    } else {
      for_counts(count, [&](std::size_t off, int n) {
        const void* snd = i == o ? MPI_IN_PLACE : static_cast<const void*>(i + off * es);
        detail::mpi_check(MPI_Allreduce(snd, o + off * es, n, datatype(t), mpi_op(t, op), comm_), "MPI_Allreduce", rank_);
      });
    }
    if (op == reduce_op::avg) finish_avg(out, count, t);
  }
  /// MPI_Reduce_scatter_block: `count` = elements per rank of the output.
  /// In place follows NCCL: out == in + rank * count (the result lands in
  /// this rank's chunk; MPI_IN_PLACE puts it at the front, so it is moved
  /// there and the front chunk is left unspecified).
  /// @throws dpkit::invalid_argument if count > INT_MAX.
  void native_reduce_scatter(const void* in, void* out, std::size_t count, element_type t, reduce_op op) {
    run_pending_check();
    check_int(count, "MPI_Reduce_scatter_block");
    const std::size_t es = element_size(t);
    const auto* i = static_cast<const std::byte*>(in);
    const auto ranks = static_cast<std::size_t>(size_);
    if (staged()) {
      // each piece: elements [off, off + n) of every rank's block, gathered
      // into the input region as size_ blocks of n
      for_stage_pieces(count, es * (ranks + 1), [&](std::size_t off, int n) {
        const std::size_t nb = static_cast<std::size_t>(n) * es;
        const auto region = stage(nb * ranks, nb);
        std::byte* const si = region.first;  // not a structured binding: clang 14 cannot capture one
        std::byte* const so = region.second;
        for (std::size_t p = 0; p < ranks; ++p) copy_bytes(si + p * nb, i + (p * count + off) * es, nb);
        nonblocking("MPI_Reduce_scatter_block", [&](MPI_Request* r) {
          return MPI_Ireduce_scatter_block(si, so, n, datatype(t), mpi_op(t, op), comm_, r);
        });
        copy_bytes(static_cast<std::byte*>(out) + off * es, so, nb);
      });
    } else {
      const auto* own = i + static_cast<std::size_t>(rank_) * count * es;
      const int c = static_cast<int>(count);
      if (own == out) {
        auto* buf = const_cast<void*>(in);
        detail::mpi_check(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, c, datatype(t), mpi_op(t, op), comm_),
                          "MPI_Reduce_scatter_block", rank_);
        if (buf != out && count) std::memmove(out, buf, count * es);
      } else {
        detail::mpi_check(MPI_Reduce_scatter_block(in, out, c, datatype(t), mpi_op(t, op), comm_),
                          "MPI_Reduce_scatter_block", rank_);
      }
    }
    if (op == reduce_op::avg) finish_avg(out, count, t);
  }
  /// MPI_Allgather: `count` = elements per rank of the input; in place when
  /// in == out + rank * count (NCCL's convention).
  /// @throws dpkit::invalid_argument if count > INT_MAX.
  void native_allgather(const void* in, void* out, std::size_t count, element_type t) {
    run_pending_check();
    check_int(count, "MPI_Allgather");
    const std::size_t es = element_size(t);
    auto* o = static_cast<std::byte*>(out);
    const auto ranks = static_cast<std::size_t>(size_);
    if (staged()) {
      // each piece: elements [off, off + n) of every rank's block, as
      // size_ blocks of n in the output region
      for_stage_pieces(count, es * (ranks + 1), [&](std::size_t off, int n) {
        const std::size_t nb = static_cast<std::size_t>(n) * es;
        const auto region = stage(nb, nb * ranks);
        std::byte* const si = region.first;  // not a structured binding: clang 14 cannot capture one
        std::byte* const so = region.second;
        copy_bytes(si, static_cast<const std::byte*>(in) + off * es, nb);
        nonblocking("MPI_Allgather",
                    [&](MPI_Request* r) { return MPI_Iallgather(si, n, datatype(t), so, n, datatype(t), comm_, r); });
        for (std::size_t p = 0; p < ranks; ++p) copy_bytes(o + (p * count + off) * es, so + p * nb, nb);
      });
      return;
    }
    const void* snd = in == o + static_cast<std::size_t>(rank_) * count * es ? MPI_IN_PLACE : in;
    const int c = static_cast<int>(count);
    detail::mpi_check(MPI_Allgather(snd, c, datatype(t), out, c, datatype(t), comm_), "MPI_Allgather", rank_);
  }
  /// MPI_Bcast from root (copies in -> out on root first when they differ).
  void native_broadcast(const void* in, void* out, std::size_t count, element_type t, int root) {
    run_pending_check();
    const std::size_t es = element_size(t);
    auto* o = static_cast<std::byte*>(out);
    if (staged()) {
      for_stage_pieces(count, es, [&](std::size_t off, int n) {
        const std::size_t nb = static_cast<std::size_t>(n) * es;
        std::byte* st = stage(nb, 0).first;
        if (rank_ == root) copy_bytes(st, static_cast<const std::byte*>(in) + off * es, nb);
        nonblocking("MPI_Bcast", [&](MPI_Request* r) { return MPI_Ibcast(st, n, datatype(t), root, comm_, r); });
        copy_bytes(o + off * es, st, nb);
      });
      return;
    }
    if (rank_ == root && in != out && count) std::memcpy(out, in, count * es);
    for_counts(count, [&](std::size_t off, int n) {
      detail::mpi_check(MPI_Bcast(o + off * es, n, datatype(t), root, comm_), "MPI_Bcast", rank_);
    });
  }
  /// MPI_Reduce to root (out is used on root only; counts above INT_MAX are split).
  void native_reduce(const void* in, void* out, std::size_t count, element_type t, reduce_op op, int root) {
    run_pending_check();
    const std::size_t es = element_size(t);
    const auto* i = static_cast<const std::byte*>(in);
    if (staged()) {
      for_stage_pieces(count, 2 * es, [&](std::size_t off, int n) {
        const std::size_t nb = static_cast<std::size_t>(n) * es;
        const auto region = stage(nb, rank_ == root ? nb : 0);
        std::byte* const si = region.first;  // not a structured binding: clang 14 cannot capture one
        std::byte* const so = region.second;
        copy_bytes(si, i + off * es, nb);
        nonblocking("MPI_Reduce", [&](MPI_Request* r) {
          return MPI_Ireduce(si, rank_ == root ? so : nullptr, n, datatype(t), mpi_op(t, op), root, comm_, r);
        });
        if (rank_ == root) copy_bytes(static_cast<std::byte*>(out) + off * es, so, nb);
      });
    } else {
      for_counts(count, [&](std::size_t off, int n) {
        const auto* ip = i + off * es;
        auto* op_out = rank_ == root ? static_cast<std::byte*>(out) + off * es : nullptr;
        const void* send = (rank_ == root && ip == op_out) ? MPI_IN_PLACE : static_cast<const void*>(ip);
        detail::mpi_check(MPI_Reduce(send, op_out, n, datatype(t), mpi_op(t, op), root, comm_), "MPI_Reduce", rank_);
      });
    }
    if (op == reduce_op::avg && rank_ == root) finish_avg(out, count, t);
  }
  /// MPI_Barrier.
  void native_barrier() {
    run_pending_check();
    if (staged()) nonblocking("MPI_Barrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
    else detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier", rank_);
  }

private:
  // Whether the destructor may free what MPI may still use for this
  // transport (the destructor's comment says when not): false after a
  // failure, its own or its parent's, and while an exception unwinds (then
  // the peers are told first).
  bool healthy_teardown() noexcept {
    if (sh_->parent) return !sh_->parent->abandoned && !sh_->health.failed();
    if (std::uncaught_exceptions() > 0) {
      try {
        sh_->fail_and_notify("rank " + std::to_string(rank_) +
                                 " left the transport: an exception unwound through its destructor",
                             1);
      } catch (...) {
      }
      return false;
    }
    return !sh_->health.failed();
  }
  // A transport on a communicator of its own made by split() or for a
  // hierarchy (`parent`: the transport whose node or cross-node part it is),
  // with its layout given.
  mpi(MPI_Comm owned, node_layout layout, detail::mpi_shared* parent) {
    open(owned, false);
    owned_ = true;
    detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", rank_);
    topo_ = node_topology(std::move(layout), rank_);
    sh_->parent = parent;
    finish_setup();
  }
  void open(MPI_Comm comm, bool duplicate) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) throw error("dpkit::mpi: MPI is not initialized (call MPI_Init_thread first)");
    detail::mpi_watch_finalize(); // before any collective's check_usable
    if (duplicate) {
      detail::mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", -1);
      owned_ = true;
    } else {
      comm_ = comm;
    }
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", -1);
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", rank_);
    // MPI errors on dpkit's communicator become dpkit::error, not an abort.
    if (owned_) detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", rank_);
    sh_->comm = comm_;
    sh_->rank = rank_;
    sh_->size = size_;
    sh_->settled_from.assign(static_cast<std::size_t>(size_), 0);
    // MPI_TAG_UB is cached on MPI_COMM_WORLD (and copied by MPI_Comm_dup),
    // not on the communicators MPI_Comm_split makes: ask the world.
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    sh_->health.tags_enabled = flag && ub && *ub >= 0x7fffffff;
  }
  // Every rank's node: the lowest rank of its MPI_COMM_TYPE_SHARED group
  // (one host), subdivided by DPKIT_RANKS_PER_NODE; all-gathered.
  void discover_topology() {
    MPI_Comm node = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                      "MPI_Comm_split_type", rank_);
    int host_leader = rank_, local = 0;
    MPI_Comm_rank(node, &local);
    detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, &host_leader, 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce", rank_);
    MPI_Comm_free(&node);
    const int per_node = detail::ranks_per_node_from_env();
    const long long label = static_cast<long long>(host_leader) * (static_cast<long long>(size_) + 1) +
                            (per_node > 0 ? local / per_node : 0);
    // the fragment setting travels with the label: a bad or disagreeing one
    // fails every rank here, not as mismatched messages later (-1: this
    // rank's setting is malformed)
    std::string bad_fragment;
    long long fragment = -1;
    try {
      fragment = static_cast<long long>(detail::inter_fragment_from_env());
    } catch (const std::exception& e) {
      bad_fragment = e.what();
    }
    const long long mine[2] = {label, fragment};
    std::vector<long long> all(2 * static_cast<std::size_t>(size_));
    detail::mpi_check(MPI_Allgather(mine, 2, MPI_LONG_LONG, all.data(), 2, MPI_LONG_LONG, comm_), "MPI_Allgather",
                      rank_);
    std::vector<long long> labels(static_cast<std::size_t>(size_));
    std::string what = bad_fragment.empty() ? "" : "dpkit::mpi: rank " + std::to_string(rank_) + ": " + bad_fragment;
    for (int p = 0; p < size_; ++p) {
      labels[static_cast<std::size_t>(p)] = all[2 * static_cast<std::size_t>(p)];
      const long long f = all[2 * static_cast<std::size_t>(p) + 1];
      if (f == fragment || !what.empty()) continue;
      what = f < 0 ? "dpkit::mpi: rank " + std::to_string(p) +
                         " has a malformed fragment setting (DPKIT_MPI_INTER_FRAGMENT or the tuning file's "
                         "'fragment inter'); rank " + std::to_string(rank_) + " uses " + std::to_string(fragment) +
                         " bytes"
                   : "dpkit::mpi: the ranks disagree on the fragment size of messages between nodes "
                     "(DPKIT_MPI_INTER_FRAGMENT or the tuning file's 'fragment inter'): rank " +
                         std::to_string(rank_) + " uses " + std::to_string(fragment) + " bytes, rank " +
                         std::to_string(p) + " " + std::to_string(f) + " bytes; every rank must use the same";
    }
    if (!what.empty()) {
      if (owned_) MPI_Comm_free(&comm_);
      owned_ = false;
      throw invalid_argument(what);
    }
    inter_fragment_ = static_cast<std::size_t>(fragment);
    topo_ = node_topology(node_layout::canonicalize(labels), rank_);
  }
  // Half-precision ops, the shared segment (one node) or the hierarchy's
  // sub-transports (several nodes).
  void finish_setup() {
    create_half_ops();
    if (topo_.nodes() == 1) create_shm(detail::shm_bytes_from_env(4u << 20));
    if (!topo_.hierarchical()) return;
    MPI_Comm node = MPI_COMM_NULL, cross = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split(comm_, topo_.node(), rank_, &node), "MPI_Comm_split", rank_);
    node_.reset(new mpi(node, node_layout::single(topo_.local_size()), sh_.get()));
    node_->inter_fragment_ = inter_fragment_;
    const int color = topo_.uniform() ? topo_.local_rank() : topo_.local_rank() == 0 ? 0 : MPI_UNDEFINED;
    // ranked by node, so cross rank k is on node k
    detail::mpi_check(MPI_Comm_split(comm_, color, topo_.node(), &cross), "MPI_Comm_split", rank_);
    if (cross != MPI_COMM_NULL) {
      cross_.reset(new mpi(cross, node_layout::blocks(topo_.nodes(), 1), sh_.get()));
      cross_->inter_fragment_ = inter_fragment_;
    }
  }
  // The shared segment: DPKIT_SHM_BYTES (default 4 MiB) per buffer, two
  // buffers and a control line per rank, each rank's region on pages of its
  // own (the owner touches them first), in one POSIX shared-memory object
  // (shm_mapping.hpp) that rank 0 creates, every rank maps, and rank 0
  // unlinks once all have it: nothing is left in /dev/shm after a kill, and
  // the teardown (munmap) never waits for a peer, where an MPI-3 shared
  // window's MPI_Win_free, and MPI_Finalize freeing it, wait for every rank,
  // a dead one too. Collective over comm_ (whose ranks are on one node, by
  // the topology), with every rank's outcome agreed, so a rank that cannot
  // map it fails them all with its reason. Not created when the ranks span
  // several nodes (the refinement is then unavailable at run time:
  // node_transport() has one).
  void create_shm(std::size_t slot_bytes) {
    if (slot_bytes == 0) return;
    const std::size_t stride = (detail::shm_region_bytes(slot_bytes) + 4095) / 4096 * 4096;
    const std::size_t total = stride * static_cast<std::size_t>(size_);
    struct {
      char name[120];
      int ok;
    } hdr{};
    std::string why;
    detail::shm_mapping map;
    if (rank_ == 0) {
      try {
        const std::string name = detail::shm_mapping::unique_name("mpi");
        map = detail::shm_mapping::create(name, total);
        std::snprintf(hdr.name, sizeof hdr.name, "%s", name.c_str());
        hdr.ok = 1;
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    detail::mpi_check(MPI_Bcast(&hdr, sizeof hdr, MPI_BYTE, 0, comm_), "MPI_Bcast (shm segment)", rank_);
    if (rank_ != 0 && hdr.ok) {
      try {
        map = detail::shm_mapping::open(hdr.name, total);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    // the lowest rank that failed, or size_ when all mapped it
    int first_bad = why.empty() ? size_ : rank_;
    detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce (shm segment)",
                      rank_);
    if (rank_ == 0 && hdr.ok) detail::shm_mapping::unlink(hdr.name);
    if (first_bad < size_)
      throw error("dpkit::mpi: rank " + std::to_string(rank_) + ": the node's shared segment (" + std::to_string(total) +
                  " bytes) could not be set up: " +
                  (why.empty() ? "rank " + std::to_string(first_bad) + " failed (its error names the reason)" : why));
    std::vector<std::byte*> bases(static_cast<std::size_t>(size_));
    for (int p = 0; p < size_; ++p) bases[static_cast<std::size_t>(p)] = map.data() + static_cast<std::size_t>(p) * stride;
    auto* mine = new (bases[static_cast<std::size_t>(rank_)]) detail::shm_control{}; // before any peer reads it
    mine->pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
    shm_ = std::make_unique<detail::shm_segment>(rank_, std::move(bases), slot_bytes);
    shm_->prefault(); // no collective runs on it before the barrier below
    shm_map_ = std::move(map);
    sh_->shm = shm_.get();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier", rank_);
  }

  // Whether the native collective runs with a deadline (begin_native), and
  // so non-blocking on the staging area, or blocking on the caller's buffers.
  bool staged() const noexcept { return sh_->call.with_deadline && sh_->call.fp.valid; }
  // One non-blocking native collective, waited against the call's deadline.
  template <class NB>
  void nonblocking(const char* name, NB&& post) {
    MPI_Request r = MPI_REQUEST_NULL;
    detail::mpi_check(post(&r), name, rank_);
    sh_->wait_native(r, name);
  }
  // The staging area as an input region of `in_bytes` and an output region
  // of `out_bytes` after it (MPI's collectives out of place: Open MPI's
  // non-blocking all-reduce in place ran 2.2-2.7x slower from 1 MiB here,
  // benchmarks/results/2026-12-02-native-staging.md). Grown, never shrunk,
  // to at most stage_limit() but for a piece of a single element
  // per rank. It is only replaced between collectives: a failed transport,
  // whose abandoned call may still use it, runs no further collective.
  std::pair<std::byte*, std::byte*> stage(std::size_t in_bytes, std::size_t out_bytes) {
    const std::size_t at = (in_bytes + 63) & ~std::size_t{63};
    const std::size_t bytes = at + out_bytes;
    if (bytes > sh_->stage_bytes) {
      sh_->stage.reset();
      sh_->stage_bytes = 0;
      const std::size_t want = std::max(bytes, std::min(2 * bytes, sh_->stage_limit));
      sh_->stage.reset(new std::byte[want]);
      sh_->stage_bytes = want;
    }
    return {sh_->stage.get(), sh_->stage.get() + at};
  }
  // Calls f(offset, n) for pieces of `count` elements, each needing at most
  // stage_limit() bytes of staging at `bytes_per_element` (both
  // regions; at least one element) and at most INT_MAX elements; no call
  // for count 0.
  template <class F>
  void for_stage_pieces(std::size_t count, std::size_t bytes_per_element, F&& f) const {
    const std::size_t step = std::clamp<std::size_t>(sh_->stage_limit / std::max<std::size_t>(bytes_per_element, 1), 1,
                                                     static_cast<std::size_t>(INT_MAX));
    for (std::size_t off = 0; off < count; off += step) f(off, static_cast<int>(std::min(step, count - off)));
  }
  static void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
    if (n && dst != src) std::memcpy(dst, src, n);
  }
  // The check of the default level before a native collective: MPI matches
  // collectives by order alone, and ranks that pass different counts make
  // Open MPI's collectives abort the job (a double free in libnbc), different
  // ops, types or roots return disagreeing data. One MPI_Iallreduce of a
  // fixed size (one fused_block, so it is well-formed whatever the ranks
  // pass), the max over (h, ~h) with h the fingerprint's hash and sequence
  // number: every rank gets (h, ~h) back iff every rank runs the same call.
  // On a difference, which every rank sees in the same result, they
  // all-gather their fingerprints to name both sides (mismatch_error on
  // every rank).
  void check_same_call(const detail::fingerprint& fp) { fused_allreduce(fp, nullptr, nullptr, 0, element_type::u8, reduce_op::sum); }
  void run_pending_check() {
    if (!sh_->check_pending) return;
    sh_->check_pending = false;
    check_same_call(sh_->call.fp);
  }
  // The (h, ~h) pair of check_same_call.
  static std::uint64_t call_hash(const detail::fingerprint& fp) noexcept {
    return static_cast<std::uint64_t>(fp.hash()) << 32 ^ (fp.seq & 0xffffffffu) ^
           static_cast<std::uint64_t>(static_cast<std::uint32_t>(fp.stream)) * 0x9E3779B97F4A7C15ull;
  }
  using fused_block = detail::mpi_fused_block;
  // dpkit's MPI_Op over fused blocks: max of the pairs; where the blocks
  // describe the same elements, the payloads reduced with the call's op in
  // f32 arithmetic for f16/bf16 as everywhere in dpkit, else `differ` set.
  // MPI hands the op whole blocks: a block is mpi_fused_words uint64
  // elements of one 64-byte message, which Open MPI and MPICH reduce in one
  // piece (they segment only far larger messages). Should an MPI ever split
  // one, the pieces are not combined and the call fails on this rank
  // (fused_split), never a silently wrong sum.
  static void fused_fn(void* in, void* inout, int* len, MPI_Datatype*) {
    if (*len % detail::mpi_fused_words != 0) {
      fused_split().store(true, std::memory_order_relaxed);
      return;
    }
    for (int i = 0; i < *len / detail::mpi_fused_words; ++i)
      combine(static_cast<const fused_block*>(in)[i], static_cast<fused_block*>(inout)[i]);
  }
  // Set by fused_fn when MPI passed part of a block (process-wide: the op
  // is a plain function).
  static std::atomic<bool>& fused_split() noexcept {
    static std::atomic<bool> split{false};
    return split;
  }
  static void combine(const fused_block& a, fused_block& b) noexcept {
    b.differ |= a.differ | (a.type != b.type || a.op != b.op || a.count != b.count ? 1u : 0u);
    b.h = std::max(a.h, b.h);
    b.nh = std::max(a.nh, b.nh);
    if (b.differ || b.count == 0 || b.type > static_cast<std::uint32_t>(element_type::u64) ||
        b.count * element_size(static_cast<element_type>(b.type)) > fused_check_bytes)
      return;
    visit_element_type(static_cast<element_type>(b.type), [&](auto v) {
      using T = decltype(v);
      T* dst = reinterpret_cast<T*>(b.payload);
      reduce_host(dst, static_cast<const T*>(dst), reinterpret_cast<const T*>(a.payload), b.count,
                  static_cast<reduce_op>(b.op));
    });
  }
  // The default level's check as one MPI_Iallreduce of one fused_block
  // (the same datatype and op for every call, so it is well-formed whatever
  // the ranks pass), with `count` elements of payload reduced in it (0: the
  // check alone, before MPI's own collective).
  void fused_allreduce(const detail::fingerprint& fp, const void* in, void* out, std::size_t count, element_type t,
                       reduce_op op) {
    const std::uint64_t h = call_hash(fp);
    // Out of place: Open MPI's non-blocking all-reduce in place takes a
    // slower schedule (about 0.1 us of the 0.7 us at 8 B here). The bytes of
    // the payload past `count` elements are never read (combine reduces
    // `count` elements).
    fused_block& mine = sh_->check_block;
    fused_block& blk = sh_->check_result;
    mine.h = h;
    mine.nh = ~h;
    mine.type = static_cast<std::uint32_t>(t);
    mine.op = static_cast<std::uint32_t>(op == reduce_op::avg ? reduce_op::sum : op);
    mine.count = static_cast<std::uint32_t>(count);
    mine.differ = 0;
    const std::size_t bytes = count * element_size(t);
    if (bytes) std::memcpy(mine.payload, in, bytes);
    MPI_Request r = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Iallreduce(&mine, &blk, detail::mpi_fused_words, MPI_UINT64_T, fused_op_, comm_, &r),
                      "MPI_Allreduce", rank_);
    sh_->wait_native(r, "MPI_Allreduce");
    if (fused_split().load(std::memory_order_relaxed))
      throw error("mpi: rank " + std::to_string(rank_) +
                  ": MPI reduced part of the 64-byte check block; this MPI cannot run the default-level check "
                  "of native collectives (DPKIT_CHECK=0 or 2)");
    if (blk.h != h || blk.nh != ~h || blk.differ) {
      agree_now(fp);
      const std::string what = "collective mismatch: rank " + std::to_string(rank_) + " runs " + fp.str() +
                               "; another rank runs another call at this sequence number";
      sh_->health.fail(what);
      throw mismatch_error(what);
    }
    if (bytes) std::memcpy(out, blk.payload, bytes);
    if (op == reduce_op::avg) finish_avg(out, count, t);
  }
  // All ranks all-gather their fingerprints; any difference is a mismatch
  // that every rank sees and names.
  void agree_now(const detail::fingerprint& fp) {
    std::vector<detail::fingerprint>& all = sh_->agree_all;
    all.assign(static_cast<std::size_t>(size_) + 1, detail::fingerprint{});
    all.back() = fp; // the send buffer too (a sent fingerprint must outlive an abandoned request)
    MPI_Request r = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Iallgather(&all.back(), sizeof fp, MPI_BYTE, all.data(), sizeof fp, MPI_BYTE, comm_, &r),
                      "MPI_Iallgather (agreement)", rank_);
    sh_->wait_native(r, "MPI_Iallgather (agreement)");
    for (int p = 0; p < size_; ++p) {
      const auto& f = all[static_cast<std::size_t>(p)];
      if (f.seq != fp.seq || !f.same_call(fp)) {
        const std::string what = detail::mismatch_text(rank_, fp, p, f);
        sh_->health.fail(what);
        throw mismatch_error(what);
      }
    }
  }
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_)
      throw invalid_argument(std::string("mpi::") + what + ": rank " + std::to_string(rank_) + ": peer rank " +
                             std::to_string(peer) + " out of range for world size " + std::to_string(size_));
  }
  void check_int(std::size_t count, const char* call) const {
    if (count > static_cast<std::size_t>(INT_MAX))
      throw invalid_argument(std::string(call) + ": rank " + std::to_string(rank_) + ": count " +
                             std::to_string(count) + " exceeds INT_MAX");
  }
  // Posts one request per piece via post(offset, bytes, &request): pieces of
  // at most 1 GiB, or of inter_fragment_ bytes to a rank on another node.
  template <class Post>
  mpi_request start(std::size_t bytes, int peer, int tag, bool is_send, Post&& post) {
    MPI_Request first = MPI_REQUEST_NULL;
    std::vector<MPI_Request> more;
    const std::size_t piece =
        inter_fragment_ > 0 && topo_.node_of(peer) != topo_.node() ? inter_fragment_ : detail::mpi_max_message;
    if (bytes > piece) more.reserve((bytes - 1) / piece);
    for_pieces(bytes, piece, [&](std::size_t off, int n) {
      MPI_Request r;
      post(off, n, &r);
      if (off == 0) first = r;
      else more.push_back(r);
    });
    return mpi_request(first, std::move(more), rank_, peer, tag, is_send, sh_.get(), bytes);
  }
  template <class F>
  static void for_pieces(std::size_t bytes, std::size_t piece, F&& f) {
    if (bytes == 0) {
      f(0, 0);
      return;
    }
    for (std::size_t off = 0; off < bytes; off += piece) f(off, static_cast<int>(std::min(piece, bytes - off)));
  }
  template <class F>
  static void for_counts(std::size_t count, F&& f) {
    const std::size_t step = static_cast<std::size_t>(INT_MAX);
    for (std::size_t off = 0; off < count; off += step) f(off, static_cast<int>(std::min(step, count - off)));
  }
  static MPI_Datatype datatype(element_type t) {
    switch (t) {
    case element_type::f32: return MPI_FLOAT;
    case element_type::f64: return MPI_DOUBLE;
    case element_type::f16: case element_type::bf16: return MPI_UINT16_T;
    case element_type::i8: return MPI_INT8_T;
    case element_type::u8: return MPI_UINT8_T;
    case element_type::i32: return MPI_INT32_T;
    case element_type::u32: return MPI_UINT32_T;
    case element_type::i64: return MPI_INT64_T;
    case element_type::u64: return MPI_UINT64_T;
    }
    return MPI_BYTE;
  }
  MPI_Op mpi_op(element_type t, reduce_op op) const {
    if (t == element_type::f16 || t == element_type::bf16) {
      const std::size_t idx = (t == element_type::bf16 ? 4u : 0u) + static_cast<std::size_t>(op == reduce_op::avg ? reduce_op::sum : op);
      return half_ops_[idx];
    }
    switch (op) {
    case reduce_op::sum: case reduce_op::avg: return MPI_SUM;
    case reduce_op::prod: return MPI_PROD;
    case reduce_op::min: return MPI_MIN;
    case reduce_op::max: return MPI_MAX;
    }
    return MPI_SUM;
  }
  void finish_avg(void* out, std::size_t count, element_type t) const {
    visit_element_type(t, [&](auto v) {
      using T = decltype(v);
      divide_host(static_cast<T*>(out), count, static_cast<std::size_t>(size_));
    });
  }
  template <class H, reduce_op Op>
  static void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
    reduce_host(static_cast<H*>(inout), static_cast<const H*>(inout), static_cast<const H*>(in),
                static_cast<std::size_t>(*len), Op);
  }
  void create_half_ops() {
    detail::mpi_check(MPI_Op_create(&fused_fn, 1, &fused_op_), "MPI_Op_create", rank_);
    half_ops_.fill(MPI_OP_NULL);
    const auto make = [&](std::size_t i, MPI_User_function* f) { detail::mpi_check(MPI_Op_create(f, 1, &half_ops_[i]), "MPI_Op_create", rank_); };
    make(0, &half_op<f16, reduce_op::sum>);
    make(1, &half_op<f16, reduce_op::prod>);
    make(2, &half_op<f16, reduce_op::min>);
    make(3, &half_op<f16, reduce_op::max>);
    make(4, &half_op<bf16, reduce_op::sum>);
    make(5, &half_op<bf16, reduce_op::prod>);
    make(6, &half_op<bf16, reduce_op::min>);
    make(7, &half_op<bf16, reduce_op::max>);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0, size_ = 0;
  std::array<MPI_Op, 8> half_ops_{};
  MPI_Op fused_op_ = MPI_OP_NULL;                // fused_fn (the default level's check inside small all-reduces)
  std::unique_ptr<detail::scratch_arena> arena_ = std::make_unique<detail::scratch_arena>();
  std::unique_ptr<progress_thread> progress_ = std::make_unique<progress_thread>();
  std::unique_ptr<detail::mpi_shared> sh_ = std::make_unique<detail::mpi_shared>();
  std::unique_ptr<detail::shm_segment> shm_;
  detail::shm_mapping shm_map_; // the memory shm_ points into
  node_topology topo_;
  std::size_t inter_fragment_ = 0; // bytes per message to another node (0: whole)
  std::unique_ptr<mpi> node_, cross_; // hierarchy (several nodes)
};

} // namespace dpkit

// -DDPKIT_EXTERN_TEMPLATES: the collective algorithm bodies for this
// transport are compiled in one TU of the program, not here
// (extern_templates.hpp says how and why).
#ifdef DPKIT_EXTERN_TEMPLATES
#include "../extern_templates.hpp"
DPKIT_INSTANTIATE_COLLECTIVES(extern, ::dpkit::mpi)
#endif
