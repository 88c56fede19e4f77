"""The torch.distributed backend "dpkit".

``import dpkit`` registers it; then, in a job launched with ``mpirun``::

    import dpkit, torch.distributed as dist
    dpkit.distributed.init_process_group()          # or, by hand:
    # dist.init_process_group("dpkit", init_method="tcp://HOST:PORT",
    #                         rank=RANK, world_size=WORLD)   # RANK = the MPI rank

and every ``dist.all_reduce`` / ``broadcast`` / ``all_gather`` /
``reduce_scatter`` / ``reduce`` / ``barrier`` on CPU tensors of the group runs
dpkit's algorithms over MPI (shared memory within a node, hierarchical across
nodes; the tuning table picks, docs/tuning.md), so ``DistributedDataParallel``
runs over it unchanged. ``dist.new_group(ranks, backend="dpkit")`` makes
subgroups (MPI_Comm_create_group).

Semantics: torch.distributed's (matching ProcessGroupGloo on CPU tensors):
the collectives are asynchronous (``async_op=True`` returns a Work whose
``wait()`` raises the collective's error); they run in call order on one
worker thread per group, and a collective of at most ``inline_bytes`` (64 KiB)
issued while that thread is idle runs at once on the caller's thread. Tensors
must be contiguous CPU tensors of float32/64, float16, bfloat16, int8/32/64 or
uint8; reduce ops SUM, AVG, PRODUCT, MIN, MAX. Not supported (RuntimeError):
gather, scatter, all_to_all, send/recv. Errors: dpkit.TimeoutError (the
group's timeout passed: a rank is missing), dpkit.MismatchError (ranks called
different collectives or sizes), dpkit.CommunicatorError (the group failed
earlier or was shut down), dpkit.InvalidArgument (bad tensor or op).

The rendezvous is MPI's: torch's rank must be the MPI rank (checked). The
store torch passes is used only by torch itself.
"""
from __future__ import annotations

import atexit
import datetime
import os
import socket
from typing import Optional, Tuple

_registered = False
_atexit_done = False


def mpi_env() -> Tuple[int, int]:
    """(rank, world size) from the launcher's environment: Open MPI's
    OMPI_COMM_WORLD_RANK/SIZE, else PMI_RANK/PMI_SIZE (MPICH, Slurm's PMI).
    Raises RuntimeError when the process was not started by an MPI launcher."""
    for r, s in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    raise RuntimeError("dpkit backend: not started by mpirun (no OMPI_COMM_WORLD_RANK / PMI_RANK in the environment)")


def _finalize_at_exit() -> None:
    """Once per process: at interpreter exit, shut down every dpkit group and
    call MPI_Finalize if dpkit initialized MPI (Open MPI reports a process
    that exits without it as an abnormal termination)."""
    global _atexit_done
    if not _atexit_done:
        from . import _dist
        atexit.register(_dist.finalize)
        _atexit_done = True


def _create(opts, pg_options=None):
    """torch.distributed's creator (extended API): a dpkit ProcessGroup for
    this rank of the group."""
    from . import _dist
    inline_bytes = int(os.environ.get("DPKIT_INLINE_BYTES", 65536))
    ranks = list(getattr(opts, "global_ranks_in_group", []) or [])
    _finalize_at_exit()
    return _dist.ProcessGroupDpkit(opts.group_rank, opts.group_size, opts.timeout, ranks, inline_bytes)


def _register_backend() -> None:
    """Registers "dpkit" with torch.distributed (once; a no-op without torch
    or without the compiled backend)."""
    global _registered
    if _registered:
        return
    try:
        import torch.distributed as dist
        from . import _dist  # noqa: F401  (built only with torch and MPI)
    except ImportError:
        return
    if not dist.is_available():
        return
    dist.Backend.register_backend("dpkit", _create, extended_api=True)
    _registered = True


def available() -> bool:
    """True if the backend "dpkit" is registered (torch and MPI were found
    when the package was built)."""
    return _registered


def init_process_group(backend: str = "dpkit", timeout: datetime.timedelta = datetime.timedelta(minutes=30),
                       **kwargs) -> None:
    """``torch.distributed.init_process_group(backend, ...)`` for a job
    started by ``mpirun``: rank and world size from :func:`mpi_env`, and
    torch's store (which torch uses for its own barriers) on rank 0's host at
    a free port, agreed over MPI. ``backend`` may be any torch backend (e.g.
    ``"gloo"`` to compare). Other keyword arguments go to torch."""
    import torch.distributed as dist
    from . import _dist
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
