// dpkit._dist_ext (loaded by dpkit/_dist.py once it has checked that the
// imported torch is the one this was compiled against): the
// torch.distributed backend "dpkit" over dpkit's collectives: all-reduce,
// broadcast, all-gather, reduce-scatter, reduce and barrier on CPU tensors,
// the algorithm chosen by dpkit's dispatchers for the transport (over MPI:
// shared memory within a node, hierarchical across nodes; over Gloo: what
// dpkit::gloo_transport offers). python/dpkit/distributed.py registers it
// with torch.distributed.Backend.register_backend; docs/python.md is the
// guide.
//
// One source for torch 1.13 (the group is a c10d::ProcessGroup) and torch 2.x
// (a c10d::Backend under torch's ProcessGroup), told apart by
// TORCH_VERSION_MAJOR; python/meson.build compiles it against the torch of
// the Python it installs into.
//
// Launch: torchrun (or any env:// / file:// / tcp:// init_method): the group
// meets through the c10d::Store torch hands the creator (c10d_kv_store
// below: Gloo's full-mesh rendezvous, then dpkit's collectives over
// dpkit::gloo_transport); every rank first records its group size in the
// store, and ranks that disagree fail together with a message naming both
// sizes. Under an MPI launcher (mpirun: OMPI_COMM_WORLD_SIZE / PMI_SIZE in
// the environment; this build has MPI when DPKIT_DIST_MPI) the group is an
// MPI communicator (dpkit::mpi) instead: torch's rank must equal the MPI rank
// (checked), and the store is not used. The group's collectives are written
// once over either transport (std::visit of a transport pointer).
//
// Each group runs its collectives in call order on one worker thread and
// completes the Work's future when done, so torch's DDP overlaps them with
// backward; a call of at most inline_bytes made while the worker is idle runs
// at once on the caller's thread (the latency of a small all-reduce without a
// thread hand-off). Errors are dpkit's typed exceptions, raised by
// Work.wait() (dpkit.TimeoutError, dpkit.MismatchError, ...).
#if DPKIT_DIST_MPI
#include <mpi.h>
#include <dpkit/transport/mpi.hpp>
#endif

#include <dpkit/collectives.hpp>
#include <dpkit/core/errors.hpp>
#include <dpkit/torch/tensor.hpp>
#include <dpkit/elastic/group.hpp>
#include <dpkit/transport/gloo.hpp>

#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <variant>
#include <vector>

namespace py = pybind11;

namespace {

/// dpkit's reduce_op for torch's, or an invalid_argument naming it.
dpkit::reduce_op to_dpkit(const c10d::ReduceOp& op, int rank) {
  switch (op.op_) {
  case c10d::ReduceOp::SUM: return dpkit::reduce_op::sum;
  case c10d::ReduceOp::AVG: return dpkit::reduce_op::avg;
  case c10d::ReduceOp::PRODUCT: return dpkit::reduce_op::prod;
  case c10d::ReduceOp::MIN: return dpkit::reduce_op::min;
  case c10d::ReduceOp::MAX: return dpkit::reduce_op::max;
  default:
    throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(rank) + ": reduce op " +
                                  std::to_string(static_cast<int>(op.op_)) +
                                  " not supported (SUM, AVG, PRODUCT, MIN, MAX)");
  }
}

#if DPKIT_DIST_MPI
bool mpi_started_here = false;

/// MPI_Init_thread(MPI_THREAD_MULTIPLE) unless MPI is already initialized
/// (by mpi4py, say). Returns the thread level provided.
int init_mpi() {
  int inited = 0;
  MPI_Initialized(&inited);
  int provided = MPI_THREAD_SINGLE;
  if (!inited) {
    int argc = 0;
    char** argv = nullptr;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw dpkit::error("dpkit backend: MPI_Init_thread failed");
    mpi_started_here = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    throw dpkit::error("dpkit backend: MPI provides thread level " + std::to_string(provided) +
                       "; the backend calls MPI from its worker thread and needs MPI_THREAD_SERIALIZED or more");
  return provided;
}
#endif

/// The c10d::Store torch hands a backend's creator (a PrefixStore of the
/// group over torch's TCPStore, FileStore or HashStore) as the store of
/// dpkit's Gloo rendezvous. create() is compareSet(key, "", value), which
/// every torch store implements as "set if absent or equal to the expected
/// value, then return what the key holds": each value is stored behind a
/// header of 'd' and 16 random bytes drawn per call, so the returned value
/// equals this call's exactly when this call wrote it, and of racing writers
/// exactly one wins (an equal value written by another rank never looks like
/// ours, and a stored value is never empty, so compareSet's "expected empty"
/// never matches an existing key). put() is set(); try_get() check() then
/// get(); exists() check(). Waits poll check() (1 ms, growing to 10 ms) up to
/// their own deadline, never torch's blocking wait. Errors of torch's store
/// (a lost connection to the TCPStore's server) become dpkit::error naming
/// the store and the key.
class c10d_kv_store final : public dpkit::detail::kv_store {
public:
  c10d_kv_store(c10::intrusive_ptr<c10d::Store> store, std::string where, std::chrono::milliseconds timeout)
      : kv_store(std::move(where), timeout), store_(std::move(store)), rng_(std::random_device{}() ^ ::getpid()) {}

  bool create(const std::string& key, const std::vector<char>& value) override {
    const std::vector<std::uint8_t> mine = encode(value);
    const auto got = call(key, [&] { return store_->compareSet(key, {}, mine); });
    return got == mine;
  }
  void put(const std::string& key, const std::vector<char>& value) override {
    const std::vector<std::uint8_t> v = encode(value);
    call(key, [&] {
      store_->set(key, v);
      return 0;
    });
  }
  std::optional<std::vector<char>> try_get(const std::string& key) override {
    if (!exists(key)) return std::nullopt;
    const auto v = call(key, [&] { return store_->get(key); });
    if (v.size() < header || v[0] != 'd')
      throw dpkit::error(where_ + ": key '" + key + "' holds " + std::to_string(v.size()) +
                         " bytes not written by dpkit (another program's key under the group's prefix?)");
    return std::vector<char>(v.begin() + header, v.end());
  }
  bool exists(const std::string& key) override {
    return call(key, [&] { return store_->check({key}); });
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    auto nap = std::chrono::milliseconds(1);
    for (const auto& k : keys)
      while (!exists(k)) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= until)
          throw dpkit::timeout_error(where_ + ": waited " + std::to_string(timeout.count()) + " ms for key '" + k + "'");
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(nap, until - now));
        nap = std::min(nap * 2, std::chrono::milliseconds(10));
      }
  }
  using kv_store::wait;

private:
  static constexpr std::size_t header = 17;
  std::vector<std::uint8_t> encode(const std::vector<char>& value) {
    std::vector<std::uint8_t> v(header + value.size());
    v[0] = 'd';
    {
      const std::lock_guard lk(mu_);
      for (std::size_t i = 1; i < header; ++i) v[i] = static_cast<std::uint8_t>(rng_());
    }
    std::copy(value.begin(), value.end(), v.begin() + header);
    return v;
  }
  template <class F>
  auto call(const std::string& key, F f) -> decltype(f()) {
    try {
      return f();
    } catch (const dpkit::error&) {
      throw;
    } catch (const c10::Error& e) {
      throw dpkit::error(where_ + ": key '" + key + "': " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw dpkit::error(where_ + ": key '" + key + "': " + e.what());
    }
  }
  c10::intrusive_ptr<c10d::Store> store_;
  std::mutex mu_;
  std::mt19937_64 rng_;
};

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

std::mutex registry_mu;
std::vector<std::weak_ptr<std::function<void()>>> registry; // shutdown of every live group

#if TORCH_VERSION_MAJOR >= 2
using group_base = c10d::Backend; // torch 2.x: a backend under torch's ProcessGroup
#else
using group_base = c10d::ProcessGroup; // torch 1.13: the process group itself
#endif

/// The transport a group's collectives run on.
#if DPKIT_DIST_MPI
using comm_ref = std::variant<dpkit::gloo_transport*, dpkit::mpi*>;
#else
using comm_ref = std::variant<dpkit::gloo_transport*>;
#endif

/// Every rank of a group meeting through `kv` records its group size under
/// "<root>/size/<rank>" (root: "dpkit", or "dpkit/attempt<k>" in attempt k
/// of a torchrun worker group), then waits for the records of ranks
/// 0..size-1, or
/// for root + "/error" (written by the first rank that saw a disagreement),
/// until `timeout`. A rank that fails this way marks "<root>/failed/<rank>"
/// and waits (within the timeout) for the marks of the ranks it has seen
/// before it throws: the store's server (rank 0's process, for env://)
/// then stays up until every rank that arrived has read the error.
/// @throws dpkit::invalid_argument naming both sizes and ranks when a rank
///         records another size (on every rank: the one that sees it writes
///         the error key, the others read it), or when a rank is taken
///         twice; dpkit::timeout_error naming the ranks missing when the
///         timeout passes first.
void agree_on_size(c10d_kv_store& kv, const std::string& root, int rank, int size, std::chrono::milliseconds timeout,
                   const std::string& group_id) {
  const std::string me = "dpkit backend: group '" + group_id + "': rank " + std::to_string(rank) + " of " +
                         std::to_string(size) + ": ";
  const auto bytes = [](const std::string& s) { return std::vector<char>(s.begin(), s.end()); };
  const std::string size_s = std::to_string(size);
  if (!kv.create(root + "/size/" + std::to_string(rank), bytes(size_s)))
    throw dpkit::invalid_argument(me + "another process already joined as rank " + std::to_string(rank) +
                                  " (two processes were given the same RANK?)");
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> seen(static_cast<std::size_t>(size), false);
  seen[static_cast<std::size_t>(rank)] = true;
  // every rank seen so far knows of the failure before this one throws
  const auto fail = [&](const std::string& why) {
    try {
      kv.create(root + "/error", bytes(why));
      kv.put(root + "/failed/" + std::to_string(rank), bytes("1"));
      for (int r = 0; r < size; ++r)
        if (r != rank && seen[static_cast<std::size_t>(r)])
          while (!kv.exists(root + "/failed/" + std::to_string(r)) && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
    } catch (const dpkit::error&) {
      // the store's server has gone: its rank read the error and threw
    }
    throw dpkit::invalid_argument(me + why);
  };
  auto nap = std::chrono::milliseconds(1);
  for (;;) {
    int missing = 0;
    for (int r = 0; r < size; ++r) {
      if (seen[static_cast<std::size_t>(r)]) continue;
      const auto v = kv.try_get(root + "/size/" + std::to_string(r));
      if (!v) {
        ++missing;
        continue;
      }
      seen[static_cast<std::size_t>(r)] = true;
      const std::string theirs(v->begin(), v->end());
      if (theirs != size_s)
        fail("rank " + std::to_string(r) + " says the group has " + theirs + " ranks, rank " + std::to_string(rank) +
             " says " + size_s + " (WORLD_SIZE / world_size differs between the ranks)");
    }
    if (missing == 0) return;
    if (const auto e = kv.try_get(root + "/error")) fail(std::string(e->begin(), e->end()));
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) {
      std::string who;
      for (int r = 0; r < size; ++r)
        if (!seen[static_cast<std::size_t>(r)]) who += (who.empty() ? "" : ", ") + std::to_string(r);
      throw dpkit::timeout_error(me + "rank(s) " + who + " did not join through " + kv.where() + " within " +
                                 std::to_string(timeout.count()) + " ms (not started, or another WORLD_SIZE?)");
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(nap, until - now));
    nap = std::min(nap * 2, std::chrono::milliseconds(20));
  }
}

/// A torch process group (torch 1.13: a c10d::ProcessGroup; 2.x: a
/// c10d::Backend) whose collectives are dpkit's, over Gloo pairs that met
/// through torch's store or over MPI.
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
    init_mpi();
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
    const std::lock_guard lk(mu_);
    stopped_ = true;
    gloo_.reset();
#if DPKIT_DIST_MPI
    mpi_.reset();
#endif
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    const at::Tensor t = single(tensors, "allreduce");
    const dpkit::reduce_op op = to_dpkit(opts.reduceOp, getRank());
    return submit(c10d::OpType::ALLREDUCE, {t}, bytes(t), timeout_of(opts.timeout),
                  [t, op](auto& c, const dpkit::collective_options& o) { dpkit::torch_allreduce(c, t, op, {}, o); });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    std::vector<at::Tensor> ts;
    std::size_t n = 0;
    for (const auto& t : tensors) {
      dpkit::check_torch_tensor(t, "dpkit backend allreduce_coalesced");
      check_cpu(t, "allreduce_coalesced");
      ts.push_back(t);
      n += bytes(t);
    }
    const dpkit::reduce_op op = to_dpkit(opts.reduceOp, getRank());
    return submit(c10d::OpType::ALLREDUCE_COALESCED, ts, n, timeout_of(opts.timeout),
                  [ts, op](auto& c, const dpkit::collective_options& o) {
                    for (const auto& t : ts) dpkit::torch_allreduce(c, t, op, {}, o);
                  });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = single(tensors, "broadcast");
    const int root = check_root(opts.rootRank, "broadcast");
    return submit(c10d::OpType::BROADCAST, {t}, bytes(t), timeout_of(opts.timeout),
                  [t, root](auto& c, const dpkit::collective_options& o) {
                    dpkit::visit_torch_tensor(t, [&](auto v) { dpkit::broadcast(c, v, root, dpkit::algorithm::automatic, o); });
                  });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    const at::Tensor t = single(tensors, "reduce");
    const int root = check_root(opts.rootRank, "reduce");
    const dpkit::reduce_op op = to_dpkit(opts.reduceOp, getRank());
    return submit(c10d::OpType::REDUCE, {t}, bytes(t), timeout_of(opts.timeout),
                  [t, root, op](auto& c, const dpkit::collective_options& o) {
                    dpkit::visit_torch_tensor(t, [&](auto v) { dpkit::reduce(c, v, op, root, dpkit::algorithm::automatic, o); });
                  });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const at::Tensor in = single(inputs, "allgather");
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
      throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(getRank()) + ": allgather wants one list of " +
                                    std::to_string(getSize()) + " output tensors");
    std::vector<at::Tensor> outs = outputs[0];
    for (const auto& o : outs) {
      dpkit::check_torch_tensor(o, "dpkit backend allgather output");
      if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type())
        throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(getRank()) + ": allgather output " +
                                      dpkit::detail::torch_describe(o) + " differs from the input " +
                                      dpkit::detail::torch_describe(in));
    }
    return submit(c10d::OpType::ALLGATHER, outs, bytes(in) * outs.size(), timeout_of(opts.timeout),
                  [in, outs](auto& c, const dpkit::collective_options& o) {
                    at::Tensor flat = at::empty({static_cast<std::int64_t>(outs.size()) * in.numel()}, in.options());
                    gather_flat(c, in, flat, o);
                    for (std::size_t r = 0; r < outs.size(); ++r)
                      outs[r].view({-1}).copy_(flat.narrow(0, static_cast<std::int64_t>(r) * in.numel(), in.numel()));
                  });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override {
    check_flat(output, input, "_allgather_base");
    const at::Tensor in = input, out = output;
    return submit(c10d::OpType::_ALLGATHER_BASE, {out}, bytes(out), timeout_of(opts.timeout),
                  [in, out](auto& c, const dpkit::collective_options& o) { gather_flat(c, in, out, o); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "reduce_scatter");
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
      throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(getRank()) + ": reduce_scatter wants one list of " +
                                    std::to_string(getSize()) + " input tensors");
    for (const auto& i : inputs[0])
      if (i.numel() != out.numel() || i.scalar_type() != out.scalar_type())
        throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(getRank()) + ": reduce_scatter input " +
                                      dpkit::detail::torch_describe(i) + " differs from the output " +
                                      dpkit::detail::torch_describe(out));
    const std::vector<at::Tensor> ins = inputs[0];
    const dpkit::reduce_op op = to_dpkit(opts.reduceOp, getRank());
    return submit(c10d::OpType::REDUCE_SCATTER, {out}, bytes(out) * ins.size(), timeout_of(opts.timeout),
                  [ins, out, op](auto& c, const dpkit::collective_options& o) {
                    std::vector<at::Tensor> flat_parts;
                    for (const auto& i : ins) flat_parts.push_back(i.reshape({-1}));
                    scatter_flat(c, at::cat(flat_parts), out, op, o);
                  });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    check_flat(input, output, "_reduce_scatter_base");
    const at::Tensor in = input, out = output;
    const dpkit::reduce_op op = to_dpkit(opts.reduceOp, getRank());
    return submit(c10d::OpType::_REDUCE_SCATTER_BASE, {out}, bytes(in), timeout_of(opts.timeout),
                  [in, out, op](auto& c, const dpkit::collective_options& o) { scatter_flat(c, in, out, op, o); });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return submit(c10d::OpType::BARRIER, {}, 0, timeout_of(opts.timeout),
                  [](auto& c, const dpkit::collective_options& o) {
                    dpkit::barrier(c, o);
                  });
  }

  /// "gloo" (met through torch's store) or "mpi".
  std::string transport_name() const {
#if DPKIT_DIST_MPI
    if (mpi_) return "mpi";
#endif
    return "gloo";
  }

  /// Collectives run inline (no worker hand-off) up to this many bytes.
  std::size_t inline_bytes() const noexcept { return inline_bytes_; }

private:
  using body = std::function<void(comm_ref, const dpkit::collective_options&)>;
  struct task {
    body run;
    dpkit::collective_options options;
    std::vector<at::Tensor> outputs;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };

  static std::size_t bytes(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

  template <class C>
  static void gather_flat(C& c, const at::Tensor& in, const at::Tensor& out, const dpkit::collective_options& o) {
    dpkit::visit_torch_tensor(in, [&](auto v) {
      using T = std::remove_pointer_t<decltype(v.ptr)>;
      dpkit::allgather(c, v, dpkit::torch_tensor_view<T>(out), dpkit::algorithm::automatic, o);
    });
  }
  template <class C>
  static void scatter_flat(C& c, const at::Tensor& in, const at::Tensor& out, dpkit::reduce_op op,
                           const dpkit::collective_options& o) {
    dpkit::visit_torch_tensor(in, [&](auto v) {
      using T = std::remove_pointer_t<decltype(v.ptr)>;
      dpkit::reduce_scatter(c, v, dpkit::torch_tensor_view<T>(out), op, dpkit::algorithm::automatic, o);
    });
  }

  void check_cpu(const at::Tensor& t, const char* what) const {
    if (!t.device().is_cpu())
      throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(getRank()) + ": " + what + " of " +
                                    dpkit::detail::torch_describe(t) + ": only CPU tensors (use the nccl backend on GPUs)");
  }

  /// The flat tensors of _allgather_base and _reduce_scatter_base: `whole`
  /// must hold world size x `part`'s elements, of its element type, both
  /// contiguous CPU tensors. @throws dpkit::invalid_argument naming both.
  void check_flat(const at::Tensor& whole, const at::Tensor& part, const char* what) const {
    dpkit::check_torch_tensor(whole, std::string("dpkit backend ") + what);
    dpkit::check_torch_tensor(part, std::string("dpkit backend ") + what);
    check_cpu(whole, what);
    check_cpu(part, what);
    if (whole.numel() != part.numel() * getSize() || whole.scalar_type() != part.scalar_type())
      throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(getRank()) + ": " + what + ": " +
                                    dpkit::detail::torch_describe(whole) + " is not world size x " +
                                    dpkit::detail::torch_describe(part));
  }

  at::Tensor single(const std::vector<at::Tensor>& ts, const char* what) const {
    if (ts.size() != 1)
      throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(getRank()) + ": " + what + " takes one tensor, got " +
                                    std::to_string(ts.size()));
    dpkit::check_torch_tensor(ts[0], std::string("dpkit backend ") + what);
    check_cpu(ts[0], what);
    return ts[0];
  }

  int check_root(std::int64_t root, const char* what) const {
    if (root < 0 || root >= getSize())
      throw dpkit::invalid_argument("dpkit backend: rank " + std::to_string(getRank()) + ": " + what + " root " +
                                    std::to_string(root) + " not in [0, " + std::to_string(getSize()) + ")");
    return static_cast<int>(root);
  }

  dpkit::collective_options timeout_of(std::chrono::milliseconds t) const {
    dpkit::collective_options o;
    o.timeout = t.count() > 0 ? t : timeout_;
    return o;
  }

  /// Queues (or runs at once) `f(transport, options)`, `f` generic over
  /// the transport.
  template <class F>
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::vector<at::Tensor> outputs, std::size_t nbytes,
                                        dpkit::collective_options o, F f) {
    body run = [f = std::move(f)](comm_ref c, const dpkit::collective_options& opts) {
      std::visit([&](auto* p) { f(*p, opts); }, c);
    };
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    task t{std::move(run), o, std::move(outputs), future};
    std::unique_lock lk(mu_);
    if (stop_ || !has_comm())
      throw dpkit::communicator_error("dpkit backend: rank " + std::to_string(getRank()) +
                                      ": the process group was shut down (destroy_process_group or interpreter exit)");
    if (queue_.empty() && !busy_ && nbytes <= inline_bytes_) {
      busy_ = true;
      lk.unlock();
      execute(t);
      lk.lock();
      busy_ = false;
      cv_.notify_all();
    } else {
      queue_.push_back(std::move(t));
      cv_.notify_all();
    }
    return c10::make_intrusive<dpkit_work>(getRank(), type, future);
  }

  void execute(task& t) {
    try {
      t.run(comm(), t.options);
      t.future->markCompleted(c10::IValue(t.outputs));
    } catch (...) {
      t.future->setError(std::current_exception());
    }
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

  std::optional<dpkit::gloo_transport> gloo_;
#if DPKIT_DIST_MPI
  std::optional<dpkit::mpi> mpi_;
#endif
  std::chrono::milliseconds timeout_;
  std::size_t inline_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  bool stopped_ = false;
  std::thread worker_;
  std::shared_ptr<std::function<void()>> shutdown_fn_;
};

/// Shuts down every live group, then MPI_Finalize if this module initialized
/// MPI (atexit, from dpkit.distributed).
void finalize() {
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

#if DPKIT_DIST_MPI
/// MPI_Abort(MPI_COMM_WORLD, code) if MPI is initialized and not finalized
/// (else nothing): the launcher then ends every rank of the job. Called by
/// dpkit.distributed's sys.excepthook after a rank's unhandled exception, so
/// that its exit does not wait in MPI_Finalize for ranks that wait for it.
void abort_mpi(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

/// `s` from world rank `root` to every rank (MPI_Bcast of its length, then
/// its bytes): the rendezvous address of init_process_group.
std::string broadcast_string(std::string s, int root) {
  init_mpi();
  unsigned long long n = s.size();
  if (MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD) != MPI_SUCCESS)
    throw dpkit::error("dpkit backend: MPI_Bcast failed");
  s.resize(static_cast<std::size_t>(n));
  if (n > 0 && MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD) != MPI_SUCCESS)
    throw dpkit::error("dpkit backend: MPI_Bcast failed");
  return s;
}
#endif

/// dpkit::elastic_group for Python (dpkit.elastic.ElasticGroup): one
/// process's membership, and collectives of torch CPU tensors over the
/// current generation's transport, run on the calling thread (the GIL
/// released) with `step_timeout` as their deadline. Not thread-safe: one
/// Python thread uses it (the group's heartbeat thread is its own).
class elastic_core {
public:
  elastic_core(const std::string& url, std::int64_t id, const dpkit::elastic_options& o,
               std::chrono::milliseconds step_timeout)
      : step_timeout_(step_timeout) {
    if (step_timeout.count() <= 0)
      throw dpkit::invalid_argument("ElasticGroup: id " + std::to_string(id) + ": step_timeout must be > 0, got " +
                                    std::to_string(step_timeout.count()) + " ms");
    group_ = std::make_unique<dpkit::elastic_group>(url, id, o);
    first_generation_ = group_->generation();
  }
  dpkit::elastic_group& group() {
    if (!group_) throw dpkit::communicator_error("ElasticGroup: closed");
    return *group_;
  }
  /// The generation this process first became a member in (0: it started
  /// with the job, so it holds the job's initial training state).
  std::uint64_t first_generation() const noexcept { return first_generation_; }
  void close() { group_.reset(); }
  dpkit::collective_options options() const {
    dpkit::collective_options o;
    o.timeout = step_timeout_;
    return o;
  }
  void allreduce(const at::Tensor& t, const std::string& op) {
    dpkit::reduce_op r;
    if (op == "sum") r = dpkit::reduce_op::sum;
    else if (op == "avg") r = dpkit::reduce_op::avg;
    else if (op == "min") r = dpkit::reduce_op::min;
    else if (op == "max") r = dpkit::reduce_op::max;
    else if (op == "prod") r = dpkit::reduce_op::prod;
    else
      throw dpkit::invalid_argument("ElasticGroup.all_reduce: rank " + std::to_string(group().rank()) + ": op '" + op +
                                    "' is not one of sum, avg, min, max, prod");
    dpkit::torch_allreduce(group().transport(), t, r, {}, options());
  }
  void broadcast(const at::Tensor& t, int root) { dpkit::torch_broadcast(group().transport(), t, root, options()); }
  void barrier() { dpkit::barrier(group().transport(), options()); }

private:
  std::unique_ptr<dpkit::elastic_group> group_;
  std::chrono::milliseconds step_timeout_;
  std::uint64_t first_generation_ = 0;
};

/// dpkit's exceptions as dpkit._core's Python classes (every kind: when this
/// module and _core share pybind11's internals, as with Debian's torch,
/// this translator is tried first for _core's calls too), for this module's
/// calls and torch's (Work.wait): with torch 2.x this module is compiled
/// with torch's own pybind11, whose translators are not _core's.
void register_translator() {
  const py::module_ core = py::module_::import("dpkit._core");
  const auto cls = [&](const char* name) { return py::object(core.attr(name)).release().ptr(); };
  static PyObject* const error_t = cls("Error");
  static PyObject* const format_t = cls("FormatError");
  static PyObject* const stale_t = cls("StaleIndexError");
  static PyObject* const cancelled_t = cls("BuildCancelled");
  static PyObject* const timeout_t = cls("TimeoutError");
  static PyObject* const mismatch_t = cls("MismatchError");
  static PyObject* const communicator_t = cls("CommunicatorError");
  static PyObject* const peer_t = cls("PeerError");
  static PyObject* const invalid_t = cls("InvalidArgument");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dpkit::timeout_error& e) {
      PyErr_SetString(timeout_t, e.what());
    } catch (const dpkit::mismatch_error& e) {
      PyErr_SetString(mismatch_t, e.what());
    } catch (const dpkit::communicator_error& e) {
      PyErr_SetString(communicator_t, e.what());
    } catch (const dpkit::peer_error& e) {
      PyErr_SetString(peer_t, e.what());
    } catch (const dpkit::stale_index_error& e) {
      PyErr_SetString(stale_t, e.what());
    } catch (const dpkit::format_error& e) {
      PyErr_SetString(format_t, e.what());
    } catch (const dpkit::build_cancelled& e) {
      PyErr_SetString(cancelled_t, e.what());
    } catch (const dpkit::error& e) {
      PyErr_SetString(error_t, e.what());
    } catch (const dpkit::invalid_argument& e) {
      PyErr_SetString(invalid_t, e.what());
    }
  });
}

} // namespace

PYBIND11_MODULE(_dist_ext, m) {
  m.doc() = "the torch.distributed backend 'dpkit' (see dpkit.distributed)";
  py::module_::import("torch.distributed");
  register_translator();
  m.attr("torch_version") = TORCH_VERSION; // the torch this module was compiled against
#if DPKIT_DIST_MPI
  m.attr("has_mpi") = true;
#else
  m.attr("has_mpi") = false;
#endif
  auto cls = py::class_<process_group_dpkit, group_base, c10::intrusive_ptr<process_group_dpkit>>(m, "ProcessGroupDpkit");
  cls.def(py::init([](c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
                      const std::string& group_id, const std::string& hostname, std::size_t inline_bytes) {
            return c10::make_intrusive<process_group_dpkit>(std::move(store), rank, size, timeout, group_id, hostname,
                                                            inline_bytes);
          }),
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_id") = "",
          py::arg("hostname") = "", py::arg("inline_bytes") = 65536, py::call_guard<py::gil_scoped_release>(),
          "the group meeting through torch's store (Gloo pairs)");
#if DPKIT_DIST_MPI
  cls.def(py::init([](int rank, int size, std::chrono::milliseconds timeout, std::vector<int> global_ranks, std::size_t inline_bytes) {
            return c10::make_intrusive<process_group_dpkit>(rank, size, timeout, std::move(global_ranks), inline_bytes);
          }),
          py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("global_ranks"), py::arg("inline_bytes") = 65536,
          py::call_guard<py::gil_scoped_release>(), "the group over MPI (mpirun)");
#endif
  cls.def("shutdown", &process_group_dpkit::shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("inline_bytes", &process_group_dpkit::inline_bytes)
      .def_property_readonly("transport", &process_group_dpkit::transport_name);
  py::class_<elastic_core, std::shared_ptr<elastic_core>>(m, "ElasticCore")
      .def(py::init([](const std::string& url, std::int64_t id, int first_size, int min_size, bool majority,
                       std::chrono::milliseconds heartbeat_interval, std::chrono::milliseconds dead_after,
                       std::chrono::milliseconds announce_wait, std::chrono::milliseconds connect_timeout,
                       std::chrono::milliseconds timeout, std::chrono::milliseconds step_timeout,
                       std::chrono::milliseconds step_deadline, const std::string& hostname) {
             dpkit::elastic_options o;
             o.first_size = first_size;
             o.min_size = min_size;
             o.majority = majority;
             o.heartbeat_interval = heartbeat_interval;
             o.dead_after = dead_after;
             o.announce_wait = announce_wait;
             o.connect_timeout = connect_timeout;
             o.timeout = timeout;
             o.step_deadline = step_deadline;
             o.transport.hostname = hostname;
             return std::make_shared<elastic_core>(url, id, o, step_timeout);
           }),
           py::arg("url"), py::arg("id"), py::arg("first_size"), py::arg("min_size"), py::arg("majority"),
           py::arg("heartbeat_interval"), py::arg("dead_after"), py::arg("announce_wait"), py::arg("connect_timeout"),
           py::arg("timeout"), py::arg("step_timeout"), py::arg("step_deadline"), py::arg("hostname"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("id", [](elastic_core& e) { return e.group().id(); })
      .def_property_readonly("rank", [](elastic_core& e) { return e.group().rank(); })
      .def_property_readonly("size", [](elastic_core& e) { return e.group().size(); })
      .def_property_readonly("generation", [](elastic_core& e) { return e.group().generation(); })
      .def_property_readonly("first_generation", &elastic_core::first_generation)
      .def_property_readonly("members", [](elastic_core& e) { return e.group().members(); })
      .def_property_readonly("shm_messages", [](elastic_core& e) { return e.group().transport().shm_messages(); })
      .def("rebuild", [](elastic_core& e) { e.group().rebuild(); }, py::call_guard<py::gil_scoped_release>())
      .def("admit_joiners", [](elastic_core& e) { return e.group().admit_joiners(); },
           py::call_guard<py::gil_scoped_release>())
      .def("joiners", [](elastic_core& e) { return e.group().joiners(); }, py::call_guard<py::gil_scoped_release>())
      .def("enter_step", [](elastic_core& e, std::uint64_t step) { e.group().enter_step(step); }, py::arg("step"),
           py::call_guard<py::gil_scoped_release>())
      .def("all_reduce", &elastic_core::allreduce, py::arg("tensor"), py::arg("op") = "sum",
           py::call_guard<py::gil_scoped_release>())
      .def("broadcast", &elastic_core::broadcast, py::arg("tensor"), py::arg("root") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("barrier", &elastic_core::barrier, py::call_guard<py::gil_scoped_release>())
      .def("close", &elastic_core::close, py::call_guard<py::gil_scoped_release>());
  m.def("finalize", &finalize, py::call_guard<py::gil_scoped_release>(),
        "shuts down every dpkit group, then MPI_Finalize if dpkit initialized MPI");
#if DPKIT_DIST_MPI
  m.def("init_mpi", &init_mpi, "MPI_Init_thread(MPI_THREAD_MULTIPLE) unless initialized; returns the thread level");
  m.def("abort_mpi", &abort_mpi, py::arg("code") = 1, py::call_guard<py::gil_scoped_release>(),
        "MPI_Abort(MPI_COMM_WORLD, code) if MPI is initialized and not finalized");
  m.def("broadcast_string", &broadcast_string, py::arg("s"), py::arg("root") = 0, py::call_guard<py::gil_scoped_release>(),
        "s from MPI_COMM_WORLD rank root to every rank");
#endif
}
