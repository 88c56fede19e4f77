// dpkit._dist_ext: the Work objects the backend returns. A collective's
// Work completes through a future (the group's worker runs the
// collective); a send's or receive's Work owns the transport's request and
// waits on it itself, on the caller's thread (Gloo's SendWork and RecvWork).
#pragma once

#include "common.hpp"

namespace dpkit_dist {

/// A collective's Work: completed by the group's worker (or the caller, for
/// an inline collective) through its future; wait() rethrows the
/// collective's exception (torch's Work::create_from_future would swallow
/// it: its wait() only waits).
class dpkit_work : public c10d::Work {
public:
  dpkit_work(int rank, c10d::OpType type, c10::intrusive_ptr<c10::ivalue::Future> future)
      : c10d::Work(rank, type), future_(std::move(future)) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->hasError() ? future_->exception_ptr() : nullptr; }
  std::vector<at::Tensor> result() override {
    future_->waitAndThrow();
    return future_->value().toTensorVector();
  }
  /// Waits for the collective (at most `timeout`, if given; its own deadline
  /// bounds it anyway) and rethrows its error.
  /// @throws the collective's dpkit exception; dpkit::timeout_error if
  ///         `timeout` passes first.
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout == kNoTimeout) {
      future_->wait();
    } else {
      const auto until = std::chrono::steady_clock::now() + timeout;
      while (!future_->completed()) {
        if (std::chrono::steady_clock::now() >= until)
          throw dpkit::timeout_error("dpkit backend: Work.wait: " + std::to_string(timeout.count()) +
                                     " ms passed before the collective finished");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// A transport's pending send or receive, whatever the transport
/// (gloo_request, gloo_any_request, mpi_request).
class p2p_request {
public:
  virtual ~p2p_request() = default;
  /// Waits until complete or deadline d (the transport's errors).
  virtual void wait(dpkit::deadline d) = 0;
  /// True once complete.
  virtual bool test() = 0;
  /// The peer; for a receive from any rank the sender once complete, -1 before.
  virtual int source() const = 0;
};

template <class R>
class p2p_request_of final : public p2p_request {
public:
  p2p_request_of(R r, int peer) : r_(std::move(r)), peer_(peer) {}
  void wait(dpkit::deadline d) override { r_.wait(d); }
  bool test() override { return r_.test(); }
  int source() const override {
    if constexpr (requires(const R& r) { r.source(); }) return r_.source();
    else return peer_;
  }

private:
  R r_;
  int peer_;
};

/// One send or receive of a group: its tensor, the transport's request and
/// its outcome. Shared by the operation's Work (which Python may drop before
/// the operation completes, as a fire-and-forget isend does) and the group
/// (which keeps every pending one, so the tensor lives and the transport
/// finishes it, and which withdraws them all before its transport goes:
/// `group` is cleared then, and a wait afterwards raises
/// communicator_error). Every member is guarded by `mu`.
struct p2p_slot {
  std::mutex mu;
  at::Tensor tensor;
  std::unique_ptr<p2p_request> request; // null once the group shut down
  dpkit::deadline due{};                // posted + the group's timeout
  std::string what;                     // "rank R: send to rank P (tag T, N bytes)"
  std::function<void(const std::string&)> fail; // fails the group (while it lives)
  bool done = false;
  std::exception_ptr error;
  int source = -1;                      // the peer; a receive from any rank: its sender once done

  /// Marks the operation done and lets go of the request (mu held): a
  /// finished request must not outlive the transport it points into (Python
  /// may drop this slot's Work after the group shut down).
  void finish() {
    done = true;
    source = request->source();
    request.reset();
  }
  /// The transport's exception `e` as the same dpkit type, its message
  /// prefixed with this operation (torch's tag, not the transport's).
  std::exception_ptr named(std::exception_ptr e) const {
    try {
      std::rethrow_exception(e);
    } catch (const dpkit::timeout_error& x) {
      return std::make_exception_ptr(dpkit::timeout_error(what + ": " + x.what()));
    } catch (const dpkit::mismatch_error& x) {
      return std::make_exception_ptr(dpkit::mismatch_error(what + ": " + x.what()));
    } catch (const dpkit::communicator_error& x) {
      return std::make_exception_ptr(dpkit::communicator_error(what + ": " + x.what()));
    } catch (const dpkit::peer_error& x) {
      return std::make_exception_ptr(dpkit::peer_error(what + ": " + x.what()));
    } catch (const dpkit::error& x) {
      return std::make_exception_ptr(dpkit::error(what + ": " + x.what()));
    } catch (...) {
      return e;
    }
  }
  /// Keeps the first error (named), fails the group with it and lets go of
  /// the request (mu held).
  void record(std::exception_ptr e) {
    if (error) return;
    error = named(e);
    e = error;
    request.reset();
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      if (fail) fail(x.what());
    } catch (...) {
    }
  }
  /// True once done or failed; progresses the transport (mu held).
  bool settled() {
    if (done || error) return true;
    if (!request) return false;
    try {
      if (request->test()) finish();
    } catch (...) {
      record(std::current_exception());
    }
    return done || error;
  }
};

/// The Work of a send or receive (torch's send, recv, recv from any source,
/// isend, irecv, batch_isend_irecv; Gloo's SendWork and RecvWork): wait()
/// progresses the transport itself, against the operation's deadline
/// (posted + the group's timeout, never longer) or a shorter timeout given
/// to wait(). The first failure (the deadline passed, the peer or the group
/// failed) fails the group, as a failed collective does, and every later
/// wait() rethrows it.
class p2p_work final : public c10d::Work {
public:
  p2p_work(int rank, c10d::OpType type, std::shared_ptr<p2p_slot> slot)
      : c10d::Work(rank, type), slot_(std::move(slot)) {}
  bool isCompleted() override {
    const std::lock_guard lk(slot_->mu);
    return slot_->settled();
  }
  bool isSuccess() const override {
    const std::lock_guard lk(slot_->mu);
    return slot_->done && !slot_->error;
  }
  std::exception_ptr exception() const override {
    const std::lock_guard lk(slot_->mu);
    return slot_->error;
  }
  /// The peer (for a receive from any source: the rank the message came
  /// from, once complete; -1 before).
  int sourceRank() const override {
    const std::lock_guard lk(slot_->mu);
    return slot_->source;
  }
  std::vector<at::Tensor> result() override {
    wait(kNoTimeout);
    return {slot_->tensor};
  }
  /// Waits for the operation, at most `timeout` (when given) and never past
  /// its deadline, and rethrows its error.
  /// @throws dpkit::timeout_error when `timeout` passes first (the operation
  ///         stays pending: wait again) or the deadline passes (the group
  ///         fails); dpkit::communicator_error when the group shut down
  ///         first; the transport's errors.
  bool wait(std::chrono::milliseconds timeout) override {
    p2p_slot& s = *slot_;
    const std::lock_guard lk(s.mu);
    if (s.error) std::rethrow_exception(s.error);
    if (s.done) return true;
    if (!s.request)
      throw dpkit::communicator_error(s.what + ": the process group was shut down before it completed");
    const auto now = std::chrono::steady_clock::now();
    const bool short_wait = timeout != kNoTimeout && now + timeout < s.due;
    try {
      s.request->wait(short_wait ? now + timeout : s.due);
      s.finish();
    } catch (const dpkit::timeout_error& e) {
      if (short_wait)
        throw dpkit::timeout_error("dpkit: Timed out waiting " + std::to_string(timeout.count()) + " ms (Work.wait's "
                                   "timeout) for " + s.what + " (" + e.what() + ")");
      s.record(std::current_exception());
      std::rethrow_exception(s.error);
    } catch (...) {
      s.record(std::current_exception());
      std::rethrow_exception(s.error);
    }
    return true;
  }

private:
  std::shared_ptr<p2p_slot> slot_;
};

} // namespace dpkit_dist
