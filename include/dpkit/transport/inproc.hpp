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
#include "detail/health.hpp"
#include "detail/shm_segment.hpp"
#include "topology.hpp"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
  inproc_request(std::shared_ptr<detail::inproc_op> op, detail::inproc_mailbox* box, inproc_world* world, int rank,
                 int peer, int tag, bool is_send, std::size_t bytes)
      : op_(std::move(op)), box_(box), world_(world), rank_(rank), peer_(peer), tag_(tag), is_send_(is_send),
        bytes_(bytes) {}
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

  /// Blocks until complete. While waiting it watches the world: a failed
  /// world (another rank threw or reported a fault), a peer that already
  /// returned from its function, or a peer that runs a different collective
  /// (a message of the same sequence number with another fingerprint) end the
  /// wait at once instead of at the deadline.
  /// @throws dpkit::timeout_error past deadline d (naming rank, peer and tag);
  ///         dpkit::peer_error (another rank failed or returned);
  ///         dpkit::mismatch_error (the peer runs another collective);
  ///         dpkit::error if the message was mismatched (receive shorter than send).
  void wait(deadline d);
  /// Payload bytes of this request.
  std::size_t bytes() const noexcept { return bytes_; }
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
    std::swap(world_, o.world_);
    std::swap(bytes_, o.bytes_);
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
  inproc_world* world_ = nullptr;
  int rank_ = 0, peer_ = 0, tag_ = 0;
  bool is_send_ = false;
  std::size_t bytes_ = 0;
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

  /// This rank's collective health (checked_transport): sequence numbers,
  /// current fingerprint, first failure.
  detail::comm_health& health() noexcept;
  /// Fails this rank's transport and the whole world: every rank's pending
  /// and later waits throw peer_error naming this rank (checked_transport).
  void report_failure(const std::string& what);

  /// This rank's view of the world's shared segment (shared_memory_transport),
  /// or nullptr when the world was created with shm_bytes == 0.
  detail::shm_segment* shm() noexcept;
  /// Throws peer_error / mismatch_error when the world failed, rank `peer`
  /// already returned from its function, or a peer sent this rank a message
  /// of another collective at the sequence number of `tag`
  /// (shared_memory_transport).
  void shm_poll(int peer, int tag);

  /// This rank's communication thread (runs *_async collectives in order).
  progress_thread& progress() { return *progress_; }
  /// Host scratch reused by this rank's collectives (internal).
  detail::scratch_arena& scratch() { return *arena_; }
  /// The world this rank belongs to.
  inproc_world& world() const noexcept { return *world_; }

  /// Which virtual node each rank is on (hierarchical_transport): the layout
  /// the world was created with (one node by default).
  const node_topology& topology() const noexcept;
  /// This rank's endpoint in the world of its node's ranks (with the node's
  /// shared segment), or nullptr when !topology().hierarchical()
  /// (hierarchical_transport). Created on first use; owned by this endpoint.
  inproc* node_transport();
  /// This rank's endpoint among its peers on the other nodes (uniform layout:
  /// the ranks with its local rank; otherwise the nodes' leaders, nullptr on
  /// the others), or nullptr when !topology().hierarchical()
  /// (hierarchical_transport). Created on first use; owned by this endpoint.
  inproc* cross_transport();
  /// Splits the world as MPI_Comm_split (splittable_transport): a collective
  /// call of every rank of the world; the ranks that pass the same `color`
  /// form a new world (a transport of its own: its messages never match this
  /// one's), ranked by (key, rank). The new world's virtual nodes are this
  /// world's, restricted to its ranks; it has a shared segment when they are
  /// on one node. A failure of either world fails the other. The returned
  /// endpoint keeps its world alive; it must be destroyed before this world.
  /// @param color >= 0.
  /// @param timeout how long to wait for the other ranks to call split.
  /// @throws dpkit::invalid_argument if color < 0; dpkit::timeout_error if a
  ///         rank does not call split within `timeout`; dpkit::peer_error if
  ///         the world failed or a rank returned from its function meanwhile.
  inproc split(int color, int key, std::chrono::milliseconds timeout = env_default_timeout());

  inproc(const inproc&) = delete;
  inproc& operator=(const inproc&) = delete;
  inproc(inproc&&) = default;
  inproc& operator=(inproc&&) = default;
  ~inproc() = default;

private:
  friend class inproc_world;
  inproc(inproc_world* w, int r, std::shared_ptr<inproc_world> keep = nullptr)
      : keep_(std::move(keep)), world_(w), rank_(r), arena_(std::make_unique<detail::scratch_arena>()),
        progress_(std::make_unique<progress_thread>()) {}
  void check_peer(int peer, const char* what) const;

  std::shared_ptr<inproc_world> keep_; // a world made by split: kept alive by its endpoints
  inproc_world* world_;
  int rank_;
  // hierarchy endpoints (node_transport, cross_transport); before progress_,
  // so the communication thread (which may run a hierarchical collective on
  // them) is joined first
  std::unique_ptr<inproc> node_, cross_;
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
  /// @param shm_bytes capacity in bytes of each of a rank's two buffers in
  ///        the world's shared segment (the shm algorithms; larger messages go
  ///        through it in chunks); 0: no segment. Default: DPKIT_SHM_BYTES,
  ///        else 256 KiB.
  /// @throws dpkit::invalid_argument if world_size <= 0 or shm_bytes is in (0, 64).
  explicit inproc_world(int world_size, const device_ops* ops = nullptr,
                        std::size_t shm_bytes = detail::shm_bytes_from_env(256u << 10))
      : size_(world_size), ops_(ops) {
    if (world_size <= 0)
      throw invalid_argument("inproc_world: world size must be >= 1, got " + std::to_string(world_size));
    init(node_layout::single(world_size), shm_bytes);
  }
  /// Creates a world whose ranks sit on the virtual nodes of `layout`
  /// (layout.size() ranks), as ranks of a multi-node job would: each rank's
  /// topology() reports its node and local rank, the world has no shared
  /// segment of its own when it spans several nodes (as dpkit::mpi across
  /// hosts), and each node gets a world of its own with a shared segment
  /// (node_transport()) plus the worlds of the cross-node peers
  /// (cross_transport()), on which the hierarchical collectives run. Lets
  /// every multi-node algorithm run in one process.
  /// @param layout node of every rank (node_layout::blocks(2, 3): 2 nodes of
  ///        3 ranks); any labelling, made canonical.
  /// @param ops, shm_bytes as the other constructor (shm_bytes sizes each
  ///        node's segment).
  /// @throws dpkit::invalid_argument if the layout is empty or shm_bytes is in (0, 64).
  explicit inproc_world(const node_layout& layout, const device_ops* ops = nullptr,
                        std::size_t shm_bytes = detail::shm_bytes_from_env(256u << 10))
      : size_(layout.size()), ops_(ops) {
    if (size_ <= 0) throw invalid_argument("inproc_world: the node layout has no ranks");
    std::vector<long long> labels(layout.node_of.begin(), layout.node_of.end());
    init(node_layout::canonicalize(labels), shm_bytes);
  }
  /// Detaches from the parent world (a world made by split).
  ~inproc_world() {
    if (parent_) parent_->remove_child(this);
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

  /// Runs f(inproc&) on size() threads, one per rank, and joins them. A rank
  /// whose f throws fails the world at once: the other ranks' waits throw
  /// dpkit::peer_error naming it (within milliseconds, not at the deadline);
  /// a rank whose f returns while a peer still waits for it makes that wait
  /// throw peer_error too. After all threads ended, the first cause is
  /// rethrown: the exception of the first rank that failed by itself (not as
  /// a consequence of another rank's failure), else the first one.
  template <class F>
  void run(F&& f) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size_));
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(size_));
    std::atomic<int> first_cause{-1};
    // A new run: no rank has returned yet (the flags of an earlier run would
    // make waits on a peer that simply finished that run fail).
    for (int r = 0; r < size_; ++r) clear_exited(r);
    for (int r = 0; r < size_; ++r)
      threads.emplace_back([&, r] {
        try {
          inproc comm(this, r);
          f(comm);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
          const bool consequence = dynamic_cast<const peer_error*>(&e) || dynamic_cast<const communicator_error*>(&e);
          int none = -1;
          if (!consequence) first_cause.compare_exchange_strong(none, r);
          fail(r, std::string("rank ") + std::to_string(r) + " threw: " + e.what());
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
          int none = -1;
          first_cause.compare_exchange_strong(none, r);
          fail(r, "rank " + std::to_string(r) + " threw a non-standard exception");
        }
        mark_exited(r);
      });
    for (auto& t : threads) t.join();
    if (const int c = first_cause.load(); c >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(c)]);
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  /// True once a rank failed; failure() names the first failure.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// The first failure's description ("" if none).
  std::string failure() const {
    std::lock_guard lk(fail_mu_);
    return failure_;
  }

  /// Fails the world (first call wins): records `what`, fails every rank's
  /// health, and wakes every pending send and receive, whose waits then throw
  /// dpkit::peer_error (or dpkit::mismatch_error when `mismatch`).
  void fail(int rank, const std::string& what, bool mismatch = false) {
    {
      std::lock_guard lk(fail_mu_);
      if (failing_) return;
      failing_ = true;
      failure_ = what;
      failed_rank_ = rank;
      mismatch_ = mismatch;
    }
    // Every rank's health fails before the world reads as failed: a rank
    // whose wait ends on failed() and that calls again at once must find its
    // transport failed (communicator_error), not start a new collective.
    for (int r = 0; r < size_; ++r) ranks_[static_cast<std::size_t>(r)].health.fail(what);
    failed_.store(true, std::memory_order_release);
    if (shm_block_) ranks_[0].shm->abort_all();
    wake_all();
    // A world and the worlds split from it (and its nodes' worlds) fail
    // together: a rank waiting in any of them stops at once.
    {
      std::lock_guard lk(split_mu_);
      for (auto& c : children_) c.world->fail(-1, what, mismatch);
    }
    if (parent_) parent_->fail(-1, what, mismatch);
    split_cv_.notify_all();
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
  friend class inproc_request;
  struct rank_state {
    detail::comm_health health;
    std::atomic<bool> exited{false};
    std::unique_ptr<detail::shm_segment> shm;
    node_topology topo;
    int node_world = -1, node_rank = -1;   // hier_ index and rank of its node's world
    int cross_world = -1, cross_rank = -1; // hier_ index and rank of its cross-node world
    std::uint64_t splits = 0;              // split calls so far (under split_mu_)
  };
  detail::inproc_mailbox& box(int r) { return boxes_[static_cast<std::size_t>(r)]; }
  rank_state& state(int r) { return ranks_[static_cast<std::size_t>(r)]; }
  void mark_exited(int r) {
    state(r).exited.store(true, std::memory_order_release);
    wake_all();
    std::lock_guard lk(split_mu_);
    for (auto& c : children_)
      for (std::size_t i = 0; i < c.parent_rank.size(); ++i)
        if (c.parent_rank[i] == r) c.world->mark_exited(static_cast<int>(i));
    split_cv_.notify_all();
  }
  // A run() starts: no rank has returned (in this world and those split from it).
  void clear_exited(int r) {
    state(r).exited.store(false, std::memory_order_release);
    std::lock_guard lk(split_mu_);
    for (auto& c : children_)
      for (std::size_t i = 0; i < c.parent_rank.size(); ++i)
        if (c.parent_rank[i] == r) c.world->clear_exited(static_cast<int>(i));
  }

  // ---- layout, hierarchy and split ----
  struct child {
    inproc_world* world;
    std::vector<int> parent_rank; // child rank -> rank in this world
  };
  void init(node_layout layout, std::size_t shm_bytes) {
    if (shm_bytes != 0 && shm_bytes < 64)
      throw invalid_argument("inproc_world: shm_bytes must be 0 or >= 64, got " + std::to_string(shm_bytes));
    shm_bytes_ = shm_bytes;
    boxes_ = std::make_unique<detail::inproc_mailbox[]>(static_cast<std::size_t>(size_));
    ranks_ = std::make_unique<rank_state[]>(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) state(r).topo = node_topology(layout, r);
    const node_topology& t0 = state(0).topo;
    // One segment for the whole world only when it is one node (as dpkit::mpi).
    if (shm_bytes && t0.nodes() == 1) {
      shm_block_ = std::make_unique<detail::shm_block>(size_, shm_bytes);
      for (int r = 0; r < size_; ++r) state(r).shm = shm_block_->view(r);
    }
    if (!t0.hierarchical()) return;
    // The nodes' worlds and the cross-node worlds.
    const int nodes = t0.nodes();
    for (int k = 0; k < nodes; ++k) {
      auto members = layout.ranks_of(k);
      for (std::size_t i = 0; i < members.size(); ++i) {
        state(members[i]).node_world = static_cast<int>(hier_.size());
        state(members[i]).node_rank = static_cast<int>(i);
      }
      add_hier(members, node_layout::single(static_cast<int>(members.size())));
    }
    const int groups = t0.uniform() ? t0.max_local_size() : 1;
    for (int g = 0; g < groups; ++g) {
      std::vector<int> members;
      for (int k = 0; k < nodes; ++k) members.push_back(layout.ranks_of(k)[static_cast<std::size_t>(g)]);
      for (std::size_t i = 0; i < members.size(); ++i) {
        state(members[i]).cross_world = static_cast<int>(hier_.size());
        state(members[i]).cross_rank = static_cast<int>(i);
      }
      add_hier(members, node_layout::blocks(nodes, 1));
    }
  }
  void add_hier(const std::vector<int>& members, node_layout layout) {
    hier_.push_back(std::make_unique<inproc_world>(layout, ops_, shm_bytes_));
    hier_.back()->parent_ = this;
    std::lock_guard lk(split_mu_);
    children_.push_back({hier_.back().get(), members});
  }
  void remove_child(inproc_world* w) {
    std::lock_guard lk(split_mu_);
    for (auto it = children_.begin(); it != children_.end(); ++it)
      if (it->world == w) {
        children_.erase(it);
        return;
      }
  }
  // The k-th split of every rank meets in round k.
  struct split_round {
    std::vector<int> color, key;
    int arrived = 0, taken = 0;
    bool ready = false;
    std::vector<std::shared_ptr<inproc_world>> world_of; // per rank
    std::vector<int> new_rank;
  };
  inproc split_rank(int rank, int color, int key, std::chrono::milliseconds timeout) {
    if (color < 0)
      throw invalid_argument("inproc::split: rank " + std::to_string(rank) + ": color must be >= 0, got " +
                             std::to_string(color));
    throw_if_failed(rank);
    const auto due = clock::now() + timeout;
    std::unique_lock lk(split_mu_);
    const std::uint64_t k = state(rank).splits++;
    split_round& R = rounds_[k];
    if (R.color.empty()) {
      R.color.assign(static_cast<std::size_t>(size_), -1);
      R.key.assign(static_cast<std::size_t>(size_), 0);
    }
    R.color[static_cast<std::size_t>(rank)] = color;
    R.key[static_cast<std::size_t>(rank)] = key;
    if (++R.arrived == size_) {
      make_split(R);
      R.ready = true;
      split_cv_.notify_all();
    }
    while (!R.ready) {
      if (failed()) {
        lk.unlock();
        throw_if_failed(rank);
      }
      for (int p = 0; p < size_; ++p)
        if (R.color[static_cast<std::size_t>(p)] < 0 && state(p).exited.load(std::memory_order_acquire))
          throw peer_error("inproc::split: rank " + std::to_string(rank) + " waits for rank " + std::to_string(p) +
                           " to split, but rank " + std::to_string(p) + " already returned from its function");
      if (clock::now() >= due) {
        std::string missing;
        for (int p = 0; p < size_; ++p)
          if (R.color[static_cast<std::size_t>(p)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
        throw timeout_error("inproc::split: rank " + std::to_string(rank) + " timed out after " +
                            std::to_string(timeout.count()) + " ms waiting for rank(s) " + missing + " to split");
      }
      split_cv_.wait_until(lk, std::min(due, clock::now() + std::chrono::milliseconds(2)));
    }
    auto w = R.world_of[static_cast<std::size_t>(rank)];
    const int nr = R.new_rank[static_cast<std::size_t>(rank)];
    // The round may hold the last reference to a world whose ranks have all
    // gone; its destructor takes split_mu_: destroy the round after unlocking.
    std::optional<split_round> done;
    if (++R.taken == size_) {
      done.emplace(std::move(R));
      rounds_.erase(k);
    }
    lk.unlock();
    done.reset();
    inproc_world* raw = w.get();
    return inproc(raw, nr, std::move(w));
  }
  // Called with split_mu_ held by the last rank to arrive.
  void make_split(split_round& R) {
    R.world_of.assign(static_cast<std::size_t>(size_), nullptr);
    R.new_rank.assign(static_cast<std::size_t>(size_), -1);
    std::vector<int> colors(R.color.begin(), R.color.end());
    std::sort(colors.begin(), colors.end());
    colors.erase(std::unique(colors.begin(), colors.end()), colors.end());
    const node_layout& layout = state(0).topo.layout();
    for (int c : colors) {
      std::vector<int> members;
      for (int p = 0; p < size_; ++p)
        if (R.color[static_cast<std::size_t>(p)] == c) members.push_back(p);
      std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
        return R.key[static_cast<std::size_t>(a)] < R.key[static_cast<std::size_t>(b)];
      });
      std::vector<long long> labels;
      for (int p : members) labels.push_back(layout.node_of[static_cast<std::size_t>(p)]);
      auto w = std::make_shared<inproc_world>(node_layout::canonicalize(labels), ops_, shm_bytes_);
      w->parent_ = this;
      children_.push_back({w.get(), members});
      for (std::size_t i = 0; i < members.size(); ++i) {
        R.world_of[static_cast<std::size_t>(members[i])] = w;
        R.new_rank[static_cast<std::size_t>(members[i])] = static_cast<int>(i);
        if (state(members[i]).exited.load(std::memory_order_acquire)) w->state(static_cast<int>(i)).exited.store(true);
      }
    }
  }
  // Wakes every waiter (they re-check the world's state).
  void wake_all() {
    for (int r = 0; r < size_; ++r) {
      auto& b = box(r);
      std::lock_guard lk(b.mu);
      for (auto* q : {&b.sends, &b.recvs})
        for (auto& e : *q) {
          std::lock_guard ol(e.op->mu);
          e.op->cv.notify_all();
        }
    }
  }
  /// Throws peer_error / mismatch_error when the world failed.
  void throw_if_failed(int rank) const {
    if (!failed()) return;
    std::string what;
    bool mm;
    {
      std::lock_guard lk(fail_mu_);
      what = failure_;
      mm = mismatch_;
    }
    if (mm) throw mismatch_error(what);
    throw peer_error("inproc: rank " + std::to_string(rank) + " stops: " + what);
  }
  /// The tag of a message of `peer` that belongs to another collective at the
  /// same sequence number as `my_tag` (one queued for this rank, or a receive
  /// the peer posted for this rank), or 0.
  /// Rank `peer` sent (or posted for) `rank` a message with tag ft of another
  /// collective at rank's sequence number: fails the world and throws
  /// mismatch_error naming both calls.
  [[noreturn]] void throw_foreign(int rank, int peer, int ft) {
    const auto mine = state(rank).health.current();
    auto theirs = state(peer).health.at(mine.seq, mine.stream); // what the peer ran at our seq
    if (!theirs.valid) theirs = state(peer).health.current();
    std::string what = detail::mismatch_text(rank, mine, peer, theirs);
    if (theirs.seq != mine.seq)
      what = "collective mismatch: rank " + std::to_string(rank) + " runs " + mine.str() + "; rank " +
             std::to_string(peer) + " sent a message of another collective at the same sequence number (tag " +
             std::to_string(ft) + ")";
    fail(rank, what, true);
    throw mismatch_error(what);
  }
  int foreign_from(int rank, int peer, int my_tag) {
    if (!detail::is_checked_tag(my_tag)) return 0;
    {
      auto& b = box(rank);
      std::lock_guard lk(b.mu);
      for (auto& e : b.sends)
        if (e.peer == peer && detail::foreign_tag(my_tag, e.tag)) return e.tag;
    }
    auto& b = box(peer);
    std::lock_guard lk(b.mu);
    for (auto& e : b.recvs)
      if (e.peer == rank && detail::foreign_tag(my_tag, e.tag)) return e.tag;
    return 0;
  }

  int size_;
  const device_ops* ops_;
  std::size_t shm_bytes_ = 0;
  std::unique_ptr<detail::inproc_mailbox[]> boxes_;
  std::unique_ptr<detail::shm_block> shm_block_; // before ranks_: views point into it
  std::unique_ptr<rank_state[]> ranks_;
  inproc_world* parent_ = nullptr;                   // the world this one was split from
  mutable std::mutex split_mu_;                      // children_, rounds_, rank_state::splits
  std::condition_variable split_cv_;
  std::vector<child> children_;                      // worlds split from this one (and hier_)
  std::map<std::uint64_t, split_round> rounds_;
  std::vector<std::unique_ptr<inproc_world>> hier_;  // nodes' and cross-node worlds (layout with several nodes)
  std::atomic<bool> failed_{false};
  bool failing_ = false; // guarded by fail_mu_: fail() ran (first call wins)
  mutable std::mutex fail_mu_;
  std::string failure_;
  int failed_rank_ = -1;
  bool mismatch_ = false;
};

inline int inproc::size() const noexcept { return world_->size(); }
inline bool inproc::accepts(memory_space s) const noexcept {
  return s == memory_space::host || world_->device() != nullptr;
}
inline const device_ops* inproc::device() const noexcept { return world_->device(); }
inline detail::comm_health& inproc::health() noexcept { return world_->state(rank_).health; }
inline detail::shm_segment* inproc::shm() noexcept { return world_->state(rank_).shm.get(); }
inline const node_topology& inproc::topology() const noexcept { return world_->state(rank_).topo; }
inline inproc* inproc::node_transport() {
  const auto& st = world_->state(rank_);
  if (st.node_world < 0) return nullptr;
  if (!node_) node_.reset(new inproc(world_->hier_[static_cast<std::size_t>(st.node_world)].get(), st.node_rank));
  return node_.get();
}
inline inproc* inproc::cross_transport() {
  const auto& st = world_->state(rank_);
  if (st.cross_world < 0) return nullptr;
  if (!cross_) cross_.reset(new inproc(world_->hier_[static_cast<std::size_t>(st.cross_world)].get(), st.cross_rank));
  return cross_.get();
}
inline inproc inproc::split(int color, int key, std::chrono::milliseconds timeout) {
  return world_->split_rank(rank_, color, key, timeout);
}
inline void inproc::shm_poll(int peer, int tag) {
  world_->throw_if_failed(rank_);
  if (peer >= 0 && peer < size() && peer != rank_ && world_->state(peer).exited.load(std::memory_order_acquire))
    throw peer_error("inproc: rank " + std::to_string(rank_) + " waits for rank " + std::to_string(peer) +
                     " in a shared-memory collective, but rank " + std::to_string(peer) +
                     " already returned from its function");
  // A shm collective receives no messages: a peer's message at this call's
  // sequence number is another collective's (e.g. a broadcast root that
  // sent and went on).
  for (int p = 0; p < size(); ++p)
    if (p != rank_)
      if (const int ft = world_->foreign_from(rank_, p, tag)) world_->throw_foreign(rank_, p, ft);
}
inline void inproc::report_failure(const std::string& what) {
  world_->fail(rank_, "rank " + std::to_string(rank_) + " failed: " + what);
}

inline void inproc_request::wait(deadline d) {
  if (!op_) return;
  // Waits in short slices; between slices it checks the world (failure, a
  // peer that returned, a peer running another collective).
  constexpr auto slice = std::chrono::milliseconds(2);
  for (;;) {
    {
      std::unique_lock lk(op_->mu);
      const auto until = std::min(d, clock::now() + slice);
      const bool peer_gone = world_->state(peer_).exited.load(std::memory_order_acquire);
      op_->cv.wait_until(lk, until, [&] {
        return op_->status >= detail::inproc_op::done || world_->failed() ||
               (!peer_gone && world_->state(peer_).exited.load(std::memory_order_acquire));
      });
      if (op_->status >= detail::inproc_op::done) {
        if (op_->status == detail::inproc_op::failed) throw error(op_->message);
        return;
      }
    }
    world_->throw_if_failed(rank_);
    // This rank waits: its current call goes to the shared segment, where a
    // peer waiting in a shm collective reads it.
    if (detail::shm_segment* sg = world_->state(rank_).shm.get()) sg->publish(world_->state(rank_).health.current());
    // a message of another collective at this sequence number, from the
    // peer waited on or any other (a gather whose ranks name different
    // roots: the rank that finds the stray message is not always the one
    // its sender waits for)
    for (int k = 0; k < world_->size(); ++k) {
      const int p = (peer_ + k) % world_->size();
      if (p == rank_) continue;
      if (const int ft = world_->foreign_from(rank_, p, tag_)) world_->throw_foreign(rank_, p, ft);
    }
    if (world_->state(peer_).exited.load(std::memory_order_acquire) && !test())
      throw peer_error("inproc: rank " + std::to_string(rank_) + " waits for " + (is_send_ ? "send to" : "receive from") +
                       " rank " + std::to_string(peer_) + " (tag " + std::to_string(tag_) +
                       "), but rank " + std::to_string(peer_) + " already returned from its function");
    if (clock::now() >= d)
      throw timeout_error("inproc: rank " + std::to_string(rank_) + " timed out waiting for " +
                          (is_send_ ? "send to" : "receive from") + " rank " + std::to_string(peer_) + " (tag " +
                          std::to_string(tag_) + ")");
  }
}

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
  world_->throw_if_failed(rank_);
  auto op = std::make_shared<detail::inproc_op>();
  auto& box = world_->box(peer);
  // In the receiver's box: match a receive posted for (this rank, tag).
  detail::inproc_post(*world_, box, box.recvs, box.sends, {rank_, tag, nullptr, data.data(), data.size(), op}, rank_,
                      true, rank_, peer);
  return inproc_request(op, &box, world_, rank_, peer, tag, true, data.size());
}

inline inproc_request inproc::irecv(std::span<std::byte> data, int peer, int tag) {
  check_peer(peer, "irecv");
  world_->throw_if_failed(rank_);
  auto op = std::make_shared<detail::inproc_op>();
  auto& box = world_->box(rank_);
  // In this rank's box: match a send queued from (peer, tag).
  detail::inproc_post(*world_, box, box.sends, box.recvs, {peer, tag, data.data(), nullptr, data.size(), op}, peer,
                      false, peer, rank_);
  return inproc_request(op, &box, world_, rank_, peer, tag, false, data.size());
}

} // namespace dpkit

// -DDPKIT_EXTERN_TEMPLATES: the collective algorithm bodies for this
// transport are compiled in one TU of the program, not here
// (extern_templates.hpp says how and why).
#ifdef DPKIT_EXTERN_TEMPLATES
#include "../extern_templates.hpp"
DPKIT_INSTANTIATE_COLLECTIVES(extern, ::dpkit::inproc)
#endif
