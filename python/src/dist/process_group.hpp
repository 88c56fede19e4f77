// dpkit._dist_ext: the torch process group "dpkit" (torch 1.13: a
// c10d::ProcessGroup; 2.x: a c10d::Backend under torch's ProcessGroup):
// how a group is made (through torch's store, or over MPI under mpirun), its
// worker thread that runs the collectives in call order, and what every
// operation shares (checks of tensors, ranks and tags; the deadline; the
// sequence number). The operations themselves are in the rooms named after
// them: collectives.hpp (all-reduce, broadcast, reduce, all-gather,
// reduce-scatter, barrier, coalescing), gather_scatter.hpp, alltoall.hpp,
// p2p.hpp (send, recv, recv from any source), monitored_barrier.hpp
// (monitored barrier, sequence numbers).
#pragma once

#include "common.hpp"
#include "mpi_launch.hpp"
#include "store.hpp"
#include "work.hpp"

#include <map>

namespace dpkit_dist {

inline std::mutex registry_mu;
inline std::vector<std::weak_ptr<std::function<void()>>> registry; // shutdown of every live group

/// A torch process group whose operations are dpkit's, over Gloo pairs and
/// the node's shared memory met through torch's store, or over MPI.
/// Semantics are ProcessGroupGloo's on CPU tensors (torch's c10d sources are
/// the reference); the data path is dpkit's.
class process_group_dpkit : public group_base {
public:
  /// The group meeting through torch's `store` (the creator's, already
  /// prefixed with the group's name): rank `rank` of `size`. Collective over
  /// the group: returns once every rank has joined and is connected.
  /// @param hostname the address this rank's Gloo pairs listen on (empty:
  ///        GLOO_SOCKET_IFNAME's, else this machine's host name).
  /// @throws dpkit::invalid_argument when ranks disagree on the size (every
  ///         rank) or a rank is taken twice; dpkit::timeout_error when the
  ///         other ranks do not all arrive within `timeout`; dpkit::error if
  ///         the store or the network fails.
  process_group_dpkit(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
                      const std::string& group_id, const std::string& hostname, std::size_t inline_bytes)
      : group_base(rank, size), timeout_(timeout), inline_bytes_(inline_bytes) {
    if (size < 1 || rank < 0 || rank >= size)
      throw dpkit::invalid_argument("dpkit backend: group '" + group_id + "': rank " + std::to_string(rank) +
                                    " out of range for group size " + std::to_string(size));
    const auto start = std::chrono::steady_clock::now();
    auto kv = std::make_shared<c10d_kv_store>(std::move(store), "torch's store", timeout);
    // torchrun keeps its store across restarts of the worker group: each
    // attempt meets under keys of its own (the keys are written once)
    std::string root = "dpkit";
    if (const char* a = std::getenv("TORCHELASTIC_RESTART_COUNT"); a && *a) root += "/attempt" + std::string(a);
    agree_on_size(*kv, root, rank, size, timeout, group_id);
    dpkit::gloo_options o;
    o.hostname = hostname;
    const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    o.timeout = std::max(left, std::chrono::milliseconds(1000));
    gloo_.emplace(std::move(kv), root, rank, size, o);
    start_worker();
  }

#if DPKIT_DIST_MPI
  /// The group of `global_ranks` (MPI_COMM_WORLD ranks; empty = the world),
  /// in which this process is `rank` of `size`. Collective over the group.
  /// @throws dpkit::invalid_argument if torch's rank or size differs from
  ///         MPI's (the job was not launched with mpirun, or ranks were
  ///         renumbered); dpkit::error if MPI fails.
  process_group_dpkit(int rank, int size, std::chrono::milliseconds timeout, std::vector<int> global_ranks,
                      std::size_t inline_bytes)
      : group_base(rank, size), timeout_(timeout), inline_bytes_(inline_bytes) {
    mpi_multiple_ = init_mpi() == MPI_THREAD_MULTIPLE;
    int world_rank = 0, world_size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm comm = MPI_COMM_NULL;
    if (global_ranks.empty()) {
      if (rank != world_rank || size != world_size)
        throw dpkit::invalid_argument("dpkit backend: torch rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                      " is MPI rank " + std::to_string(world_rank) + " of " + std::to_string(world_size) +
                                      ": launch with mpirun and pass rank and world_size from OMPI_COMM_WORLD_RANK / "
                                      "OMPI_COMM_WORLD_SIZE (dpkit.distributed.mpi_env() gives them)");
      MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    } else {
      if (static_cast<int>(global_ranks.size()) != size || rank < 0 || rank >= size || global_ranks[rank] != world_rank)
        throw dpkit::invalid_argument("dpkit backend: group rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                      " does not match MPI rank " + std::to_string(world_rank) +
                                      " in the group's global ranks");
      MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
      MPI_Comm_group(MPI_COMM_WORLD, &world_group);
      MPI_Group_incl(world_group, size, global_ranks.data(), &group);
      if (MPI_Comm_create_group(MPI_COMM_WORLD, group, 0x6470, &comm) != MPI_SUCCESS)
        throw dpkit::error("dpkit backend: MPI_Comm_create_group failed (rank " + std::to_string(rank) + ")");
      MPI_Group_free(&group);
      MPI_Group_free(&world_group);
    }
    mpi_.emplace(comm, true);
    MPI_Comm_free(&comm);
    start_worker();
  }
#endif

  /// Shuts the group down (shutdown()). Python destroys the group in its
  /// dealloc, with the GIL held (destroy_process_group, then the last
  /// reference); the worker may then still be releasing a finished task's
  /// tensors, and releasing a tensor whose Python object C++ owns takes the
  /// GIL, so joining the worker with the GIL held waited forever
  /// (dist_allreduce_perf.py under mpirun: 1 of 13 runs on 2026-11-29;
  /// python/tests' destroy_busy case: every run, env:// and mpirun). The
  /// GIL is let go for it.
  ~process_group_dpkit() override {
    std::optional<py::gil_scoped_release> nogil;
    if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
    shutdown();
  }

  const std::string getBackendName() const override { return "dpkit"; }

  /// Stops the worker (after the queued collectives) and frees the
  /// communicator; later calls raise dpkit.CommunicatorError. Called by
  /// dpkit.distributed's atexit hook before MPI_Finalize.
  void shutdown() {
    {
      std::unique_lock lk(mu_);
      if (stopped_) return;
      stop_ = true;
      cv_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
    {
      // sends and receives still pending end with the transport: withdrawn
      // now, their Works raise communicator_error
      const std::lock_guard lk(p2p_mu_);
      for (auto& s : p2p_pending_) {
        const std::lock_guard slk(s->mu);
        s->fail = nullptr;
        s->request.reset();
      }
      p2p_pending_.clear();
    }
    {
      // private pages again (the registrations may outlive the transport;
      // the tensors' last references may take the GIL: not with mu_ held)
      std::map<std::uintptr_t, std::shared_ptr<tensor_registration>> regs;
      {
        const std::lock_guard lk(reg_mu_);
        regs.swap(registrations_);
      }
    }
    const std::lock_guard lk(mu_);
    stopped_ = true;
    gloo_.reset();
#if DPKIT_DIST_MPI
    mpi_.reset();
#endif
  }

  // ---- collectives.hpp ----
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
#endif

  // ---- gather_scatter.hpp ----
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;

  // ---- alltoall.hpp ----
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  // ---- p2p.hpp ----
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // ---- monitored_barrier.hpp ----
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  /// "gloo" (met through torch's store) or "mpi".
  std::string transport_name() const {
#if DPKIT_DIST_MPI
    if (mpi_) return "mpi";
#endif
    return "gloo";
  }

  /// Collectives run inline (no worker hand-off) up to this many bytes.
  std::size_t inline_bytes() const noexcept { return inline_bytes_; }

  /// dpkit::register_memory on tensor t's bytes (collectives/symmetric_memory.hpp):
  /// on one node, the whole pages inside t become memory every rank of the
  /// group maps, so an all-reduce on t runs the shm all-reduce's direct path.
  /// Collective over the group, in call order with its other operations
  /// (queued behind them; returns once done). Keeps a reference to t until
  /// release_memory(t) or shutdown, so its memory is not freed while
  /// registered. A tensor already registered (the same data pointer and
  /// byte count) is not registered again (no collective).
  /// @returns true when the ranks map t's pages (false: too small, or no
  ///          shared segment; t works as before).
  /// @throws dpkit::invalid_argument for an undefined, sparse, non-CPU or
  ///         non-contiguous tensor, or one overlapping another registration
  ///         (every rank); what the setup's collectives throw.
  bool register_memory(const at::Tensor& t) {
    check_dense(t, "register_memory");
    const auto key = reinterpret_cast<std::uintptr_t>(t.data_ptr());
    {
      const std::lock_guard lk(reg_mu_);
      if (auto it = registrations_.find(key); it != registrations_.end() && it->second->bytes == nbytes(t))
        return it->second->memory.shared();
    }
    auto entry = std::make_shared<tensor_registration>();
    entry->tensor = t;
    entry->bytes = nbytes(t);
    auto work = submit(c10d::OpType::UNKNOWN, {}, entry->bytes, timeout_of(timeout_),
                       [entry](auto& c, const dpkit::collective_options& o) {
                         entry->memory = dpkit::register_memory(c, entry->tensor.data_ptr(), entry->bytes, o);
                       });
    work->wait();
    const bool shared = entry->memory.shared();
    const std::lock_guard lk(reg_mu_);
    registrations_[key] = std::move(entry);
    return shared;
  }
  /// Ends t's registration (registered_memory::release: its pages private
  /// again with their contents) after the operations queued before this
  /// call, and drops the reference to t. Not collective.
  /// @returns false when t is not registered with this group.
  bool release_memory(const at::Tensor& t) {
    std::shared_ptr<tensor_registration> entry;
    {
      const std::lock_guard lk(reg_mu_);
      auto it = registrations_.find(reinterpret_cast<std::uintptr_t>(t.defined() ? t.data_ptr() : nullptr));
      if (it == registrations_.end()) return false;
      entry = std::move(it->second);
      registrations_.erase(it);
    }
    auto work = submit(c10d::OpType::UNKNOWN, {}, 0, timeout_of(timeout_),
                       [entry](auto&, const dpkit::collective_options&) { entry->memory.release(); });
    work->wait();
    return true;
  }
  /// The number of tensors registered with this group now (register_memory).
  std::size_t registered_tensors() {
    const std::lock_guard lk(reg_mu_);
    return registrations_.size();
  }

private:
  /// A tensor registered with register_memory, and the reference that keeps
  /// its memory alive.
  struct tensor_registration {
    at::Tensor tensor;
    std::size_t bytes = 0;
    dpkit::registered_memory memory;
  };
  using body = std::function<void(comm_ref, const dpkit::collective_options&)>;
  struct task {
    body run;
    dpkit::collective_options options;
    std::vector<at::Tensor> outputs;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };

  // ---- what every operation shares ----

  std::string me() const { return at_rank(getRank()); }

  void check_cpu(const at::Tensor& t, const char* what) const {
    if (!t.device().is_cpu())
      throw dpkit::invalid_argument(me() + what + " of " + dpkit::detail::torch_describe(t) +
                                    ": only CPU tensors (use the nccl backend on GPUs)");
  }
  /// A dense, contiguous CPU tensor of any dtype (data that is moved).
  void check_dense(const at::Tensor& t, const char* what) const {
    if (!t.defined()) throw dpkit::invalid_argument(me() + what + ": undefined tensor");
    if (t.is_sparse())
      throw dpkit::invalid_argument(me() + what + " of " + dpkit::detail::torch_describe(t) +
                                    ": a sparse tensor (all_reduce with SUM is the collective that takes them)");
    check_cpu(t, what);
    if (!t.is_contiguous())
      throw dpkit::invalid_argument(me() + what + " of " + dpkit::detail::torch_describe(t) +
                                    " is not contiguous; call .contiguous() first");
  }
  /// The one tensor of an operation that takes one, checked as check_dense.
  at::Tensor single(const std::vector<at::Tensor>& ts, const char* what) const {
    if (ts.size() != 1)
      throw dpkit::invalid_argument(me() + what + " takes one tensor, got " + std::to_string(ts.size()));
    check_dense(ts[0], what);
    return ts[0];
  }
  /// Tensors of one operation that must agree in dtype (`what` names it).
  void check_same_dtype(const std::vector<at::Tensor>& ts, const at::Tensor& ref, const char* what) const {
    for (const auto& t : ts)
      if (t.scalar_type() != ref.scalar_type())
        throw dpkit::invalid_argument(me() + what + ": " + dpkit::detail::torch_describe(t) + " and " +
                                      dpkit::detail::torch_describe(ref) + " differ in dtype");
  }
  int check_root(std::int64_t root, const char* what) const {
    if (root < 0 || root >= getSize())
      throw dpkit::invalid_argument(me() + what + " root " + std::to_string(root) + " not in [0, " +
                                    std::to_string(getSize()) + ")");
    return static_cast<int>(root);
  }
  dpkit::collective_options timeout_of(std::chrono::milliseconds t) const {
    dpkit::collective_options o;
    o.timeout = t.count() > 0 ? t : timeout_;
    return o;
  }

  /// Queues (or runs at once) `f(transport, options)`, `f` generic over
  /// the transport; counts the group's sequence number.
  template <class F>
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::vector<at::Tensor> outputs, std::size_t nbytes,
                                        dpkit::collective_options o, F f) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    std::unique_lock lk(mu_);
    if (stop_ || !has_comm())
      throw dpkit::communicator_error(me() + "the process group was shut down (destroy_process_group or interpreter exit)");
    ++seq_;
    if (coalescing_) coalesced_.push_back(future);
    if (queue_.empty() && !busy_ && nbytes <= inline_bytes_) {
      // Inline on the caller's thread, without a task. The worker waits only
      // for queued work or the stop: it is woken only if either came while
      // this ran (waking it on every call cost each small collective a
      // context switch and a contended mu_: perf, 2 pinned ranks, 8 B).
      busy_ = true;
      lk.unlock();
      settle(*future, outputs, [&] { std::visit([&](auto* p) { f(*p, o); }, comm()); });
      lk.lock();
      busy_ = false;
      if (!queue_.empty() || stop_) cv_.notify_all();
    } else {
      body run = [f = std::move(f)](comm_ref c, const dpkit::collective_options& opts) {
        std::visit([&](auto* p) { f(*p, opts); }, c);
      };
      queue_.push_back(task{std::move(run), o, std::move(outputs), future});
      cv_.notify_all();
    }
    return c10::make_intrusive<dpkit_work>(getRank(), type, future);
  }

  /// Runs `run()` and settles `future` with its outcome: completed with
  /// `outputs`, or failed with what `run` threw (the Work's wait rethrows
  /// it). The one place an operation's result reaches torch, inline or queued.
  template <class R>
  static void settle(c10::ivalue::Future& future, const std::vector<at::Tensor>& outputs, R&& run) {
    try {
      run();
      future.markCompleted(c10::IValue(outputs));
    } catch (...) {
      future.setError(std::current_exception());
    }
  }

  void execute(task& t) {
    settle(*t.future, t.outputs, [&] { t.run(comm(), t.options); });
  }

  void work_loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty() && !busy_); });
      if (queue_.empty()) return; // stop_
      std::optional<task> t(std::move(queue_.front()));
      queue_.pop_front();
      busy_ = true;
      lk.unlock();
      execute(*t);
      t.reset(); // its tensors' last references may take the GIL: never with mu_ held
      lk.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  bool has_comm() const {
#if DPKIT_DIST_MPI
    if (mpi_) return true;
#endif
    return gloo_.has_value();
  }
  comm_ref comm() {
#if DPKIT_DIST_MPI
    if (mpi_) return &*mpi_;
#endif
    return &*gloo_;
  }
  /// Registers the group for finalize() and starts its worker thread.
  void start_worker() {
    shutdown_fn_ = std::make_shared<std::function<void()>>([this] { shutdown(); });
    {
      const std::lock_guard lk(registry_mu);
      registry.push_back(shutdown_fn_);
    }
    worker_ = std::thread([this] { work_loop(); });
  }

  // ---- p2p.hpp's helpers ----
  c10::intrusive_ptr<c10d::Work> post_p2p(bool is_send, const at::Tensor& t, int peer, int transport_tag,
                                          c10d::OpType type, const std::string& what);
  void fail_group(const std::string& why);

  // ---- collectives.hpp's helpers ----
  template <class C>
  void bitwise_allreduce(C& c, const at::Tensor& t, const reduction& r, const dpkit::collective_options& o);
  template <class C>
  void sparse_allreduce(C& c, const at::Tensor& t, const dpkit::collective_options& o);
  c10::intrusive_ptr<c10d::Work> allreduce_sparse_impl(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);

  std::optional<dpkit::gloo_transport> gloo_;
#if DPKIT_DIST_MPI
  std::optional<dpkit::mpi> mpi_;
#endif
  bool mpi_multiple_ = true; // MPI_THREAD_MULTIPLE (sends and receives on the caller's thread beside the worker)
  std::chrono::milliseconds timeout_;
  std::size_t inline_bytes_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  bool stopped_ = false;
  std::uint64_t seq_ = 0;     // operations started on this group (Gloo's sequence number); mu_
  bool coalescing_ = false;   // between startCoalescing and endCoalescing; mu_
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> coalesced_; // the collectives since startCoalescing; mu_
  std::mutex p2p_mu_;
  std::vector<std::shared_ptr<p2p_slot>> p2p_pending_; // sends and receives not known complete; p2p_mu_
  std::uint32_t internal_tags_ = 0; // the monitored barrier's tags; p2p_mu_
  std::thread worker_;
  std::shared_ptr<std::function<void()>> shutdown_fn_;
  std::mutex reg_mu_;
  std::map<std::uintptr_t, std::shared_ptr<tensor_registration>> registrations_; // by data pointer; reg_mu_
};

/// Shuts down every live group, then MPI_Finalize if this module initialized
/// MPI (atexit, from dpkit.distributed).
inline void finalize() {
  std::vector<std::shared_ptr<std::function<void()>>> live;
  {
    const std::lock_guard lk(registry_mu);
    for (auto& w : registry)
      if (auto s = w.lock()) live.push_back(s);
    registry.clear();
  }
  for (auto& s : live) (*s)();
#if DPKIT_DIST_MPI
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (mpi_started_here && inited && !finalized) MPI_Finalize();
#endif
}

} // namespace dpkit_dist
