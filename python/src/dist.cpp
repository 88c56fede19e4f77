// dpkit._dist: the torch.distributed backend "dpkit" (a c10d::ProcessGroup,
// torch 1.13's extension interface) over dpkit's MPI transport: dpkit's own
// all-reduce (shared memory within a node, hierarchical across nodes, chosen
// by the tuning table), broadcast, all-gather, reduce-scatter, reduce and
// barrier on CPU tensors. python/dpkit/distributed.py registers it with
// torch.distributed.Backend.register_backend; docs/python.md is the guide.
//
// Launch: mpirun (Open MPI). The group's ranks are MPI ranks: torch's rank
// must equal the MPI rank (checked), and the store torch hands the creator is
// not used (MPI is the rendezvous).
//
// Each group runs its collectives in call order on one worker thread and
// completes the Work's future when done, so torch's DDP overlaps them with
// backward; a call of at most inline_bytes made while the worker is idle runs
// at once on the caller's thread (the latency of a small all-reduce without a
// thread hand-off). Errors are dpkit's typed exceptions, raised by
// Work.wait() (dpkit.TimeoutError, dpkit.MismatchError, ...).
#include <mpi.h>

#include <dpkit/collectives.hpp>
#include <dpkit/core/errors.hpp>
#include <dpkit/torch/tensor.hpp>
#include <dpkit/transport/mpi.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/core/ivalue.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
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

/// A c10d::ProcessGroup whose collectives are dpkit's.
class process_group_dpkit : public c10d::ProcessGroup {
public:
  /// The group of `global_ranks` (MPI_COMM_WORLD ranks; empty = the world),
  /// in which this process is `rank` of `size`. Collective over the group.
  /// @throws dpkit::invalid_argument if torch's rank or size differs from
  ///         MPI's (the job was not launched with mpirun, or ranks were
  ///         renumbered); dpkit::error if MPI fails.
  process_group_dpkit(int rank, int size, std::chrono::milliseconds timeout, std::vector<int> global_ranks,
                      std::size_t inline_bytes)
      : c10d::ProcessGroup(rank, size), timeout_(timeout), inline_bytes_(inline_bytes) {
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
    comm_.emplace(comm, true);
    MPI_Comm_free(&comm);
    shutdown_fn_ = std::make_shared<std::function<void()>>([this] { shutdown(); });
    {
      const std::lock_guard lk(registry_mu);
      registry.push_back(shutdown_fn_);
    }
    worker_ = std::thread([this] { work_loop(); });
  }

  ~process_group_dpkit() override { shutdown(); }

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
    comm_.reset();
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    const at::Tensor t = single(tensors, "allreduce");
    const dpkit::reduce_op op = to_dpkit(opts.reduceOp, getRank());
    return submit(c10d::OpType::ALLREDUCE, {t}, bytes(t), timeout_of(opts.timeout),
                  [t, op](dpkit::mpi& c, const dpkit::collective_options& o) { dpkit::torch_allreduce(c, t, op, {}, o); });
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
                  [ts, op](dpkit::mpi& c, const dpkit::collective_options& o) {
                    for (const auto& t : ts) dpkit::torch_allreduce(c, t, op, {}, o);
                  });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = single(tensors, "broadcast");
    const int root = check_root(opts.rootRank, "broadcast");
    return submit(c10d::OpType::BROADCAST, {t}, bytes(t), timeout_of(opts.timeout),
                  [t, root](dpkit::mpi& c, const dpkit::collective_options& o) {
                    dpkit::visit_torch_tensor(t, [&](auto v) { dpkit::broadcast(c, v, root, dpkit::algorithm::automatic, o); });
                  });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    const at::Tensor t = single(tensors, "reduce");
    const int root = check_root(opts.rootRank, "reduce");
    const dpkit::reduce_op op = to_dpkit(opts.reduceOp, getRank());
    return submit(c10d::OpType::REDUCE, {t}, bytes(t), timeout_of(opts.timeout),
                  [t, root, op](dpkit::mpi& c, const dpkit::collective_options& o) {
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
                  [in, outs](dpkit::mpi& c, const dpkit::collective_options& o) {
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
                  [in, out](dpkit::mpi& c, const dpkit::collective_options& o) { gather_flat(c, in, out, o); });
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
                  [ins, out, op](dpkit::mpi& c, const dpkit::collective_options& o) {
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
                  [in, out, op](dpkit::mpi& c, const dpkit::collective_options& o) { scatter_flat(c, in, out, op, o); });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return submit(c10d::OpType::BARRIER, {}, 0, timeout_of(opts.timeout),
                  [](dpkit::mpi& c, const dpkit::collective_options& o) {
                    dpkit::barrier(c, o);
                  });
  }

  /// Collectives run inline (no worker hand-off) up to this many bytes.
  std::size_t inline_bytes() const noexcept { return inline_bytes_; }

private:
  using body = std::function<void(dpkit::mpi&, const dpkit::collective_options&)>;
  struct task {
    body run;
    dpkit::collective_options options;
    std::vector<at::Tensor> outputs;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };

  static std::size_t bytes(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

  static void gather_flat(dpkit::mpi& c, const at::Tensor& in, const at::Tensor& out, const dpkit::collective_options& o) {
    dpkit::visit_torch_tensor(in, [&](auto v) {
      using T = std::remove_pointer_t<decltype(v.ptr)>;
      dpkit::allgather(c, v, dpkit::torch_tensor_view<T>(out), dpkit::algorithm::automatic, o);
    });
  }
  static void scatter_flat(dpkit::mpi& c, const at::Tensor& in, const at::Tensor& out, dpkit::reduce_op op,
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

  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::vector<at::Tensor> outputs, std::size_t nbytes,
                                        dpkit::collective_options o, body run) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    task t{std::move(run), o, std::move(outputs), future};
    std::unique_lock lk(mu_);
    if (stop_ || !comm_)
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
      t.run(*comm_, t.options);
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
      task t = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lk.unlock();
      execute(t);
      lk.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::optional<dpkit::mpi> comm_;
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
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (mpi_started_here && inited && !finalized) MPI_Finalize();
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

} // namespace

PYBIND11_MODULE(_dist, m) {
  m.doc() = "the torch.distributed backend 'dpkit' (see dpkit.distributed)";
  py::module_::import("torch.distributed");
  py::module_::import("dpkit._core"); // dpkit's exception types and their translator
  py::class_<process_group_dpkit, c10d::ProcessGroup, c10::intrusive_ptr<process_group_dpkit>>(m, "ProcessGroupDpkit")
      .def(py::init([](int rank, int size, std::chrono::milliseconds timeout, std::vector<int> global_ranks, std::size_t inline_bytes) {
             return c10::make_intrusive<process_group_dpkit>(rank, size, timeout, std::move(global_ranks), inline_bytes);
           }),
           py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("global_ranks"), py::arg("inline_bytes") = 65536,
           py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &process_group_dpkit::shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("inline_bytes", &process_group_dpkit::inline_bytes);
  m.def("init_mpi", &init_mpi, "MPI_Init_thread(MPI_THREAD_MULTIPLE) unless initialized; returns the thread level");
  m.def("broadcast_string", &broadcast_string, py::arg("s"), py::arg("root") = 0, py::call_guard<py::gil_scoped_release>(),
        "s from MPI_COMM_WORLD rank root to every rank");
  m.def("finalize", &finalize, py::call_guard<py::gil_scoped_release>(),
        "shuts down every dpkit group, then MPI_Finalize if dpkit initialized MPI");
}
