// dpkit internals: what gloo_transport's point-to-point engines share (the
// node's shared memory, shm_p2p.hpp; dpkit's own TCP connections,
// tcp_p2p.hpp): a pending operation and the engine interface its waits
// drive. Not for users.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dpkit::detail {

/// One pending send or receive of a point-to-point engine and its outcome.
struct p2p_op {
  enum state_t { pending, done, failed };
  bool is_send = false;
  int peer = -1;
  int tag = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::size_t moved = 0;  // bytes copied into the ring or socket (send) or out of it (receive)
  bool started = false;   // send: its first fragment (or its request to send) has left
  std::uint64_t id = 0;   // shm send by request to send: its id on this pair
  bool peer_lost = false; // failed because the connection to `peer` closed or broke (set before state)
  const char* medium = "shared memory"; // what describe() names
  std::atomic<int> state{pending};
  std::string error;      // failed: why (set before state)
  /// "rank R: send to rank P (tag T, N bytes, MEDIUM)".
  std::string describe(int rank) const {
    return "rank " + std::to_string(rank) + ": " + (is_send ? "send to" : "receive from") + " rank " +
           std::to_string(peer) + " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) + " bytes, " +
           medium + ")";
  }
};

/// A new pending op of an engine over `medium`.
inline std::shared_ptr<p2p_op> make_p2p_op(bool is_send, std::byte* data, std::size_t bytes, int peer, int tag,
                                           const char* medium) {
  auto op = std::make_shared<p2p_op>();
  op->is_send = is_send;
  op->data = data;
  op->bytes = bytes;
  op->peer = peer;
  op->tag = tag;
  op->medium = medium;
  return op;
}

/// Fails `op` with `why` unless it is no longer pending (its waiter sees
/// the error once it sees the state).
inline void fail_p2p_op(p2p_op& op, const std::string& why, bool peer_lost = false) {
  if (op.state.load(std::memory_order_relaxed) != p2p_op::pending) return;
  op.error = why;
  op.peer_lost = peer_lost;
  op.state.store(p2p_op::failed, std::memory_order_release);
}

/// Why receive `op` of rank `rank` failed when it matched a message of
/// `sent` bytes.
inline std::string p2p_length_text(const p2p_op& op, int rank, std::size_t sent) {
  return op.describe(rank) + " matched a message of " + std::to_string(sent) +
         " bytes: a receive must be exactly as long as its send";
}

/// A point-to-point engine of one rank: MPI's matching (a pair's messages
/// with one tag are received in posting order) over some medium. Nothing
/// moves by itself: progress(), called by every wait and test, moves what
/// can move. Thread-safe.
class p2p_engine {
public:
  virtual ~p2p_engine() = default;
  /// Queues a send of `bytes` at `data` to `peer` with `tag` (the buffer
  /// stays untouched by the caller until the op is no longer pending).
  virtual std::shared_ptr<p2p_op> post_send(const std::byte* data, std::size_t bytes, int peer, int tag) = 0;
  /// Posts a receive of exactly `bytes` into `data` from `peer` with `tag`.
  virtual std::shared_ptr<p2p_op> post_recv(std::byte* data, std::size_t bytes, int peer, int tag) = 0;
  /// Moves what can move; true when anything moved.
  virtual bool progress() = 0;
  /// Sleeps at most `us` microseconds unless something can move now.
  virtual void sleep(long us) = 0;
  /// The tag of an unreceived message from `peer` that belongs to another
  /// collective at the sequence number of `tag` (foreign_tag), or 0.
  virtual int foreign_message(int peer, int tag) = 0;
  /// Moves what can move from every peer, then returns a peer whose oldest
  /// unreceived message with `tag` has arrived (or whose next message,
  /// held back by flow control, has that tag), starting the search at
  /// `from` (round robin over the peers); -1 when none. A receive then
  /// posted from that peer with that tag takes that message (a pair's
  /// messages of one tag match in order), unless another thread posts one
  /// first. What a receive from any rank (MPI_ANY_SOURCE) is built on.
  virtual int probe(int tag, int from) = 0;
  /// Withdraws `op` if still pending (its buffer is never touched
  /// afterwards); true when it was pending.
  virtual bool withdraw(p2p_op& op) = 0;
  /// Fails every pending operation with `why`.
  virtual void fail_all(const std::string& why) = 0;
  /// Closes the engine's connections so that the peers' waits end at once
  /// (the transport failed); nothing moves afterwards. Default: nothing.
  virtual void close() {}
  /// "shared memory" or "TCP".
  virtual const char* medium() const noexcept = 0;
  /// How many times a wait polls progress() before it yields, given the
  /// count a shared-memory wait uses (`shm_spins`), and how many yielding
  /// polls it does before it sleeps (given `shm_yields`). Default: those.
  virtual int spin_polls(int shm_spins) const noexcept { return shm_spins; }
  virtual unsigned yield_polls(unsigned shm_yields) const noexcept { return shm_yields; }
};

} // namespace dpkit::detail
