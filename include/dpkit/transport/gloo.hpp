/// @file gloo.hpp
/// @brief The Gloo transport: ranks in any processes on any hosts, connected
/// by Gloo's TCP pairs after a rendezvous through a store that a URL names
/// (`file:///path` on one machine, `redis://host:port/job` across machines),
/// and within a node by a shared-memory segment mapped through the same
/// store (no MPI needed). Host memory. Unlike an MPI communicator it can be created again, by any
/// set of processes, at any time: the foundation of elastic training
/// (docs/elastic.md). Meson feature `gloo` (Debian libgloo-dev); never
/// included by the umbrella header dpkit.hpp.
///
/// @code
/// dpkit::gloo_transport comm("file:///tmp/job1", rank, world_size);
/// dpkit::allreduce(comm, grads, dpkit::reduce_op::avg);
/// @endcode
///
/// Between ranks of one node (every rank on one node, its segment mapped),
/// point-to-point messages go through the segment instead
/// (detail/shm_p2p.hpp: a ring per ordered pair, fragments copied in by the
/// sender and out by the receiver, early messages buffered, MPI's matching
/// rules; shm_messages() says so), as Open MPI's vader carries dpkit::mpi's.
/// A wait on one spins, yields, then sleeps on the rank's doorbell, and about
/// every millisecond looks for a dead or mismatched peer (shm_poll's checks)
/// against the deadline.
///
/// Between ranks that are not all on one node (the cross-node part of the
/// hierarchy, a flat ring across nodes), they go over TCP connections of
/// dpkit's own, one per pair, made through the same store next to Gloo's
/// (detail/tcp_p2p.hpp: a message leaves at once with a 16-byte header, the
/// waiting thread reads and writes the sockets itself and sleeps in ppoll;
/// tcp_messages() says so): Gloo's unbound buffers below need a
/// receiver-driven handshake and its event-loop thread for every message,
/// 3-50x Open MPI's latency across nodes for messages below 128 KiB.
///
/// With DPKIT_TCP_P2P=0, point-to-point requests are Gloo unbound buffers sent and received on a
/// slot (the dpkit tag): Gloo matches a pair's messages on one slot in posting
/// order, as MPI matches a tag. Waits never call Gloo's own timed waits (a
/// Gloo wait that times out closes every pair of its context): a request's
/// wait(deadline) blocks in Gloo's untimed wait itself, and a watchdog thread
/// of the transport aborts that wait at the deadline (or when the peer check
/// finds the peer dead). Gloo has no non-blocking test, so a request that is
/// tested (or destroyed) before anyone waits for it is handed to a pool of
/// waiter threads that wait for it instead. A broken connection (a peer that exited,
/// crashed or closed its transport) fails the requests on it at once
/// (peer_error naming the peer); any failure fails the whole transport and
/// closes all its connections, so every peer's waits fail within
/// milliseconds instead of at their deadline (docs/reliability.md).
///
/// The class is `gloo_transport`, not `gloo`: inside namespace dpkit a class
/// `gloo` would hide Gloo's own namespace `::gloo`.
#pragma once

#include "../core/async.hpp"
#include "../core/errors.hpp"
#include "../core/options.hpp"
#include "../core/tensor.hpp"
#include "concept.hpp"
#include "detail/gloo_store.hpp"
#include "detail/health.hpp"
#include "detail/scratch_arena.hpp"
#include "detail/shm_p2p.hpp"
#include "detail/store_bootstrap.hpp"
#include "topology.hpp"

#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <csignal>
#include <signal.h> // sigaction
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

namespace dpkit {

/// How a gloo_transport connects (a regular aggregate).
struct gloo_options {
  /// Address this rank listens on and advertises to its peers (a host name
  /// or an IP address, e.g. "127.0.0.1" for ranks on one machine). Empty:
  /// the address of `iface`, else of this machine's host name (Gloo's rule).
  std::string hostname;
  /// Network interface to listen on (e.g. "eth0"); used when hostname is
  /// empty. Empty: the environment variable GLOO_SOCKET_IFNAME (PyTorch's
  /// name for it), else none.
  std::string iface;
  /// Namespace of this group's keys inside the store (a generation number,
  /// a launch id): the keys of a rendezvous can be written once, so ranks
  /// that meet again through the same store use a new prefix. Empty: none.
  std::string prefix;
  /// Limit of the rendezvous (waiting for the other ranks' addresses in the
  /// store) and of connecting the pairs. Default: env_default_timeout()
  /// (DPKIT_TIMEOUT seconds, else 30 minutes).
  std::chrono::milliseconds timeout = env_default_timeout();
  friend bool operator==(const gloo_options&, const gloo_options&) = default;
};

namespace detail {

/// Whether gloo_transport sends point-to-point messages that do not go
/// through shared memory over dpkit's own TCP connections (tcp_p2p.hpp):
/// DPKIT_TCP_P2P unset or "1"; "0" keeps Gloo's pairs (for comparison).
/// @throws dpkit::invalid_argument for another value (naming it).
inline bool tcp_p2p_enabled() {
  const char* v = std::getenv("DPKIT_TCP_P2P");
  if (!v || !*v || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  throw invalid_argument(std::string("DPKIT_TCP_P2P: expected 0 (Gloo's pairs) or 1 (dpkit's TCP connections), got '") +
                         v + "'");
}

/// Gloo writes to sockets with writev, which raises SIGPIPE when the peer
/// has gone; with the default action that kills the process instead of
/// failing the send. Sets SIGPIPE to ignored (once per process) unless the
/// program installed its own disposition.
inline void gloo_ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa{};
    if (sigaction(SIGPIPE, nullptr, &sa) == 0 && sa.sa_handler == SIG_DFL) {
      struct sigaction ign{};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      sigaction(SIGPIPE, &ign, nullptr);
    }
  });
}

/// One pending send or receive: its Gloo buffer and its outcome.
struct gloo_op {
  enum state_t { pending, done, failed, aborted };
  std::unique_ptr<::gloo::transport::UnboundBuffer> buf;
  bool is_send = false;
  int peer = -1;
  int tag = 0;
  std::size_t bytes = 0;
  std::mutex mu;
  std::condition_variable cv;
  state_t state = pending;
  std::string error; // failed: what Gloo said
  /// Who blocks in Gloo's wait for it (one thread at most): nobody yet, the
  /// thread in gloo_request::wait (the watchdog enforces its deadline), or a
  /// waiter thread (once test() or a destructor needed an outcome without
  /// blocking).
  enum owner_t { unowned, caller, waiter };
  owner_t owner = unowned;
  bool timed_out = false; // the watchdog aborted the caller's Gloo wait at its deadline
  bool reclaim = false;   // a caller of wait() aborted the waiter's Gloo wait to wait itself
  bool tested = false;    // test() saw it once while nobody waited for it
  void abort() {
    if (is_send) buf->abortWaitSend();
    else buf->abortWaitRecv();
  }
  std::string describe(int rank) const {
    return "gloo_transport: rank " + std::to_string(rank) + ": " + (is_send ? "send to" : "receive from") +
           " rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) +
           " bytes)";
  }
};

/// What a gloo_transport and its requests share (a stable address): the
/// store, the Gloo device and context, the health, the pending operations
/// and the waiter threads.
class gloo_state {
public:
  gloo_state(int rank, int size) : rank_(rank), size_(size) {}
  gloo_state(const gloo_state&) = delete;
  gloo_state& operator=(const gloo_state&) = delete;
  /// Aborts what is still pending, joins the waiter threads and the
  /// watchdog, then closes the connections (the context's pairs) and stops
  /// the device. Peers on
  /// this node waiting for this rank in shared memory learn it from the
  /// segment's abort words and this rank's left mark (as peers over TCP
  /// learn it from the closed connections); what this rank sent before is
  /// still theirs to read, and waits between other ranks go on (a clean
  /// close is not a failure: shm_segment::peer_still_in).
  ~gloo_state() {
    if (segment_.view && size_ > 1) {
      segment_.view->mark_left();
      segment_.view->abort_all(shm_abort_close);
    }
    if (p2p_) p2p_->fail_all("the transport was closed");
    abort_pending();
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    {
      std::lock_guard lk(watch_mu_);
      watch_stop_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    ctx_.reset();
    device_.reset();
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  comm_health& health() noexcept { return health_; }
  ::gloo::Context& context() { return *ctx_; }

  /// Opens the store `url` names and keeps it, with this group's key
  /// prefix and options (nothing is written yet).
  void attach(const std::string& url, const gloo_options& o) {
    std::string prefix;
    auto store = open_kv_store(url, where(), o.timeout, prefix, rank_);
    attach(std::move(store), std::move(prefix), o);
  }
  /// Keeps an open store, with the key prefix `prefix` (+ "/" + o.prefix).
  void attach(std::shared_ptr<kv_store> store, std::string prefix, const gloo_options& o) {
    store_ = std::move(store);
    if (!o.prefix.empty()) prefix += "/" + o.prefix;
    key_prefix_ = prefix;
    options_ = o;
  }
  /// Connects to every other rank through the attached store (a
  /// collective call of all `size` ranks).
  void connect() {
    const std::string where = this->where();
    const std::string url = store_->where();
    const std::string& prefix = key_prefix_;
    const gloo_options& o = options_;
    prefixed_ = std::make_unique<::gloo::rendezvous::PrefixStore>(prefix, *store_);

    ::gloo::transport::tcp::attr attr;
    std::string iface = o.iface;
    if (o.hostname.empty() && iface.empty())
      if (const char* e = std::getenv("GLOO_SOCKET_IFNAME")) iface = e;
    if (!o.hostname.empty()) attr.hostname = o.hostname;
    else if (!iface.empty()) attr.iface = iface;
    try {
      // resolved here (as CreateDevice does) so that dpkit's own TCP
      // connections (tcp_p2p) listen on the address Gloo's pairs use
      attr = ::gloo::transport::tcp::CreateDeviceAttr(attr);
      std::memcpy(&addr_, &attr.ai_addr, sizeof addr_);
      addr_len_ = static_cast<socklen_t>(attr.ai_addrlen);
      device_ = std::make_shared<::gloo::transport::tcp::Device>(attr);
    } catch (const std::exception& e) {
      throw error(where + ": cannot open a TCP device on " +
                  (!o.hostname.empty() ? "host '" + o.hostname + "'"
                   : !iface.empty()    ? "interface '" + iface + "'"
                                       : std::string("this machine's host name")) +
                  ": " + e.what());
    }
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
    ctx->setTimeout(o.timeout);
    try {
      ctx->connectFullMesh(*prefixed_, device_);
    } catch (const timeout_error& e) {
      throw timeout_error(where + ": the rendezvous (key prefix '" + prefix + "') did not complete within " +
                          std::to_string(o.timeout.count()) + " ms: a rank did not arrive (" + e.what() + ")");
    } catch (const ::gloo::IoException& e) {
      const std::string what = e.what();
      if (what.find("imeout") != std::string::npos)
        throw timeout_error(where + ": the rendezvous through " + url + " (key prefix '" + prefix +
                            "') did not complete within " + std::to_string(o.timeout.count()) +
                            " ms: a rank did not arrive (" + what + ")");
      throw error(where + ": connecting through " + url + " failed: " + what);
    } catch (const error& e) { // the store's own (it names itself and the key)
      throw error(where + ": " + e.what());
    } catch (const std::exception& e) {
      throw error(where + ": connecting through " + url + " (key prefix '" + prefix + "') failed: " + e.what() +
                  " (keys of an earlier group with the same prefix? use a fresh directory, job or gloo_options::prefix)");
    }
    ctx_ = std::move(ctx);
  }

  /// The store, the key prefix of this group's rendezvous and its options
  /// (split() connects its sub-groups with them).
  const std::shared_ptr<kv_store>& store() const noexcept { return store_; }
  const std::string& key_prefix() const noexcept { return key_prefix_; }
  const gloo_options& options() const noexcept { return options_; }
  /// The node's shared segment (store_bootstrap.hpp), or nullptr.
  shm_segment* shm() const noexcept { return segment_.view.get(); }
  /// Keeps the node's shared segment (mapped by store_map_segment) and
  /// starts the point-to-point engine on its area, if it has one.
  void set_segment(store_segment s) {
    segment_ = std::move(s);
    if (segment_.p2p_area) p2p_ = std::make_unique<shm_p2p>(rank_, size_, segment_.p2p_area, segment_.p2p_ring_bytes);
  }
  /// Connects dpkit's own TCP connections to every other rank through the
  /// attached store (a collective call of all ranks; tcp_p2p_connect) and
  /// sends point-to-point messages over them instead of Gloo's pairs.
  void connect_tcp(deadline due) {
    p2p_ = tcp_p2p_connect(*store_, key_prefix_ + "/tcp", rank_, size_, addr_, addr_len_, due, where());
  }
  /// The point-to-point engine: the node's shared memory (every rank on
  /// this node and a segment mapped), dpkit's TCP connections, or nullptr
  /// (messages then go over Gloo's pairs).
  p2p_engine* p2p() const noexcept { return p2p_.get(); }
  /// Whether p2p() is the shared-memory engine (else TCP, or none).
  bool p2p_shm() const noexcept { return dynamic_cast<const shm_p2p*>(p2p_.get()) != nullptr; }
  /// Whether p2p() is dpkit's TCP engine.
  bool p2p_tcp() const noexcept { return dynamic_cast<const tcp_p2p*>(p2p_.get()) != nullptr; }
  /// The number of this rank's earlier split() calls (then counts this one).
  std::uint64_t next_split() noexcept { return splits_++; }

  std::string where() const {
    return "gloo_transport: rank " + std::to_string(rank_) + " of " + std::to_string(size_);
  }

  /// Posts a send or receive of `bytes` at `data` with rank `peer` on slot
  /// `tag`. Nobody waits for it yet: wait_gloo() blocks in Gloo's wait in
  /// the caller's thread (one hand-off less per message than a waiter
  /// thread), test_gloo() and abandon() hand it to a waiter thread.
  /// @throws peer_error when the connection to peer is already broken
  ///         (the transport is then failed).
  std::shared_ptr<gloo_op> post(bool is_send, std::byte* data, std::size_t bytes, int peer, int tag) {
    if (health_.failed())
      throw peer_error("gloo_transport: rank " + std::to_string(rank_) + ": " + (is_send ? "send to" : "receive from") +
                       " rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                       "): the transport failed earlier (first failure: " + health_.failure() + ")");
    auto op = std::make_shared<gloo_op>();
    op->is_send = is_send;
    op->peer = peer;
    op->tag = tag;
    op->bytes = bytes;
    const std::uint64_t slot = static_cast<std::uint32_t>(tag);
    try {
      op->buf = ctx_->createUnboundBuffer(data, bytes);
      if (is_send) op->buf->send(peer, slot, 0, bytes);
      else op->buf->recv(peer, slot, 0, bytes);
    } catch (const std::exception& e) {
      const std::string what = op->describe(rank_) + ": the connection to rank " + std::to_string(peer) +
                               " is broken (" + e.what() + "): rank " + std::to_string(peer) +
                               " failed, exited or closed its transport";
      op->buf.reset();
      fail(what);
      throw peer_error(what);
    }
    {
      std::lock_guard lk(mu_);
      pending_.insert(op);
    }
    // fail() sets the health before it aborts what is pending: an operation
    // registered after that snapshot aborts itself.
    if (health_.failed()) op->abort();
    return op;
  }

  /// Installs the peer check of gloo_transport::set_peer_check.
  void set_peer_check(std::function<bool(int)> alive, std::chrono::milliseconds after, std::chrono::milliseconds every) {
    std::lock_guard lk(check_mu_);
    has_check_ = static_cast<bool>(alive);
    peer_check_ = std::move(alive);
    check_after_ = after;
    check_every_ = every;
    last_check_.assign(static_cast<std::size_t>(size_), clock::time_point{});
  }

  /// Called by a wait that has lasted `waited`: true when the peer check
  /// says `peer` is dead (checked at most every check_every_ per peer, once
  /// the wait lasted check_after_); the transport is then failed, which
  /// ends every pending wait.
  bool peer_dead(int peer, clock::duration waited) {
    std::function<bool(int)> alive;
    {
      std::lock_guard lk(check_mu_);
      if (!peer_check_ || waited < check_after_) return false;
      const auto now = clock::now();
      auto& last = last_check_[static_cast<std::size_t>(peer)];
      if (now - last < check_every_) return false;
      last = now;
      alive = peer_check_;
    }
    try {
      if (alive(peer)) return false;
    } catch (const std::exception& e) {
      // the check itself failed (an elastic group's store is unreachable:
      // this rank is cut off): it may run on the watchdog thread, where an
      // exception would end the process; the transport fails instead
      fail(where() + ": the peer check of rank " + std::to_string(peer) + " failed: " + e.what());
      return true;
    }
    fail(where() + ": rank " + std::to_string(peer) + " is dead (the peer check: its heartbeat stopped, or it did not "
         "enter the step within the step deadline; checked after " +
         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(check_after_).count()) +
         " ms of waiting): it failed, hangs, or is cut off by the network");
    return true;
  }

  /// Fails the transport (the first failure is kept for its messages), ends
  /// every pending wait (aborted), and closes every connection, so that the
  /// peers' requests on them fail at once.
  void fail(const std::string& what) {
    health_.fail(what);
    if (segment_.view) segment_.view->abort_all(); // peers waiting on the segment stop too
    if (p2p_) {
      p2p_->fail_all("the transport failed (first failure: " + health_.failure() + ")");
      p2p_->close(); // TCP: the peers' waits on this rank end at once
    }
    abort_pending();
    if (!closed_.exchange(true) && ctx_) ctx_->closeConnections();
  }

  /// A request is destroyed before it completed: Gloo keeps its place in the
  /// pair's queue (the pair cannot move past it), so the transport fails.
  /// An operation nobody waited for may have completed unseen (Gloo has no
  /// non-blocking test): a waiter thread then gets `abandon_grace` to
  /// collect its completion before the transport fails.
  void abandon(gloo_op& op) {
    bool pending, handed = false;
    {
      std::lock_guard lk(op.mu);
      pending = op.state == gloo_op::pending;
      if (pending && op.owner == gloo_op::unowned) {
        op.owner = gloo_op::waiter;
        handed = true;
      }
    }
    if (!pending) return;
    std::unique_lock lk(op.mu);
    if (handed) {
      lk.unlock();
      hand_to_waiter(find_pending(op));
      lk.lock();
      op.cv.wait_for(lk, abandon_grace, [&] { return op.state != gloo_op::pending; });
      if (op.state != gloo_op::pending) return;
    }
    lk.unlock();
    fail(op.describe(rank_) + " was abandoned before it completed");
    lk.lock();
    op.cv.wait(lk, [&] { return op.state != gloo_op::pending; });
  }

  /// gloo_request::wait of a posted operation: when nobody waits for it yet,
  /// blocks in Gloo's untimed wait in this thread, the watchdog thread
  /// aborting that wait at deadline `d`, or when the peer check says the
  /// peer is dead (through fail()). Returns with the outcome recorded in op
  /// (the caller reports it), or at once when a waiter thread owns op.
  /// @throws dpkit::timeout_error past `d` (op stays pending, as a request
  ///         whose wait timed out always did: it may be waited again, and
  ///         destroying it fails the transport).
  void wait_gloo(const std::shared_ptr<gloo_op>& op, deadline d) {
    {
      std::unique_lock lk(op->mu);
      if (op->state == gloo_op::pending && op->owner == gloo_op::waiter && !op->reclaim) {
        // Tested first (the pipelined tree): take it back from its waiter
        // thread while the message is still on its way, so that its arrival
        // wakes this thread, not the waiter's.
        op->reclaim = true;
        op->abort();
        op->cv.wait_until(lk, d, [&] { return op->state != gloo_op::pending || op->owner == gloo_op::unowned; });
      }
      if (op->state != gloo_op::pending || op->owner != gloo_op::unowned) return;
      op->owner = gloo_op::caller;
      op->timed_out = false;
    }
    watch(op, d);
    std::string err;
    const bool ok = gloo_wait(*op, err);
    unwatch(*op);
    if (!ok && err.empty()) {
      std::lock_guard lk(op->mu);
      if (op->timed_out && !health_.failed()) {
        op->owner = gloo_op::unowned; // Gloo consumed the abort: a later wait blocks again
        op->timed_out = false;
        throw timeout_error(op->describe(rank_) + " did not complete before its deadline");
      }
    }
    complete(op, ok, err);
  }

  /// gloo_request::test of a posted operation: true once it completed or
  /// failed. Gloo has no non-blocking test: the first test of an operation
  /// nobody waits for says false and nothing else (the pipelined tree then
  /// usually waits for it, in its own thread: no hand-off), the second hands
  /// it to a waiter thread, so that a loop of tests sees it complete.
  bool test_gloo(const std::shared_ptr<gloo_op>& op) {
    {
      std::lock_guard lk(op->mu);
      if (op->state != gloo_op::pending) return true;
      if (op->owner != gloo_op::unowned) return false;
      if (!op->tested) {
        op->tested = true;
        return false;
      }
      op->owner = gloo_op::waiter;
    }
    hand_to_waiter(op);
    std::lock_guard lk(op->mu);
    return op->state != gloo_op::pending;
  }

  /// The checks of a wait on the node's segment (gloo_transport::shm_poll):
  /// publishes this rank's current call, then throws peer_error when a rank
  /// of the node has ended (kill(pid, 0); an unreaped zombie is looked for
  /// every 50 ms, or at once when a peer aborted the segment) and
  /// mismatch_error when a peer runs another call at this call's sequence
  /// number; each failure first fails the transport. Nothing without a
  /// segment or once failed.
  void poll_node() {
    shm_segment* seg = shm();
    if (!seg || health_.failed()) return;
    const fingerprint mine = health_.current();
    seg->publish(mine);
    const auto now = clock::now().time_since_epoch();
    const auto last = clock::duration(last_zombie_check_.load(std::memory_order_relaxed));
    const bool zombies = now - last > std::chrono::milliseconds(50) || seg->aborted();
    if (zombies) last_zombie_check_.store(now.count(), std::memory_order_relaxed);
    if (const int p = seg->ended_peer(zombies); p >= 0) {
      const std::string what = "gloo_transport: rank " + std::to_string(rank_) + ": rank " + std::to_string(p) +
                               " (process " + std::to_string(seg->control(p).pid.load(std::memory_order_relaxed)) +
                               " on this node) has ended without leaving the collective";
      fail(what);
      throw peer_error(what);
    }
    fingerprint theirs;
    if (const int p = seg->other_call(mine, theirs); p >= 0) {
      const std::string what = mismatch_text(rank_, mine, p, theirs);
      fail(what);
      throw mismatch_error(what);
    }
  }

  /// Waits for a shared-memory send or receive (see gloo_request::wait):
  /// drives the engine, spinning (ranks with cores of their own), then
  /// yielding, then sleeping on this rank's doorbell; about every
  /// millisecond it runs poll_node, looks for a message of another
  /// collective from the peer and runs the peer check.
  /// @throws timeout_error past `d`; peer_error, mismatch_error as
  ///         poll_node and when the transport failed; dpkit::error when the
  ///         op itself failed (a receive whose length differs from its send's,
  ///         a damaged ring): the transport is then failed.
  void wait_p2p(shm_p2p_op& op, deadline d) {
    const int spins = p2p_->spin_polls(shm_spin_count(size_));
    const unsigned yields = p2p_->yield_polls(shm_yield_polls());
    clock::time_point start{}, next_check{};
    auto finished = [&] {
      if (op.state.load(std::memory_order_acquire) == shm_p2p_op::pending) p2p_->progress();
      switch (op.state.load(std::memory_order_acquire)) {
      case shm_p2p_op::done: return true;
      case shm_p2p_op::failed: {
        if (health_.failed())
          throw peer_error("gloo_transport: " + op.describe(rank_) + " stopped: the transport failed (first failure: " +
                           health_.failure() + ")");
        const std::string what = "gloo_transport: " + op.error;
        fail(what);
        if (op.peer_lost) throw peer_error(what); // its connection closed or broke
        throw error(what);
      }
      default: return false;
      }
    };
    auto timed = [&] {
      const auto now = clock::now();
      if (start == clock::time_point{}) {
        start = now;
        next_check = now + std::chrono::milliseconds(1);
      } else if (now >= next_check) {
        p2p_checks(op, now - start);
        next_check = now + std::chrono::milliseconds(1);
      }
      if (now >= d && !finished())
        throw timeout_error("gloo_transport: " + op.describe(rank_) + " did not complete before its deadline");
    };
    for (int i = 0; i < spins; ++i) {
      if (finished()) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    for (unsigned polls = 0;; ++polls) {
      if (finished()) return;
      if ((polls & 15u) == 0) timed();
      if (polls >= yields) {
        p2p_->sleep(1000);
        timed();
      } else {
        std::this_thread::yield();
      }
    }
  }

  /// A shared-memory request is destroyed before it completed: it is
  /// withdrawn and the transport fails (a half-sent message cannot be taken
  /// back; gloo_request's rule for Gloo's own requests).
  void abandon_p2p(shm_p2p_op& op) {
    if (p2p_ && p2p_->withdraw(op)) fail("gloo_transport: " + op.describe(rank_) + " was abandoned before it completed");
  }

private:
  // A shared-memory wait's checks (about every millisecond).
  void p2p_checks(shm_p2p_op& op, clock::duration waited) {
    if (health_.failed())
      throw peer_error("gloo_transport: " + op.describe(rank_) + " stopped: the transport failed (first failure: " +
                       health_.failure() + ")");
    // What a peer wrote before it closed its transport (aborting the
    // segment) or ended (the acknowledgement of this send, say) still
    // counts: after seeing either, this op is drained once more and
    // completes if it can; only an op still pending then fails. (A sender
    // whose receiver acknowledged, finished and closed before the sender
    // looked at its ring failed its completed send: CI, test_gloo_node
    // "sums" with 3 ranks.)
    const auto settled = [&] {
      p2p_->progress();
      return op.state.load(std::memory_order_acquire) != shm_p2p_op::pending;
    };
    try {
      poll_node();
    } catch (const peer_error&) {
      if (settled()) return; // the transport is failed for later calls; this op completed
      throw;
    }
    if (const int t = p2p_->foreign_message(op.peer, op.tag)) {
      const fingerprint mine = health_.current();
      const std::string what = "collective mismatch: rank " + std::to_string(rank_) + " runs " + mine.str() +
                               "; rank " + std::to_string(op.peer) +
                               " sent a message of another collective at the same sequence number (tag " +
                               std::to_string(t) + ")";
      fail(what);
      throw mismatch_error(what);
    }
    if (shm_segment* seg = shm(); seg && seg->aborted()) {
      if (settled()) return;
      // only clean closes of other ranks so far, and op's peer is still
      // here: this op may still complete (its deadline still holds)
      if (seg->peer_still_in(op.peer)) return;
      const std::string what = "gloo_transport: " + op.describe(rank_) +
                               " stopped: a rank of this node failed or closed its transport (it aborted the shared segment)";
      fail(what);
      throw peer_error(what);
    }
    if (peer_dead(op.peer, waited))
      throw peer_error("gloo_transport: " + op.describe(rank_) + " stopped: the transport failed (first failure: " +
                       health_.failure() + ")");
  }

  void abort_pending() {
    std::vector<std::shared_ptr<gloo_op>> ops;
    {
      std::lock_guard lk(mu_);
      ops.assign(pending_.begin(), pending_.end());
    }
    for (auto& op : ops) op->abort();
  }
  static constexpr auto abandon_grace = std::chrono::milliseconds(100);

  // Gloo's timed wait closes the whole context when it expires, so the wait
  // is untimed in effect (a year); the dpkit deadline is the request's,
  // enforced by aborting the wait (the watchdog, fail()). Returns Gloo's
  // result (false: aborted); what Gloo threw (a broken connection) goes to
  // `err` instead, and the result is then false.
  static bool gloo_wait(gloo_op& op, std::string& err) {
    constexpr auto forever = std::chrono::milliseconds(std::chrono::hours(24 * 365));
    try {
      return op.is_send ? op.buf->waitSend(nullptr, forever) : op.buf->waitRecv(nullptr, forever);
    } catch (const std::exception& e) {
      err = e.what();
      if (err.empty()) err = "unknown Gloo error";
    }
    return false;
  }

  // Records the outcome of op's Gloo wait (err: what Gloo threw) and fails
  // the transport when its connection broke.
  void complete(const std::shared_ptr<gloo_op>& op, bool ok, const std::string& err) {
    {
      std::lock_guard lk(mu_);
      pending_.erase(op);
    }
    {
      std::lock_guard lk(op->mu);
      op->state = !err.empty() ? gloo_op::failed : ok ? gloo_op::done : gloo_op::aborted;
      op->error = err;
    }
    op->cv.notify_all();
    if (!err.empty())
      fail(op->describe(rank_) + " failed: the connection to rank " + std::to_string(op->peer) + " broke (" + err +
           ")");
  }

  std::shared_ptr<gloo_op> find_pending(gloo_op& op) {
    std::lock_guard lk(mu_);
    for (auto& p : pending_)
      if (p.get() == &op) return p;
    return nullptr;
  }

  // Queues op (owner: waiter) for a waiter thread, starting one when none
  // is idle.
  void hand_to_waiter(std::shared_ptr<gloo_op> op) {
    if (!op) return;
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(op));
    if (idle_ >= queue_.size()) cv_.notify_one();
    else threads_.emplace_back([this] { waiter(); });
  }

  // A caller blocked in Gloo's wait for op until deadline d.
  struct watched_wait {
    std::shared_ptr<gloo_op> op;
    deadline due;
    clock::time_point start;
  };

  void watch(const std::shared_ptr<gloo_op>& op, deadline d) {
    std::lock_guard lk(watch_mu_);
    watched_.push_back({op, d, clock::now()});
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watchdog(); });
    else if (d < next_wake_ || (watched_.size() == 1 && has_check_.load(std::memory_order_relaxed)))
      watch_cv_.notify_one(); // a sooner deadline, or peer checks to start
  }
  void unwatch(gloo_op& op) {
    std::lock_guard lk(watch_mu_);
    for (auto it = watched_.begin(); it != watched_.end(); ++it)
      if (it->op.get() == &op) {
        *it = std::move(watched_.back());
        watched_.pop_back();
        return;
      }
  }

  // The watchdog thread: aborts the Gloo wait of a caller past its deadline
  // (the caller then throws timeout_error) and runs the peer check for the
  // callers' peers every 10 ms (a dead peer fails the transport, which
  // aborts every pending operation).
  void watchdog() {
    std::unique_lock lk(watch_mu_);
    while (!watch_stop_) {
      const auto now = clock::now();
      std::vector<std::shared_ptr<gloo_op>> expired;
      std::vector<std::pair<int, clock::duration>> peers;
      next_wake_ = now + std::chrono::seconds(1);
      for (std::size_t i = 0; i < watched_.size();) {
        if (watched_[i].due <= now) {
          expired.push_back(std::move(watched_[i].op));
          watched_[i] = std::move(watched_.back());
          watched_.pop_back();
          continue;
        }
        next_wake_ = std::min(next_wake_, watched_[i].due);
        peers.emplace_back(watched_[i].op->peer, now - watched_[i].start);
        ++i;
      }
      bool check = false;
      if (!peers.empty()) {
        std::lock_guard ck(check_mu_);
        check = static_cast<bool>(peer_check_);
      }
      if (check) next_wake_ = std::min(next_wake_, now + std::chrono::milliseconds(10));
      if (!expired.empty() || check) {
        lk.unlock();
        for (auto& op : expired) {
          std::lock_guard ol(op->mu);
          op->timed_out = true;
          op->abort();
        }
        if (check)
          for (auto& [peer, waited] : peers)
            if (peer_dead(peer, waited)) break; // fail() aborted every wait
        lk.lock();
        continue; // deadlines may have passed meanwhile
      }
      watch_cv_.wait_until(lk, next_wake_);
    }
  }

  // A waiter thread: takes the next posted operation and blocks in Gloo's
  // wait until it completes, fails (its connection broke) or is aborted.
  void waiter() {
    for (;;) {
      std::shared_ptr<gloo_op> op;
      {
        std::unique_lock lk(mu_);
        ++idle_;
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        --idle_;
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      std::string err;
      const bool ok = gloo_wait(*op, err);
      if (!ok && err.empty()) {
        std::lock_guard lk(op->mu);
        if (op->reclaim && !health_.failed()) { // wait_gloo took it back: not an outcome
          op->reclaim = false;
          op->owner = gloo_op::unowned;
          op->cv.notify_all();
          continue;
        }
      }
      complete(op, ok, err);
    }
  }

  int rank_, size_;
  comm_health health_;
  std::shared_ptr<kv_store> store_;
  std::string key_prefix_;
  gloo_options options_;
  std::uint64_t splits_ = 0;
  std::unique_ptr<::gloo::rendezvous::PrefixStore> prefixed_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::rendezvous::Context> ctx_;
  std::atomic<bool> closed_{false};
  std::mutex mu_; // pending_, queue_, idle_, stop_, threads_
  std::condition_variable cv_;
  std::unordered_set<std::shared_ptr<gloo_op>> pending_;
  std::deque<std::shared_ptr<gloo_op>> queue_;
  std::size_t idle_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  std::mutex watch_mu_; // watched_, next_wake_, watch_stop_, watchdog_
  std::condition_variable watch_cv_;
  std::vector<watched_wait> watched_;
  clock::time_point next_wake_{};
  bool watch_stop_ = false;
  std::thread watchdog_;
  std::mutex check_mu_; // the peer check's members
  std::function<bool(int)> peer_check_;
  std::atomic<bool> has_check_{false}; // peer_check_ is set (read without check_mu_)
  std::chrono::milliseconds check_after_{0}, check_every_{0};
  std::vector<clock::time_point> last_check_;
  store_segment segment_; // unmapped after the connections are closed
  std::unique_ptr<p2p_engine> p2p_; // shm: on segment_'s area, destroyed before it is unmapped
  sockaddr_storage addr_{}; // this rank's address (Gloo's device's), for tcp_p2p
  socklen_t addr_len_ = 0;
  std::atomic<clock::rep> last_zombie_check_{0}; // poll_node's last look for unreaped dead peers
};

} // namespace detail

/// A pending gloo_transport send or receive (models dpkit::request). Must be
/// completed or destroyed before its transport. Destroying an incomplete
/// request withdraws it (its buffer is never touched afterwards) and fails
/// the transport: Gloo cannot take a posted operation back out of its pair's
/// queue.
class gloo_request {
public:
  gloo_request() = default;
  /// Internal: wraps a posted operation of transport state `st`.
  gloo_request(std::shared_ptr<detail::gloo_op> op, detail::gloo_state* st) : op_(std::move(op)), st_(st) {}
  /// Internal: wraps a posted shared-memory operation of transport state `st`.
  gloo_request(std::shared_ptr<detail::shm_p2p_op> op, detail::gloo_state* st) : sop_(std::move(op)), st_(st) {}
  gloo_request(gloo_request&& o) noexcept : op_(std::move(o.op_)), sop_(std::move(o.sop_)), st_(o.st_) {}
  gloo_request& operator=(gloo_request&& o) noexcept {
    if (this != &o) {
      release();
      op_ = std::move(o.op_);
      sop_ = std::move(o.sop_);
      st_ = o.st_;
    }
    return *this;
  }
  ~gloo_request() { release(); }

  /// Blocks until the operation completed.
  /// @throws dpkit::timeout_error past deadline d (naming rank, peer, tag
  ///         and bytes; the transport is then failed by the collective that
  ///         waited); dpkit::peer_error when the connection to the peer
  ///         broke (the peer exited, crashed or closed its transport) or the
  ///         transport failed meanwhile (another request's peer, a timeout:
  ///         the message names the first failure).
  void wait(deadline d) {
    if (sop_) {
      st_->wait_p2p(*sop_, d);
      return;
    }
    if (!op_) return;
    st_->wait_gloo(op_, d); // blocks here unless a waiter thread owns the op
    const auto start = clock::now();
    for (;;) {
      {
        std::unique_lock lk(op_->mu);
        const auto until = std::min(d, clock::now() + std::chrono::milliseconds(10));
        op_->cv.wait_until(lk, until, [&] { return op_->state != detail::gloo_op::pending; });
        switch (op_->state) {
        case detail::gloo_op::done: return;
        case detail::gloo_op::failed:
          throw peer_error(op_->describe(st_->rank()) + " failed: the connection to rank " +
                           std::to_string(op_->peer) + " broke (" + op_->error + "): rank " +
                           std::to_string(op_->peer) + " failed, exited or closed its transport");
        case detail::gloo_op::aborted:
          throw peer_error(op_->describe(st_->rank()) + " stopped: the transport failed (first failure: " +
                           st_->health().failure() + ")");
        case detail::gloo_op::pending: break;
        }
      }
      if (clock::now() >= d)
        throw timeout_error(op_->describe(st_->rank()) + " did not complete before its deadline");
      // Gloo reports a broken connection only to the operations pending on
      // it, and only once the pair reads from it: a send to a peer that died
      // (a tree all-reduce sending up to a dead parent) can stay pending
      // until the deadline. The peer check (an elastic group's heartbeats)
      // ends it sooner: the transport fails and this op is aborted.
      st_->peer_dead(op_->peer, clock::now() - start);
    }
  }
  /// True once the operation completed (or failed: wait() then throws).
  /// Over TCP the first test of a request nobody waits for may say false
  /// although it completed (Gloo has no non-blocking test); later tests see
  /// it.
  bool test() const {
    if (sop_) {
      if (sop_->state.load(std::memory_order_acquire) == detail::shm_p2p_op::pending) st_->p2p()->progress();
      return sop_->state.load(std::memory_order_acquire) != detail::shm_p2p_op::pending;
    }
    if (!op_) return true;
    return st_->test_gloo(op_);
  }
  /// Payload bytes of this request.
  std::size_t bytes() const noexcept { return op_ ? op_->bytes : sop_ ? sop_->bytes : 0; }

private:
  void release() noexcept {
    if (sop_) {
      st_->abandon_p2p(*sop_);
      sop_.reset();
    }
    if (!op_) return;
    st_->abandon(*op_);
    op_.reset();
  }
  std::shared_ptr<detail::gloo_op> op_;
  std::shared_ptr<detail::shm_p2p_op> sop_; // a message over the node's shared memory instead
  detail::gloo_state* st_ = nullptr;
};

/// A pending receive from whichever rank sends first with its tag
/// (gloo_transport::irecv_any; MPI_ANY_SOURCE's semantics): until a message
/// with the tag has arrived from some rank, nothing is posted; then a
/// receive from that rank takes it, and the request is that receive.
class gloo_any_request {
public:
  gloo_any_request() = default;
  /// Internal: a receive of `data` with `tag` over transport state `st`.
  gloo_any_request(std::span<std::byte> data, int tag, detail::gloo_state* st) : data_(data), tag_(tag), st_(st) {}
  gloo_any_request(gloo_any_request&&) noexcept = default;
  gloo_any_request& operator=(gloo_any_request&&) noexcept = default;

  /// Blocks until a message with the tag arrived from some rank and was
  /// received (source() names it).
  /// @throws dpkit::timeout_error past deadline d (naming the rank, the tag
  ///         and the bytes); dpkit::peer_error when the transport failed
  ///         meanwhile; what gloo_request::wait throws once matched (a
  ///         message of another length: dpkit::error naming both).
  void wait(deadline d) {
    for (unsigned polls = 0; !matched(); ++polls) {
      if (st_->health().failed())
        throw peer_error("gloo_transport: rank " + std::to_string(st_->rank()) + ": receive from any rank (tag " +
                         std::to_string(tag_) + ") stopped: the transport failed (first failure: " +
                         st_->health().failure() + ")");
      if (clock::now() >= d)
        throw timeout_error("gloo_transport: rank " + std::to_string(st_->rank()) + ": receive from any rank (tag " +
                            std::to_string(tag_) + ", " + std::to_string(data_.size()) +
                            " bytes) did not complete before its deadline: no rank sent a message with this tag");
      if (polls < 64) std::this_thread::yield();
      else st_->p2p()->sleep(1000);
    }
    inner_.wait(d);
  }
  /// True once the message arrived and was received.
  bool test() { return matched() && inner_.test(); }
  /// The rank the message came from, or -1 before one arrived.
  int source() const noexcept { return source_; }
  /// Payload bytes of this request.
  std::size_t bytes() const noexcept { return data_.size(); }

private:
  // Posts the receive once a rank's message with the tag has arrived.
  bool matched() {
    if (source_ >= 0) return true;
    const int p = st_->p2p()->probe(tag_, next_);
    if (p < 0) return false;
    source_ = p;
    inner_ = gloo_request(st_->p2p()->post_recv(data_.data(), data_.size(), p, tag_), st_);
    return true;
  }
  std::span<std::byte> data_;
  int tag_ = 0;
  detail::gloo_state* st_ = nullptr;
  int source_ = -1;
  int next_ = 0;
  gloo_request inner_;
};

/// A group of ranks connected by Gloo's TCP transport (models
/// dpkit::transport, checked_transport, scratch_transport, async_transport,
/// splittable_transport, shared_memory_transport, hierarchical_transport):
/// dpkit's transport for processes started without MPI (torchrun,
/// `accelerate launch`, srun, a Kubernetes operator, or by hand).
/// Every dpkit algorithm (ring, tree, dissemination barrier, the shm
/// collectives, the hierarchy, the dispatchers' non-native choices) runs on
/// it unchanged; it has no native collectives and no device memory.
///
/// Nodes without MPI (transport/detail/store_bootstrap.hpp): before
/// connecting, every rank declares its node (host name, boot id and
/// /dev/shm) and its world size in the store, so ranks that disagree on the
/// world size fail at once, naming both. When every rank is on one node they
/// map one shared segment (a POSIX shared-memory object the lowest rank
/// creates and unlinks once every rank has it mapped: a kill -9 leaves
/// nothing in /dev/shm), and `automatic` runs the shm collectives on it
/// while ring, tree and the barrier send their messages through it;
/// across nodes the constructor builds node_transport() (each node's ranks,
/// with their segment) and cross_transport() through the same store, and
/// the hierarchical collectives run on them, as on dpkit::mpi.
/// DPKIT_SHM_BYTES and DPKIT_RANKS_PER_NODE mean what they mean there.
///
/// Each of the `size` ranks, in any processes on any hosts that reach each
/// other over TCP, constructs one with the same store URL and its own rank;
/// the constructor returns once all of them are connected. Movable, not
/// copyable; used by one thread at a time (plus its own communication
/// thread). Recovery from any failure: a new gloo_transport on every live
/// rank, under a new gloo_options::prefix.
class gloo_transport {
public:
  /// Joins the group `store_url` names as rank `rank` of `size`: writes
  /// this rank's addresses to the store, reads everyone else's, and connects
  /// a TCP pair to each other rank (Gloo's full-mesh rendezvous).
  /// @param store_url `file:///dir` (a directory on a file system every
  ///        rank sees; created if missing) or `redis://host:port/job` (a
  ///        Redis server; the job name namespaces the keys). The keys of one
  ///        rendezvous are written once: ranks meeting again through the
  ///        same store pass a new gloo_options::prefix.
  /// @param rank this rank, in [0, size).
  /// @param size number of ranks, >= 1.
  /// @throws dpkit::invalid_argument for a bad URL (naming it), rank or size;
  ///         dpkit::timeout_error when the other ranks do not all arrive
  ///         within o.timeout; dpkit::error when the store or the
  ///         network cannot be used (unreachable Redis server, stale keys of
  ///         an earlier group under the same prefix, no such interface).
  gloo_transport(const std::string& store_url, int rank, int size, const gloo_options& o = {})
      : st_(make_state(&store_url, rank, size)), arena_(std::make_unique<detail::scratch_arena>()),
        progress_(std::make_unique<progress_thread>()) {
    detail::gloo_ignore_sigpipe();
    st_->attach(store_url, o);
    setup(nullptr);
  }
  /// Joins a group through an open store (what dpkit::elastic_group uses to
  /// share one store connection among its generations): the rendezvous keys
  /// are under `key_prefix` (+ "/" + o.prefix). Otherwise as above.
  gloo_transport(std::shared_ptr<detail::kv_store> store, const std::string& key_prefix, int rank, int size,
                 const gloo_options& o = {})
      : gloo_transport(std::move(store), key_prefix, rank, size, o, nullptr) {}
  gloo_transport(gloo_transport&&) = default;
  gloo_transport& operator=(gloo_transport&&) = default;
  gloo_transport(const gloo_transport&) = delete;
  gloo_transport& operator=(const gloo_transport&) = delete;
  /// Finishes queued asynchronous collectives, then closes the connections
  /// (peers still waiting on this rank get peer_error).
  ~gloo_transport() = default;

  /// Installs a peer check: `alive(peer)` (peer a rank of this transport)
  /// is called by a wait that has lasted `after`, at most every `every` per
  /// peer, and when it returns false the transport fails (peer_error on
  /// every pending and later request, naming the peer). It finds a dead
  /// peer that Gloo's connections do not report, e.g. while this rank's only
  /// pending operation is a send to it. elastic_group installs its heartbeat
  /// check. `alive` may be called from any thread that waits (the
  /// communication thread too): it must be thread-safe. An empty function
  /// removes the check.
  void set_peer_check(std::function<bool(int peer)> alive, std::chrono::milliseconds after,
                      std::chrono::milliseconds every) {
    // The hierarchy's parts check the same peers, by their ranks here: a
    // node leader waiting on a cut-off node in the cross-node stage waited
    // for its deadline (an elastic group across 3 nodes, one partitioned
    // off: 62 s, the step timeout, instead of dead_after)
    if (node_ || cross_) {
      std::vector<std::vector<int>> by_node(static_cast<std::size_t>(topo_.nodes()));
      for (int r = 0; r < size(); ++r) by_node[static_cast<std::size_t>(topo_.node_of(r))].push_back(r);
      const auto mapped = [&](std::vector<int> ranks) -> std::function<bool(int)> {
        if (!alive) return {};
        return [alive, ranks = std::move(ranks)](int r) { return alive(ranks[static_cast<std::size_t>(r)]); };
      };
      if (node_) node_->set_peer_check(mapped(by_node[static_cast<std::size_t>(topo_.node())]), after, every);
      if (cross_) {
        std::vector<int> ranks;
        for (const auto& members : by_node) ranks.push_back(members[static_cast<std::size_t>(topo_.local_rank())]);
        cross_->set_peer_check(mapped(std::move(ranks)), after, every);
      }
    }
    st_->set_peer_check(std::move(alive), after, every);
  }

  /// This rank, in [0, size()).
  int rank() const noexcept { return st_->rank(); }
  /// Number of ranks.
  int size() const noexcept { return st_->size(); }
  /// Host memory only.
  static constexpr bool accepts(memory_space s) noexcept { return s == memory_space::host; }

  /// Starts sending `data` to rank `peer` with `tag`. The buffer must stay
  /// valid and unchanged until the request completes.
  /// @throws dpkit::invalid_argument if peer is out of range or this rank;
  ///         dpkit::peer_error if the connection to peer is already broken.
  gloo_request isend(std::span<const std::byte> data, int peer, int tag) {
    check_peer(peer, "isend");
    if (detail::p2p_engine* ch = st_->p2p()) {
      post_check(true, peer, tag);
      return {ch->post_send(data.data(), data.size(), peer, tag), st_.get()};
    }
    return {st_->post(true, const_cast<std::byte*>(data.data()), data.size(), peer, tag), st_.get()};
  }
  /// Starts receiving exactly data.size() bytes with `tag` from whichever
  /// rank's message arrives first (any_source_transport; MPI_ANY_SOURCE).
  /// Over dpkit's own connections only (shared memory, TCP).
  /// @throws dpkit::invalid_argument with DPKIT_TCP_P2P=0 (Gloo's unbound
  ///         buffers: the transport sees no message before its receive);
  ///         dpkit::communicator_error if the transport failed earlier.
  gloo_any_request irecv_any(std::span<std::byte> data, int tag) {
    if (!st_->p2p())
      throw invalid_argument("gloo_transport::irecv_any: rank " + std::to_string(rank()) +
                             ": a receive from any rank needs dpkit's own connections (DPKIT_TCP_P2P=0 turned them "
                             "off)");
    health().check("gloo_transport::irecv_any", rank());
    return {data, tag, st_.get()};
  }
  /// Starts receiving exactly data.size() bytes from rank `peer` with `tag`
  /// (a receive longer than its send completes early with the send's bytes
  /// and one shorter fails Gloo: matching lengths are the caller's
  /// precondition, as on every dpkit transport).
  /// @throws dpkit::invalid_argument if peer is out of range or this rank;
  ///         dpkit::peer_error if the connection to peer is already broken.
  gloo_request irecv(std::span<std::byte> data, int peer, int tag) {
    check_peer(peer, "irecv");
    if (detail::p2p_engine* ch = st_->p2p()) {
      post_check(false, peer, tag);
      return {ch->post_recv(data.data(), data.size(), peer, tag), st_.get()};
    }
    return {st_->post(false, data.data(), data.size(), peer, tag), st_.get()};
  }

  /// Collective health (checked_transport): sequence numbers, current
  /// fingerprint, first failure. Messages carry checked tags, so a peer
  /// running another collective never matches them (the wait ends at the
  /// deadline, or earlier when a peer fails).
  detail::comm_health& health() noexcept { return st_->health(); }
  /// Fails this transport and closes its connections: every peer's pending
  /// and later requests with this rank throw peer_error within milliseconds
  /// (checked_transport).
  void report_failure(const std::string& what) {
    st_->fail("rank " + std::to_string(rank()) + " failed: " + what);
  }

  /// Splits the group as MPI_Comm_split (splittable_transport): a
  /// collective call of every rank; the ranks that pass the same `color`
  /// form a new gloo_transport (its own connections, so its messages never
  /// meet this one's), ranked by (key, rank). The ranks exchange (color,
  /// key) with point-to-point messages on reserved tag 3, then each color
  /// meets through the same store under this group's key prefix +
  /// "/split/<k>/<color>" (k: the split's number on this transport). The
  /// result does not depend on this transport afterwards.
  /// @param color >= 0.
  /// @param timeout limit of the exchange and of the new group's rendezvous.
  /// @throws dpkit::invalid_argument if color < 0; dpkit::timeout_error or
  ///         dpkit::peer_error when a rank does not take part in time or
  ///         fails (this transport is then failed); as the constructor.
  gloo_transport split(int color, int key, std::chrono::milliseconds timeout = env_default_timeout()) {
    if (color < 0)
      throw invalid_argument("gloo_transport::split: rank " + std::to_string(rank()) + ": color must be >= 0, got " +
                             std::to_string(color));
    health().check("gloo_transport::split", rank());
    const int n = size(), r = rank();
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(n));
    all[2 * static_cast<std::size_t>(r)] = color;
    all[2 * static_cast<std::size_t>(r) + 1] = key;
    const auto mine = std::as_bytes(std::span(all).subspan(2 * static_cast<std::size_t>(r), 2));
    constexpr int split_tag = 3;
    const deadline due = deadline_after(timeout);
    {
      std::vector<gloo_request> reqs;
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        reqs.push_back(isend(mine, p, split_tag));
        reqs.push_back(irecv(std::as_writable_bytes(std::span(all).subspan(2 * static_cast<std::size_t>(p), 2)), p,
                             split_tag));
      }
      const std::string ctx = "gloo_transport::split: rank " + std::to_string(r) + ": ";
      try {
        for (auto& q : reqs) q.wait(due);
      } catch (const timeout_error& e) {
        report_failure(ctx + e.what());
        throw timeout_error(ctx + e.what());
      } catch (const peer_error& e) {
        report_failure(ctx + e.what());
        throw peer_error(ctx + e.what());
      }
    }
    std::vector<int> members;
    for (int p = 0; p < n; ++p)
      if (all[2 * static_cast<std::size_t>(p)] == color) members.push_back(p);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1];
    });
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    gloo_options o = st_->options();
    o.prefix.clear();
    o.timeout = timeout;
    const std::string prefix =
        st_->key_prefix() + "/split/" + std::to_string(st_->next_split()) + "/" + std::to_string(color);
    return gloo_transport(st_->store(), prefix, new_rank, static_cast<int>(members.size()), o);
  }

  /// Which node each rank is on (hierarchical_transport): found through
  /// the store at construction (host name, boot id and /dev/shm; see
  /// transport/detail/store_bootstrap.hpp), subdivided by
  /// DPKIT_RANKS_PER_NODE as on dpkit::mpi.
  const node_topology& topology() const noexcept { return topo_; }
  /// The transport over this rank's node (with the node's shared segment),
  /// or nullptr when !topology().hierarchical() (hierarchical_transport).
  /// Owned by this one.
  gloo_transport* node_transport() noexcept { return node_.get(); }
  /// The transport over this rank's peers on the other nodes (uniform
  /// layout: the ranks with its local rank; otherwise the nodes' leaders,
  /// and nullptr on the other ranks), or nullptr when
  /// !topology().hierarchical() (hierarchical_transport). Owned by this one.
  gloo_transport* cross_transport() noexcept { return cross_.get(); }
  /// This rank's view of the node's shared segment (shared_memory_transport):
  /// a POSIX shared-memory object every rank of the node maps, set up
  /// through the store when every rank is on one node (unlinked once all
  /// have it mapped: nothing is left in /dev/shm after a kill); nullptr
  /// across nodes, for one rank, or with DPKIT_SHM_BYTES=0.
  detail::shm_segment* shm() noexcept { return st_->shm(); }
  /// True when this rank's point-to-point messages (isend/irecv: ring, tree,
  /// the barrier) go through the node's shared segment instead of TCP: every
  /// rank on one node, a segment mapped (not DPKIT_SHM_BYTES=0), more than
  /// one rank. In a hierarchy, node_transport()'s messages do and the
  /// top-level and cross transports' go over TCP.
  bool shm_messages() const noexcept { return st_->p2p_shm(); }
  /// True when this rank's point-to-point messages go over dpkit's own TCP
  /// connections (detail/tcp_p2p.hpp: eager, driven by the waiting thread)
  /// rather than Gloo's pairs: every group whose ranks are not all on one
  /// node with a shared segment, unless DPKIT_TCP_P2P=0.
  bool tcp_messages() const noexcept { return st_->p2p_tcp(); }
  /// Called by waits on the segment about every millisecond
  /// (shared_memory_transport): publishes this rank's current call, then
  /// throws peer_error when a rank of the node has ended (its process no
  /// longer exists: kill(pid, 0); or is a zombie its launcher has not
  /// reaped yet, looked for every 50 ms), mismatch_error when a waiting peer runs
  /// another call at this call's sequence number (naming both), and
  /// communicator_error when this transport failed; each failure first
  /// fails the transport (its peers' waits end too).
  /// The peer check (set_peer_check: an elastic group's heartbeats and
  /// step deadline) runs here too, on `peer` once this wait for it has
  /// lasted the check's `after`: a peer whose process lives but is stopped
  /// (SIGSTOP) or stuck fails the transport instead of holding the wait to
  /// its deadline.
  void shm_poll(int peer, int tag) {
    st_->poll_node();
    health().check("shm", rank());
    // one wait: the calls for the same peer and tag, each within 50 ms of the last
    struct wait_track {
      const void* transport = nullptr;
      int peer = -1, tag = 0;
      clock::time_point start{}, last{};
    };
    thread_local wait_track w;
    const auto now = clock::now();
    if (w.transport != this || w.peer != peer || w.tag != tag || now - w.last > std::chrono::milliseconds(50)) {
      w.transport = this;
      w.peer = peer;
      w.tag = tag;
      w.start = now;
    }
    w.last = now;
    if (peer >= 0 && peer < size() && peer != rank() && st_->peer_dead(peer, now - w.start))
      health().check("shm", rank()); // failed by the peer check: throws naming it
  }

  /// This rank's communication thread (runs *_async collectives in order).
  progress_thread& progress() { return *progress_; }
  /// Host scratch reused by this rank's collectives (internal).
  detail::scratch_arena& scratch() { return *arena_; }

private:
  // Joins through an open store with the node layout given (the node and
  // cross-node parts of a hierarchy) or found through the store (nullptr).
  gloo_transport(std::shared_ptr<detail::kv_store> store, const std::string& key_prefix, int rank, int size,
                 const gloo_options& o, const node_layout* layout)
      : st_(make_state(nullptr, rank, size)), arena_(std::make_unique<detail::scratch_arena>()),
        progress_(std::make_unique<progress_thread>()) {
    detail::gloo_ignore_sigpipe();
    st_->attach(std::move(store), key_prefix, o);
    setup(layout);
  }
  // The node rendezvous (unless `layout` is given: then no store traffic),
  // the connections, then the node's shared segment (every rank on one node)
  // or the hierarchy's sub-transports (several nodes); see the class comment.
  void setup(const node_layout* layout) {
    const std::string where = st_->where();
    const deadline due = deadline_after(st_->options().timeout);
    const std::size_t slot = detail::shm_bytes_from_env(4u << 20);
    if (slot > 0) (void)detail::shm_p2p_cma_bytes(); // a malformed DPKIT_SHM_CMA(_BYTES) throws before any rendezvous
    const bool own_tcp = detail::tcp_p2p_enabled();  // so does a malformed DPKIT_TCP_P2P
    auto& store = *st_->store();
    const std::string& prefix = st_->key_prefix();
    if (layout) topo_ = node_topology(*layout, rank());
    else if (size() > 1)
      topo_ = node_topology(
          node_layout::canonicalize(detail::store_node_labels(store, prefix + "/nodes", rank(), size(), slot, due, where)),
          rank());
    else topo_ = node_topology(node_layout::single(1), 0);
    st_->connect();
    if (size() > 1 && topo_.nodes() == 1 && slot > 0)
      st_->set_segment(detail::store_map_segment(store, prefix + "/shm", rank(), size(), slot, due, where, true));
    if (size() > 1 && !st_->p2p() && own_tcp) st_->connect_tcp(due);
    if (!topo_.hierarchical()) return;
    gloo_options o = st_->options();
    o.prefix.clear();
    const node_layout node_l = node_layout::single(topo_.local_size());
    node_.reset(new gloo_transport(st_->store(), prefix + "/node/" + std::to_string(topo_.node()), topo_.local_rank(),
                                   topo_.local_size(), o, &node_l));
    if (topo_.uniform() || topo_.local_rank() == 0) {
      // ranked by node, so cross rank k is on node k
      const node_layout cross_l = node_layout::blocks(topo_.nodes(), 1);
      cross_.reset(new gloo_transport(st_->store(), prefix + "/cross/" + std::to_string(topo_.local_rank()),
                                      topo_.node(), topo_.nodes(), o, &cross_l));
    }
  }

  // Checks rank, size and (when given) the URL before anything is opened.
  static std::unique_ptr<detail::gloo_state> make_state(const std::string* url, int rank, int size) {
    if (size < 1) throw invalid_argument("gloo_transport: world size must be >= 1, got " + std::to_string(size));
    if (rank < 0 || rank >= size)
      throw invalid_argument("gloo_transport: rank " + std::to_string(rank) + " out of range for world size " +
                             std::to_string(size));
    if (url) (void)detail::parse_gloo_store_url(*url); // a bad URL is an invalid_argument before anything else
    return std::make_unique<detail::gloo_state>(rank, size);
  }
  std::string where_rank() const { return "gloo_transport: rank " + std::to_string(rank()); }
  // A request posted on a failed transport: peer_error (as Gloo's post).
  void post_check(bool is_send, int peer, int tag) {
    if (st_->health().failed())
      throw peer_error(where_rank() + ": " + (is_send ? "send to" : "receive from") + " rank " + std::to_string(peer) +
                       " (tag " + std::to_string(tag) + "): the transport failed earlier (first failure: " +
                       st_->health().failure() + ")");
  }
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size() || peer == rank())
      throw invalid_argument(std::string("gloo_transport::") + what + ": rank " + std::to_string(rank()) +
                             ": peer rank " + std::to_string(peer) +
                             (peer == rank() ? " is this rank (Gloo has no pair to itself)"
                                             : " out of range for world size " + std::to_string(size())));
  }

  // Destroyed in reverse: the communication thread first (its collectives
  // use the state), then the arena, then the state (waiters, connections).
  std::unique_ptr<detail::gloo_state> st_;
  std::unique_ptr<detail::scratch_arena> arena_;
  std::unique_ptr<progress_thread> progress_;
  node_topology topo_;
  std::unique_ptr<gloo_transport> node_, cross_; // the hierarchy's parts (several nodes)
};

} // namespace dpkit

// -DDPKIT_EXTERN_TEMPLATES: the collective algorithm bodies for this
// transport are compiled in one TU of the program, not here
// (extern_templates.hpp says how and why).
#ifdef DPKIT_EXTERN_TEMPLATES
#include "../extern_templates.hpp"
DPKIT_INSTANTIATE_COLLECTIVES(extern, ::dpkit::gloo_transport)
#endif
