/// @file async.hpp
/// @brief Handles of asynchronous collectives and the communication thread
/// that runs them (docs/design.md, "Async"; docs/concepts.md, "Async").
///
/// `*_async` functions enqueue the collective on the transport's
/// communication thread (one per transport object, started on first use) and
/// return a collective_handle. Collectives run in submission order, so every
/// rank that submits the same sequence runs the same sequence, as NCCL orders
/// work on a stream.
#pragma once

#include "errors.hpp"
#include "options.hpp"

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace dpkit {

namespace detail {
struct task_state {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};
} // namespace detail

/// Completion handle of an asynchronous collective. wait() rethrows the
/// collective's exception (timeout_error, invalid_argument, error). Movable;
/// destroying a handle does not cancel the collective. A default-constructed
/// handle is complete.
class collective_handle {
public:
  collective_handle() = default;
  /// Internal: wraps a task's shared state.
  explicit collective_handle(std::shared_ptr<detail::task_state> s) : state_(std::move(s)) {}

  /// Blocks until the collective finished; rethrows its exception.
  void wait() {
    if (!state_) return;
    std::unique_lock lk(state_->mu);
    state_->cv.wait(lk, [&] { return state_->done; });
    rethrow();
  }
  /// Blocks until the collective finished or deadline d passed.
  /// @throws dpkit::timeout_error when d passes first (the collective keeps
  /// running; its own timeout bounds it).
  void wait(deadline d) {
    if (!state_) return;
    std::unique_lock lk(state_->mu);
    if (!state_->cv.wait_until(lk, d, [&] { return state_->done; }))
      throw timeout_error("collective_handle::wait: deadline passed before the collective finished");
    rethrow();
  }
  /// True once the collective finished (successfully or not); never blocks
  /// for long, never throws.
  bool test() const {
    if (!state_) return true;
    std::lock_guard lk(state_->mu);
    return state_->done;
  }
  /// True if the handle refers to a collective.
  bool valid() const noexcept { return static_cast<bool>(state_); }

private:
  void rethrow() {
    if (state_->error) {
      auto e = state_->error;
      state_->error = nullptr; // rethrow once
      std::rethrow_exception(e);
    }
  }
  std::shared_ptr<detail::task_state> state_;
};

/// A communication thread: runs submitted tasks one at a time in FIFO order.
/// Started lazily by the first submit(); the destructor finishes queued tasks
/// and joins. Not copyable or movable (tasks may refer to it).
class progress_thread {
public:
  progress_thread() = default;
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;
  ~progress_thread() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Enqueues f; returns a handle completed when f returns (or throws).
  collective_handle submit(std::function<void()> f) {
    auto st = std::make_shared<detail::task_state>();
    {
      std::lock_guard lk(mu_);
      queue_.emplace_back(std::move(f), st);
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_one();
    return collective_handle(st);
  }

private:
  void loop() {
    for (;;) {
      std::pair<std::function<void()>, std::shared_ptr<detail::task_state>> item;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr err;
      try {
        item.first();
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard lk(item.second->mu);
        item.second->error = err;
        item.second->done = true;
      }
      item.second->cv.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<detail::task_state>>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

} // namespace dpkit
