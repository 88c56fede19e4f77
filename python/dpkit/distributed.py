"""The torch.distributed backend "dpkit".

``import dpkit`` registers it; then, in a script launched with
``torchrun --nproc-per-node 2 train.py``::

    import dpkit, torch.distributed as dist
    dist.init_process_group("dpkit")     # env://; or init_method="file:///...", "tcp://HOST:PORT"

and every torch.distributed operation on CPU tensors of the group runs on
dpkit (every one ProcessGroupGloo has: the collectives, gather, scatter,
all_to_all with even and uneven splits, send/recv with tags and from any
source, batch_isend_irecv, the object collectives, monitored_barrier,
sequence numbers), so ``DistributedDataParallel``, FSDP2,
torch.distributed.checkpoint and pipelining run over it unchanged.
The ranks meet through the store torch hands the backend (each group,
``dist.new_group(ranks, backend="dpkit")`` too, under its own prefix) and
talk over dpkit's Gloo transport: within a node through a shared-memory
segment (the shm collectives, and point-to-point messages for ring and
tree), across nodes over TCP pairs. Ranks that disagree on the
world size raise dpkit.InvalidArgument naming both sizes; a rank that never
comes, dpkit.TimeoutError naming it after the group's timeout.

Under ``mpirun`` (a build with Open MPI) the group is an MPI communicator
instead (shared memory within a node, hierarchical across nodes; the tuning
table picks, docs/tuning.md), and torch's rank must be the MPI rank
(checked)::

    dpkit.distributed.init_process_group()          # or, by hand:
    # dist.init_process_group("dpkit", init_method="tcp://HOST:PORT",
    #                         rank=RANK, world_size=WORLD)   # RANK = the MPI rank

Subgroups there are MPI_Comm_create_group's.

Semantics: torch.distributed's (matching ProcessGroupGloo on CPU tensors):
the collectives are asynchronous (``async_op=True`` returns a Work whose
``wait()`` raises the collective's error); they run in call order on one
worker thread per group, and a collective of at most ``inline_bytes`` (64 KiB)
issued while that thread is idle runs at once on the caller's thread. Sends
and receives are posted at once on the caller's thread (tags 0 to 2**28 - 1).
Tensors must be contiguous CPU tensors (reductions: float32/64, float16,
bfloat16, int8/32/64, uint8, bool, complex with SUM/AVG; moving data: any
dtype); reduce ops SUM, AVG, PRODUCT, MIN, MAX, and BAND/BOR/BXOR on integers.
Errors: dpkit.TimeoutError ("Timed out": the group's timeout passed: a rank
is missing), dpkit.MismatchError (ranks called different operations, sizes,
roots or split sizes), dpkit.PeerError (another rank failed),
dpkit.CommunicatorError (the group failed earlier or was shut down),
dpkit.InvalidArgument (a bad tensor, op, rank, tag or size).

The backend is compiled against one torch (recorded in dpkit._build_info);
with another torch imported, :func:`available` is False and making a "dpkit"
group raises ImportError naming both versions (:func:`unavailable_reason`).
"""
from __future__ import annotations

import atexit
import datetime
import os
import socket
from typing import List, Optional, Tuple

_registered = False
_atexit_done = False
_import_error: Optional[str] = None


def mpi_env() -> Tuple[int, int]:
    """(rank, world size) from the launcher's environment: Open MPI's
    OMPI_COMM_WORLD_RANK/SIZE, else PMI_RANK/PMI_SIZE (MPICH, Slurm's PMI).
    Raises RuntimeError when the process was not started by an MPI launcher."""
    for r, s in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    raise RuntimeError("dpkit backend: not started by mpirun (no OMPI_COMM_WORLD_RANK / PMI_RANK in the environment)")


def launched_by_mpi() -> bool:
    """True when an MPI launcher (mpirun, srun with PMI) started this
    process: the backend then runs over MPI (when this build has it)."""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def bind_to_cores(local_rank: Optional[int] = None, local_world_size: Optional[int] = None) -> List[int]:
    """Binds this process to its share of the CPUs it may run on, as
    ``mpirun`` binds each rank by default and ``torchrun`` does not: the
    allowed CPUs (``os.sched_getaffinity``), in order, are cut into
    ``local_world_size`` contiguous slices and this process keeps slice
    ``local_rank`` (with fewer CPUs than local ranks: CPU ``local_rank`` mod
    their count); torch's intra-op threads are set to the slice's size. Both
    default to torch's env:// variables LOCAL_RANK and LOCAL_WORLD_SIZE.
    Call it before the first collective (threads started earlier keep their
    CPUs). Under an MPI launcher (already bound by it) nothing changes.
    Returns the CPUs this process runs on afterwards.

    Raises ValueError when LOCAL_RANK / LOCAL_WORLD_SIZE are missing, not
    integers, or local_rank is not in [0, local_world_size)."""
    cpus = sorted(os.sched_getaffinity(0))
    if launched_by_mpi():
        return cpus

    def env_int(name: str, given: Optional[int]) -> int:
        if given is not None:
            return int(given)
        v = os.environ.get(name)
        if v is None:
            raise ValueError(f"dpkit.distributed.bind_to_cores: {name} is not set (launch with torchrun, or pass it)")
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"dpkit.distributed.bind_to_cores: {name}={v!r} is not an integer") from None

    lr = env_int("LOCAL_RANK", local_rank)
    lws = env_int("LOCAL_WORLD_SIZE", local_world_size)
    if lws < 1 or not 0 <= lr < lws:
        raise ValueError(f"dpkit.distributed.bind_to_cores: local rank {lr} not in [0, {lws})")
    if len(cpus) < lws:
        mine = [cpus[lr % len(cpus)]]
    else:
        per = len(cpus) // lws
        mine = cpus[lr * per:(lr + 1) * per]
    os.sched_setaffinity(0, mine)
    try:
        import torch
        torch.set_num_threads(len(mine))
    except ImportError:
        pass
    return sorted(os.sched_getaffinity(0))


def _finalize_at_exit() -> None:
    """Once per process: at interpreter exit, shut down every dpkit group and
    call MPI_Finalize if dpkit initialized MPI (Open MPI reports a process
    that exits without it as an abnormal termination). Under an MPI launcher
    with more than one rank, also :func:`_abort_on_unhandled_exception`."""
    global _atexit_done
    if not _atexit_done:
        from . import _dist
        atexit.register(_dist.finalize)
        if launched_by_mpi() and getattr(_dist, "has_mpi", False) and mpi_env()[1] > 1 \
                and os.environ.get("DPKIT_ABORT_ON_EXCEPTION", "1") != "0":
            _abort_on_unhandled_exception(_dist.abort_mpi)
        _atexit_done = True


def _abort_on_unhandled_exception(abort) -> None:
    """Wraps ``sys.excepthook``: after the traceback of an exception that ends
    the program is printed, ``abort(1)`` (MPI_Abort on MPI_COMM_WORLD), so
    mpirun ends every rank at once, as mpi4py's ``python -m mpi4py`` does.
    Without it the failed rank's exit waits in MPI_Finalize (a fence over
    every rank) while the others wait in their next collective for it, up to
    the group's timeout (torch's default: 30 minutes): a 2-rank training run
    whose rank 1 raised while rank 0 was in DDP's first broadcast hung so.
    ``DPKIT_ABORT_ON_EXCEPTION=0`` turns this off. ``sys.exit()`` is not an
    unhandled exception and exits normally."""
    import sys
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        try:
            rank = mpi_env()[0]
            # torch 2.x's init_process_group wraps the hook in its own, which
            # captures what this one writes (sys.stderr is then a StringIO)
            # to print it with a "[rankR]: " prefix afterwards: after the
            # abort, that is never; so what was captured goes out now
            out = sys.__stderr__ or sys.stderr
            captured = getattr(sys.stderr, "getvalue", None)
            if sys.stderr is not out and captured is not None:
                out.write("".join(f"[rank{rank}]: {line}\n" for line in captured().splitlines()))
            out.write(f"dpkit: rank {rank}: unhandled {kind.__name__}; MPI_Abort so that the other ranks do "
                      f"not wait for this one (DPKIT_ABORT_ON_EXCEPTION=0 turns this off)\n")
            out.flush()
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - stderr may be closed; abort anyway
            pass
        abort(1)

    sys.excepthook = hook


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _gloo_hostname() -> str:
    """The address this rank's Gloo pairs listen on: DPKIT_GLOO_HOSTNAME if
    set; empty (Gloo's rule: GLOO_SOCKET_IFNAME's address, else this
    machine's host name) unless MASTER_ADDR is a loopback address (all ranks
    on this machine) or the host name does not resolve: then 127.0.0.1, as
    torch's gloo backend falls back."""
    if "DPKIT_GLOO_HOSTNAME" in os.environ:
        return os.environ["DPKIT_GLOO_HOSTNAME"]
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return ""
    if os.environ.get("MASTER_ADDR", "") in _LOOPBACK:
        return "127.0.0.1"
    try:
        socket.gethostbyname(socket.gethostname())
        return ""
    except OSError:
        return "127.0.0.1"


def _inline_bytes() -> int:
    """DPKIT_INLINE_BYTES (bytes; default 65536): the largest collective
    run on the caller's thread when the group's worker is idle."""
    return int(os.environ.get("DPKIT_INLINE_BYTES", 65536))


def _create_store(opts, pg_options=None):
    """torch.distributed's creator (extended API) for a group that meets
    through the store torch passes (already prefixed with the group's
    name, so each group, the default one and every new_group, meets under
    its own keys): the node's shared-memory segment and Gloo pairs, the
    bootstrap of a launch without mpirun. The benchmark registers it as
    "dpkit_store" to run it beside the MPI communicator in one mpirun job."""
    from . import _dist
    _finalize_at_exit()
    return _dist.ProcessGroupDpkit(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                                   str(getattr(opts, "group_id", "") or ""), _gloo_hostname(), _inline_bytes())


def _create(opts, pg_options=None):
    """torch.distributed's creator (extended API): a dpkit group for this
    rank of the group. Under an MPI launcher (and a build with MPI): an MPI
    communicator of the group's global ranks. Otherwise: :func:`_create_store`."""
    from . import _dist
    if launched_by_mpi() and _dist.has_mpi:
        _finalize_at_exit()
        ranks = list(getattr(opts, "global_ranks_in_group", []) or [])
        return _dist.ProcessGroupDpkit(opts.group_rank, opts.group_size, opts.timeout, ranks, _inline_bytes())
    return _create_store(opts, pg_options)


def _unavailable(reason: str):
    """The creator registered when the backend cannot be loaded: making a
    "dpkit" group raises `reason` (an ImportError naming both torch
    versions, say) instead of torch's "invalid backend"."""
    def create(opts, pg_options=None):
        raise ImportError(reason)
    return create


def _register(dist, creator, name: str = "dpkit") -> None:
    try:
        dist.Backend.register_backend(name, creator, extended_api=True, devices=["cpu"])
    except TypeError:  # torch 1.13: no devices argument
        dist.Backend.register_backend(name, creator, extended_api=True)


def _register_backend() -> None:
    """Registers "dpkit" with torch.distributed (once; a no-op without
    torch). When the compiled backend cannot be loaded (built against
    another torch, or not built), import dpkit still works and
    :func:`available` is False; init_process_group("dpkit") then raises the
    ImportError that says why."""
    global _registered, _import_error
    if _registered:
        return
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not dist.is_available():
        return
    try:
        from . import _dist  # noqa: F401  (checks the torch version before loading the extension)
    except ImportError as e:
        _import_error = str(e)
        _register(dist, _unavailable(_import_error))
        return
    _register(dist, _create)
    _registered = True


def available() -> bool:
    """True if the backend "dpkit" is registered and loaded (it was built,
    against the torch imported now)."""
    return _registered


def unavailable_reason() -> Optional[str]:
    """Why the backend is not available (the ImportError's message), or
    None."""
    return _import_error


def init_process_group(backend: str = "dpkit", timeout: datetime.timedelta = datetime.timedelta(minutes=30),
                       **kwargs) -> None:
    """``torch.distributed.init_process_group(backend, ...)`` for either
    launcher. Under torchrun (no MPI launcher in the environment): torch's
    own env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
    Under ``mpirun``: rank and world size from :func:`mpi_env`, and torch's
    store (which torch uses for its own barriers) on rank 0's host at a free
    port, agreed over MPI. ``backend`` may be any torch backend (e.g.
    ``"gloo"`` to compare). Other keyword arguments go to torch."""
    import torch.distributed as dist
    if not launched_by_mpi():
        dist.init_process_group(backend, timeout=timeout, **kwargs)
        return
    from . import _dist
    if not _dist.has_mpi:
        raise RuntimeError("dpkit backend: this build has no MPI (Open MPI was not found when dpkit was built): "
                           "launch with torchrun and call torch.distributed.init_process_group(\"dpkit\")")
    rank, world = mpi_env()
    _dist.init_mpi()
    _finalize_at_exit()
    addr = ""
    if rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        host = socket.gethostname()
        try:
            host = socket.gethostbyname(host)
        except OSError:
            host = "127.0.0.1"  # one host: an unresolvable hostname
        addr = f"tcp://{host}:{port}"
    addr = _dist.broadcast_string(addr, 0)
    dist.init_process_group(backend, init_method=addr, rank=rank, world_size=world, timeout=timeout, **kwargs)


def _dpkit_backend(group, what: str):
    """The ProcessGroupDpkit under `group` (None: the default group)."""
    import torch
    import torch.distributed as dist
    from . import _dist
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):  # torch 2.x: the backend under torch's ProcessGroup
        pg = pg._get_backend(torch.device("cpu"))
    if not isinstance(pg, _dist.ProcessGroupDpkit):
        raise ValueError(f"dpkit.distributed.{what}: the group's backend is {type(pg).__name__}, not dpkit's")
    return pg


def register_memory(tensor, group=None) -> bool:
    """Registers a CPU tensor's memory with a "dpkit" group (C++
    ``dpkit::register_memory``, as ``ncclCommRegister`` or torch's
    symmetric-memory rendezvous for device memory): on one node the whole
    4096-byte pages inside the tensor are remapped, in place and with their
    contents, onto memory every rank of the group maps, so an all-reduce of
    the tensor reads and writes the peers' buffers directly in one pass
    instead of copying through the shared segment
    (benchmarks/results/2026-12-05-registered-memory.md). Worth it for
    tensors all-reduced many times (gradient buckets: see
    :func:`registered_allreduce_hook`).

    Collective over the group: every rank calls it, in the same order
    relative to the group's other operations (it is queued behind them and
    returns once done). The group keeps a reference to the tensor until
    :func:`release_memory` or the group's shutdown. Registering a tensor
    already registered is a no-op. While registered, the pages are shared
    memory: a process forked from this one shares them.

    Returns True when the ranks map the pages, False when nothing was
    registered (a tensor without a whole page on some rank, ranks on
    several nodes) and the tensor works as before. Raises
    dpkit.InvalidArgument for a non-contiguous, sparse or non-CPU tensor,
    or one that overlaps another registration (on every rank), and
    ValueError when the group is not a "dpkit" group."""
    return _dpkit_backend(group, "register_memory")._register_memory(tensor)


def release_memory(tensor, group=None) -> bool:
    """Ends :func:`register_memory`'s registration of `tensor` after the
    group's operations queued before this call: its pages become private
    memory again with their contents, and the group drops its reference.
    Not collective. Returns False when the tensor was not registered."""
    return _dpkit_backend(group, "release_memory")._release_memory(tensor)


class RegisteredAllreduce:
    """The state of :func:`registered_allreduce_hook`: the group and the
    bucket buffers it registered, by bucket index. ``release()`` ends every
    registration (call it on every rank when training is over, or let the
    group's shutdown do it)."""

    def __init__(self, group=None):
        self.group = group
        self.buffers = {}
        self.shared = {}  # bucket index -> register_memory's result (True: the ranks map its pages)

    def release(self) -> None:
        for t in self.buffers.values():
            release_memory(t, self.group)
        self.buffers.clear()
        self.shared.clear()


def registered_allreduce_hook(state: RegisteredAllreduce, bucket):
    """A DistributedDataParallel communication hook (``model.register_comm_hook(
    dpkit.distributed.RegisteredAllreduce(group), dpkit.distributed.registered_allreduce_hook)``)
    that does what DDP's default does (torch's ``allreduce_hook``: each
    bucket's flat gradient buffer divided by the world size, then summed
    over the ranks) with each buffer registered
    (:func:`register_memory`) the first time the hook sees it. DDP keeps a
    bucket's buffer across iterations; when it rebuilds its buckets (after
    the first iteration) the new buffers are registered and the old ones
    released. Every rank sees the buckets in the same order, so the
    registrations, collective, stay in step."""
    import torch.distributed as dist
    buf = bucket.buffer()
    i = bucket.index()
    old = state.buffers.get(i)
    if old is None or old.data_ptr() != buf.data_ptr() or old.numel() != buf.numel():
        if old is not None:
            release_memory(old, state.group)
        state.shared[i] = register_memory(buf, state.group)
        state.buffers[i] = buf
    buf.div_(dist.get_world_size(state.group))
    fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])
