// dpkit._dist_ext (loaded by dpkit/_dist.py once it has checked that the
// imported torch is the one this was compiled against): the
// torch.distributed backend "dpkit" over dpkit's collectives and
// point-to-point messages on CPU tensors: every operation ProcessGroupGloo
// has (all-reduce, dense, sparse and coalesced; broadcast; reduce;
// all-gather and reduce-scatter in their list, flat and coalesced forms;
// gather; scatter; all-to-all, even and uneven; send, recv and recv from
// any source with tags; barrier; monitored barrier; sequence numbers) and
// the coalescing manager. Over MPI (under mpirun) the algorithm is the one
// dpkit's dispatchers choose (shared memory within a node, hierarchical
// across nodes); over the Gloo transport met through torch's store, the
// same on dpkit::gloo_transport. python/dpkit/distributed.py registers it
// with torch.distributed.Backend.register_backend; docs/python.md is the
// guide.
//
// One source for torch 1.13 (the group is a c10d::ProcessGroup) and torch 2.x
// (a c10d::Backend under torch's ProcessGroup), told apart by
// TORCH_VERSION_MAJOR; python/meson.build compiles it against the torch of
// the Python it installs into. The backend's rooms (python/src/dist/), as
// torch splits ProcessGroupGloo's store, work classes and operations:
//   common.hpp            includes, reduce ops, the tensor views dpkit takes
//   store.hpp             torch's c10d::Store as dpkit's rendezvous store
//   mpi_launch.hpp        MPI under mpirun
//   work.hpp              the Work of a collective (a future) and of a send
//                         or receive (the transport's request)
//   process_group.hpp     the group: how it is made, its worker, what every
//                         operation shares
//   collectives.hpp       all-reduce, broadcast, reduce, all-gather,
//                         reduce-scatter, barrier, coalescing
//   gather_scatter.hpp    gather, scatter
//   alltoall.hpp          all_to_all_single, all_to_all
//   p2p.hpp               send, recv, recv from any source
//   monitored_barrier.hpp monitored barrier, sequence numbers
//   elastic.hpp           dpkit.elastic's group
//   errors.hpp            dpkit's exceptions as Python's
//
// Launch: torchrun (or any env:// / file:// / tcp:// init_method): the group
// meets through the c10d::Store torch hands the creator (Gloo's full-mesh
// rendezvous, then dpkit's collectives over dpkit::gloo_transport); every
// rank first records its group size in the store, and ranks that disagree
// fail together with a message naming both sizes. Under an MPI launcher
// (mpirun: OMPI_COMM_WORLD_SIZE / PMI_SIZE in the environment; this build
// has MPI when DPKIT_DIST_MPI) the group is an MPI communicator
// (dpkit::mpi) instead: torch's rank must equal the MPI rank (checked), and
// the store is not used. The group's operations are written once over
// either transport (std::visit of a transport pointer).
//
// Each group runs its collectives in call order on one worker thread and
// completes the Work's future when done, so torch's DDP overlaps them with
// backward; a call of at most inline_bytes made while the worker is idle runs
// at once on the caller's thread (the latency of a small all-reduce without a
// thread hand-off). Sends and receives are posted at once on the caller's
// thread and completed by their Work's wait(). Errors are dpkit's typed
// exceptions, raised by Work.wait() (dpkit.TimeoutError, whose message
// starts with "Timed out", dpkit.MismatchError, ...).
#include "dist/alltoall.hpp"
#include "dist/collectives.hpp"
#include "dist/elastic.hpp"
#include "dist/errors.hpp"
#include "dist/gather_scatter.hpp"
#include "dist/monitored_barrier.hpp"
#include "dist/p2p.hpp"
#include "dist/process_group.hpp"

namespace {
using dpkit_dist::elastic_core;
using dpkit_dist::finalize;
using dpkit_dist::group_base;
using dpkit_dist::process_group_dpkit;
using dpkit_dist::register_translator;
#if DPKIT_DIST_MPI
using dpkit_dist::abort_mpi;
using dpkit_dist::broadcast_string;
using dpkit_dist::init_mpi;
#endif
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
      .def_property_readonly("transport", &process_group_dpkit::transport_name)
      .def("_register_memory", &process_group_dpkit::register_memory, py::arg("tensor"),
           py::call_guard<py::gil_scoped_release>(), "dpkit.distributed.register_memory")
      .def("_release_memory", &process_group_dpkit::release_memory, py::arg("tensor"),
           py::call_guard<py::gil_scoped_release>(), "dpkit.distributed.release_memory")
      .def_property_readonly("_registered_tensors", &process_group_dpkit::registered_tensors);
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
