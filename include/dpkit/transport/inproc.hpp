/// @file inproc.hpp
/// @brief The in-process transport: N ranks as threads of one process,
/// exchanging messages through shared-memory mailboxes (like Gloo's thread
/// tests). For tests at any world size without mpirun, and for single-process
/// multi-rank users.
///
/// @code
/// dpkit::inproc_world world(4);
/// world.run([](dpkit::inproc& comm) {
///   std::vector<float> g(1000, float(comm.rank()));
///   dpkit::allreduce(comm, g, dpkit::reduce_op::sum);
/// });
/// @endcode
///
/// Messages are rendezvous: a send's bytes are copied straight into the
/// matching receive's buffer (one copy, no staging), by whichever side matches
/// second. Matching is FIFO per (source, destination, tag), as MPI.
#pragma once

#include "../core/async.hpp"
#include "../core/device_ops.hpp"
#include "../core/errors.hpp"
#include "../core/options.hpp"
#include "../core/tensor.hpp"
#include "detail/scratch_arena.hpp"
#include "concept.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace dpkit {

class inproc_world;

namespace detail {

struct inproc_op {
  enum status_t { pending, copying, done, failed };
  std::mutex mu;
  std::condition_variable cv;
  status_t status = pending;
  std::string message; // failure reason
  void finish(status_t s, std::string msg = {}) {
    {
      std::lock_guard lk(mu);
      status = s;
      message = std::move(msg);
    }
    cv.notify_all();
  }
};

struct inproc_entry {
  int peer;            // source (in a receive queue: wanted source; in a send queue: sender)
  int tag;
  std::byte* recv_buf; // receive side
  const std::byte* send_buf;
  std::size_t bytes;
  std::shared_ptr<inproc_op> op;
};

struct inproc_mailbox {
  std::mutex mu;
  std::list<inproc_entry> sends; // sends addressed to this rank, in posting order
  std::list<inproc_entry> recvs; // receives posted by this rank, in posting order
};

} // namespace detail

/// A pending inproc send or receive (models dpkit::request). Destroying an
/// incomplete request withdraws it, so its buffer is never touched afterwards.
class inproc_request {
public:
  inproc_request() = default;
  inproc_request(std::shared_ptr<detail::inproc_op> op, detail::inproc_mailbox* box, int rank, int peer, int tag,
                 bool is_send)
      : op_(std::move(op)), box_(box), rank_(rank), peer_(peer), tag_(tag), is_send_(is_send) {}
  inproc_request(inproc_request&& o) noexcept { swap(o); }
  inproc_request& operator=(inproc_request&& o) noexcept {
    if (this != &o) {
      cancel();
      op_.reset();
      swap(o);
    }
    return *this;
  }
  ~inproc_request() { cancel(); }

  /// Blocks until complete.
  /// @throws dpkit::timeout_error past deadline d (naming rank, peer and tag);
  /// dpkit::error if the message was mismatched (receive shorter than send).
  void wait(deadline d) {
    if (!op_) return;
    std::unique_lock lk(op_->mu);
    if (!op_->cv.wait_until(lk, d, [&] { return op_->status >= detail::inproc_op::done; })) {
      lk.unlock();
      throw timeout_error("inproc: rank " + std::to_string(rank_) + " timed out waiting for " +
                          (is_send_ ? "send to" : "receive from") + " rank " + std::to_string(peer_) + " (tag " +
                          std::to_string(tag_) + ")");
    }
    if (op_->status == detail::inproc_op::failed) throw error(op_->message);
  }
  /// True once complete (or failed; wait() then throws).
  bool test() const {
    if (!op_) return true;
    std::lock_guard lk(op_->mu);
    return op_->status >= detail::inproc_op::done;
  }

private:
  void swap(inproc_request& o) noexcept {
    std::swap(op_, o.op_);
    std::swap(box_, o.box_);
    std::swap(rank_, o.rank_);
    std::swap(peer_, o.peer_);
    std::swap(tag_, o.tag_);
    std::swap(is_send_, o.is_send_);
  }
  void cancel() noexcept {
    if (!op_) return;
    {
      std::lock_guard lk(op_->mu);
      if (op_->status >= detail::inproc_op::done) return;
    }
    {
      std::lock_guard blk(box_->mu);
      auto& q = is_send_ ? box_->sends : box_->recvs;
      for (auto it = q.begin(); it != q.end(); ++it)
        if (it->op == op_) {
          q.erase(it);
          return; // was still pending: withdrawn
        }
    }
    // Being copied by the matching side right now: wait for the copy to end.
    std::unique_lock lk(op_->mu);
    op_->cv.wait(lk, [&] { return op_->status >= detail::inproc_op::done; });
  }

  std::shared_ptr<detail::inproc_op> op_;
  detail::inproc_mailbox* box_ = nullptr;
  int rank_ = 0, peer_ = 0, tag_ = 0;
  bool is_send_ = false;
};

/// One rank's endpoint of an inproc_world (models dpkit::transport and
/// dpkit::async_transport). Obtained from inproc_world::run or ::rank_handle;
/// used by one thread at a time (plus its own communication thread).
class inproc {
public:
  /// This rank, in [0, size()).
  int rank() const noexcept { return rank_; }
  /// World size (number of ranks).
  int size() const noexcept;
  /// Host memory always; device memory when the world was given device_ops
  /// (CUDA builds).
  bool accepts(memory_space s) const noexcept;
  /// The world's device primitives, or nullptr (host only).
  const device_ops* device() const noexcept;

  /// Starts sending `data` to rank `peer` with `tag`. The buffer must stay
  /// valid and unchanged until the request completes.
  /// @throws dpkit::invalid_argument if peer is out of range.
  inproc_request isend(std::span<const std::byte> data, int peer, int tag);
  /// Starts receiving exactly data.size() bytes from rank `peer` with `tag`.
  /// @throws dpkit::invalid_argument if peer is out of range.
  inproc_request irecv(std::span<std::byte> data, int peer, int tag);

  /// This rank's communication thread (runs *_async collectives in order).
  progress_thread& progress() { return *progress_; }
  /// Host scratch reused by this rank's collectives (internal).
  detail::scratch_arena& scratch() { return *arena_; }
  /// The world this rank belongs to.
  inproc_world& world() const noexcept { return *world_; }

  inproc(const inproc&) = delete;
  inproc& operator=(const inproc&) = delete;
  inproc(inproc&&) = default;
  inproc& operator=(inproc&&) = default;
  ~inproc() = default;

private:
  friend class inproc_world;
  inproc(inproc_world* w, int r)
      : world_(w), rank_(r), arena_(std::make_unique<detail::scratch_arena>()),
        progress_(std::make_unique<progress_thread>()) {}
  void check_peer(int peer, const char* what) const;

  inproc_world* world_;
  int rank_;
  std::unique_ptr<detail::scratch_arena> arena_;
  std::unique_ptr<progress_thread> progress_;
};

/// The shared state of an in-process world of `size` ranks.
class inproc_world {
public:
  /// Creates a world of `world_size` ranks.
  /// @param ops device primitives (nullptr: host memory only). With ops,
  ///        message payloads are moved with ops->copy, so they may be in host
  ///        or device memory; ops must outlive the world.
  /// @throws dpkit::invalid_argument if world_size <= 0.
  explicit inproc_world(int world_size, const device_ops* ops = nullptr) : size_(world_size), ops_(ops) {
    if (world_size <= 0)
      throw invalid_argument("inproc_world: world size must be >= 1, got " + std::to_string(world_size));
    boxes_ = std::make_unique<detail::inproc_mailbox[]>(static_cast<std::size_t>(world_size));
  }
  inproc_world(const inproc_world&) = delete;
  inproc_world& operator=(const inproc_world&) = delete;

  /// Number of ranks.
  int size() const noexcept { return size_; }
  /// The device primitives given at construction, or nullptr.
  const device_ops* device() const noexcept { return ops_; }

  /// A rank's endpoint, for callers that manage their own threads.
  /// @throws dpkit::invalid_argument if rank is out of [0, size()).
  inproc rank_handle(int rank) {
    if (rank < 0 || rank >= size_)
      throw invalid_argument("inproc_world: rank " + std::to_string(rank) + " out of range for world size " +
                             std::to_string(size_));
    return inproc(this, rank);
  }

  /// Runs f(inproc&) on size() threads, one per rank, and joins them. If any
  /// rank throws, the first exception (lowest rank) is rethrown after all
  /// threads ended.
  template <class F>
  void run(F&& f) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size_));
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r)
      threads.emplace_back([&, r] {
        try {
          inproc comm(this, r);
          f(comm);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  /// Moves n bytes of a message payload (std::memcpy, or device_ops::copy
  /// when the world was given device primitives).
  void copy(void* dst, const void* src, std::size_t n) const {
    if (n == 0) return;
    if (ops_) ops_->copy(dst, src, n, ops_->ctx);
    else std::memcpy(dst, src, n);
  }

private:
  friend class inproc;
  detail::inproc_mailbox& box(int r) { return boxes_[static_cast<std::size_t>(r)]; }

  int size_;
  const device_ops* ops_;
  std::unique_ptr<detail::inproc_mailbox[]> boxes_;
};

inline int inproc::size() const noexcept { return world_->size(); }
inline bool inproc::accepts(memory_space s) const noexcept {
  return s == memory_space::host || world_->device() != nullptr;
}
inline const device_ops* inproc::device() const noexcept { return world_->device(); }

inline void inproc::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size())
    throw invalid_argument(std::string("inproc::") + what + ": rank " + std::to_string(rank_) + ": peer rank " +
                           std::to_string(peer) + " out of range for world size " + std::to_string(size()));
}

namespace detail {
// Completes a matched pair: copies outside the mailbox lock, then signals.
inline void inproc_complete(inproc_world& w, void (*copy)(inproc_world&, void*, const void*, std::size_t),
                            const inproc_entry& send, const inproc_entry& recv, int src, int dst) {
  if (send.bytes != recv.bytes) {
    std::string msg = "inproc: message size mismatch from rank " + std::to_string(src) + " to rank " +
                      std::to_string(dst) + " (tag " + std::to_string(send.tag) + "): sent " +
                      std::to_string(send.bytes) + " bytes, receive expects " + std::to_string(recv.bytes);
    send.op->finish(inproc_op::failed, msg);
    recv.op->finish(inproc_op::failed, msg);
    return;
  }
  copy(w, recv.recv_buf, send.send_buf, send.bytes);
  send.op->finish(inproc_op::done);
  recv.op->finish(inproc_op::done);
}
} // namespace detail

namespace detail {
// Posts `mine` into `box`: if the opposite queue (`others`) holds a match for
// (peer, tag) in posting order, take it and complete the pair outside the
// lock; otherwise append `mine` to its own queue (`own`).
inline void inproc_post(inproc_world& w, inproc_mailbox& box, std::list<inproc_entry>& others,
                        std::list<inproc_entry>& own, inproc_entry mine, int match_peer, bool mine_is_send, int src,
                        int dst) {
  std::unique_lock lk(box.mu);
  for (auto it = others.begin(); it != others.end(); ++it) {
    if (it->peer == match_peer && it->tag == mine.tag) {
      inproc_entry other = std::move(*it);
      others.erase(it);
      {
        std::lock_guard a(other.op->mu);
        other.op->status = inproc_op::copying;
      }
      mine.op->status = inproc_op::copying;
      lk.unlock();
      inproc_complete(w, [](inproc_world& ww, void* d, const void* s, std::size_t n) { ww.copy(d, s, n); },
                      mine_is_send ? mine : other, mine_is_send ? other : mine, src, dst);
      return;
    }
  }
  own.push_back(std::move(mine));
}
} // namespace detail

inline inproc_request inproc::isend(std::span<const std::byte> data, int peer, int tag) {
  check_peer(peer, "isend");
  auto op = std::make_shared<detail::inproc_op>();
  auto& box = world_->box(peer);
  // In the receiver's box: match a receive posted for (this rank, tag).
  detail::inproc_post(*world_, box, box.recvs, box.sends, {rank_, tag, nullptr, data.data(), data.size(), op}, rank_,
                      true, rank_, peer);
  return inproc_request(op, &box, rank_, peer, tag, true);
}

inline inproc_request inproc::irecv(std::span<std::byte> data, int peer, int tag) {
  check_peer(peer, "irecv");
  auto op = std::make_shared<detail::inproc_op>();
  auto& box = world_->box(rank_);
  // In this rank's box: match a send queued from (peer, tag).
  detail::inproc_post(*world_, box, box.sends, box.recvs, {peer, tag, data.data(), nullptr, data.size(), op}, peer,
                      false, peer, rank_);
  return inproc_request(op, &box, rank_, peer, tag, false);
}

} // namespace dpkit
