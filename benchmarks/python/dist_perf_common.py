"""What dist_allreduce_perf.py and dist_collectives_perf.py share: the
flags, the sizes, the launch (torchrun's env:// or mpirun), one group per
backend in one process, the measurement of a size (backends alternating
batch by batch, each batch sized from a timed doubling loop to fill
--batch-seconds, the median over --batches of the slowest rank's mean time
per call) and nccl-tests' table. dist_allreduce_perf.py's docstring says
why the measurement is made so."""
import argparse
import datetime
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

import dpkit


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags both scripts take (nccl-tests' -b -e -f -n -w, and the
    batches, the backends, the binding)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-b", "--minbytes", default="8")
    ap.add_argument("-e", "--maxbytes", default="256M")
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-n", "--iters", type=int, default=0,
                    help="calls per batch, every backend (0: as many as fill --batch-seconds, per backend, at least 5)")
    ap.add_argument("--batch-seconds", type=float, default=0.04, help="a batch's length with -n 0 (seconds)")
    ap.add_argument("-w", "--warmup_iters", type=int, default=3)
    ap.add_argument("--batches", type=int, default=15, help="timed batches per size and backend (median)")
    ap.add_argument("--backends", default="dpkit,gloo",
                    help="comma-separated; the first is the default group; \"dpkit_store\" is dpkit made "
                         "through torch's store even under mpirun; \"dpkit_registered\" is dpkit with the "
                         "all-reduce's tensor registered (dpkit.distributed.register_memory)")
    ap.add_argument("--bind", action="store_true",
                    help="bind each rank to its share of the CPUs (dpkit.distributed.bind_to_cores), as mpirun "
                         "does by default and torchrun does not; no effect under mpirun")
    return ap


def sizes(args) -> List[int]:
    """-b, -b*f, -b*f*f, ... up to -e (bytes)."""
    out, s = [], parse_size(args.minbytes)
    while s <= parse_size(args.maxbytes):
        out.append(s)
        s *= args.stepfactor
    return out


def register_dpkit_store() -> None:
    """Registers backend "dpkit_store": dpkit's group made through the
    store torch passes (the bootstrap of a launch without mpirun: shared
    memory from shm_open, Gloo pairs), even under mpirun, where "dpkit"
    is an MPI communicator. With --backends dpkit,dpkit_store under mpirun
    the two bootstraps alternate batch by batch in one run, so the
    machine's noise hits both; two separate launches, a minute apart, on
    this 2-vCPU VM differ as much between two mpirun runs as between
    mpirun and env:// (benchmarks/results/2026-11-29-bootstrap-ab.md)."""
    dpkit.distributed._register(dist, dpkit.distributed._create_store, "dpkit_store")


def register_dpkit_registered() -> None:
    """Registers backend "dpkit_registered": a second "dpkit" group, on
    which the scripts' all-reduces run on tensors passed to
    dpkit.distributed.register_memory first (their pages shared by the
    ranks: the direct all-reduce), beside "dpkit" on unregistered tensors,
    alternated batch by batch in one run."""
    dpkit.distributed._register(dist, dpkit.distributed._create, "dpkit_registered")


# (tensor, group) registered for the current size; released before the next
registered: List[Tuple[torch.Tensor, object]] = []


def register(t: torch.Tensor, g) -> torch.Tensor:
    """register_memory(t, g), remembered for release_registered(); returns t."""
    dpkit.distributed.register_memory(t, g)
    registered.append((t, g))
    return t


def release_registered() -> None:
    """Ends every registration register() made (their tensors private again)."""
    for t, g in registered:
        dpkit.distributed.release_memory(t, g)
    registered.clear()


def init(args) -> Tuple[int, int, List[str], Dict[str, object]]:
    """Binds (--bind), makes the default group of the first backend
    (ranks from mpirun under mpirun, else env://) and one group of each
    other backend, warms each up (50 all-reduces of -b bytes: its first
    calls set up connections and fault in memory, as nccl-tests warms up
    before timing); returns (rank, world, backends, {backend: group}), the
    default group as None."""
    backends = args.backends.split(",")
    if "dpkit_store" in backends:
        register_dpkit_store()
    if "dpkit_registered" in backends:
        register_dpkit_registered()
    if args.bind:
        dpkit.distributed.bind_to_cores()
    timeout = datetime.timedelta(minutes=5)
    if dpkit.distributed.launched_by_mpi():
        dpkit.distributed.init_process_group(backends[0], timeout=timeout)  # ranks from mpirun
    else:
        dist.init_process_group(backends[0], timeout=timeout)  # env:// (torchrun, accelerate launch)
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {backends[0]: None}
    for b in backends[1:]:
        groups[b] = dist.new_group(backend=b)
    w = torch.zeros(max(1, parse_size(args.minbytes) // 4))
    for b in backends:
        for _ in range(50):
            dist.all_reduce(w, group=groups[b])
        dist.barrier(group=groups[b])
    return rank, world, backends, groups


def finish() -> None:
    dist.barrier()
    # Every group, before the interpreter finalizes: torch 2.15's gloo worker
    # thread otherwise may release its last work's tensors during
    # finalization, take the GIL, and abort the process ("terminate called
    # without an active exception" in ProcessGroupGloo::runLoop; rank 0, 2 of
    # 6 torchrun runs to 256 MiB), which torchrun reports as a failed job.
    dist.destroy_process_group()


def _slowest(seconds: float) -> float:
    """The largest `seconds` of all ranks (a MAX over the default group)."""
    el = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(el, dist.ReduceOp.MAX)
    return el.item()


def seconds_per_call(call: Callable[[], None], group, at_least: float) -> float:
    """Mean seconds of call() on the slowest rank, from a loop of 1, 2, 4,
    ... calls until the slowest rank's loop took `at_least` seconds (each
    loop's time is agreed by a MAX over the default group, so every rank
    runs the same loops)."""
    k = 1
    while True:
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(k):
            call()
        el = _slowest(time.perf_counter() - t0)
        if el >= at_least or k >= 1 << 20:
            return el / k
        k *= 2


# A cell of the table: (seconds per call, #wrong summed over the ranks), or
# None where the backend did not run the operation.
Cell = Optional[Tuple[float, int]]


def measure(args, backends: List[str], groups: Dict[str, object],
            prepare: Callable[[str, object], Tuple[Callable[[], None], int]],
            failed: Optional[Dict[str, str]] = None) -> List[Cell]:
    """One size: for each backend b, prepare(b, group) sets the data, makes
    one call, and returns (call, this rank's #wrong in its result); then -w
    calls, and the calls per batch (-n, or as many as fill --batch-seconds,
    at least 5). Then --batches rounds, the backends in turn, each a batch
    after a barrier of its group; a batch's time is the slowest rank's mean
    per call. Returns per backend (the median batch, #wrong of all ranks).

    With `failed` (a dict), a backend whose prepare raised on any rank is
    left out (None), here and in later calls, and failed[b] says why
    (this rank's exception, or the rank that had one)."""
    calls, wrongs, iters = {}, {}, {}
    for b in backends:
        if failed is not None and b in failed:
            continue
        g = groups[b]
        if failed is None:
            calls[b], wrongs[b] = prepare(b, g)
        else:
            err = None
            try:
                calls[b], wrongs[b] = prepare(b, g)
            except Exception as e:  # noqa: BLE001 (reported in the table)
                err = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            bad = torch.tensor([dist.get_rank() if err else -1], dtype=torch.int64)
            dist.all_reduce(bad, dist.ReduceOp.MAX)
            if bad.item() >= 0:
                failed[b] = err or f"failed on rank {bad.item()}"
                calls.pop(b, None)
                continue
        for _ in range(args.warmup_iters):
            calls[b]()
        iters[b] = args.iters if args.iters > 0 else \
            max(5, round(args.batch_seconds / seconds_per_call(calls[b], g, args.batch_seconds / 4)))
    times = {b: [] for b in calls}
    for _ in range(max(1, args.batches)):
        for b in calls:
            g, call = groups[b], calls[b]
            dist.barrier(group=g)
            t0 = time.perf_counter()
            for _ in range(iters[b]):
                call()
            times[b].append(_slowest((time.perf_counter() - t0) / iters[b]))
    row: List[Cell] = []
    for b in backends:
        if b not in calls:
            row.append(None)
            continue
        wr = torch.tensor([wrongs[b]], dtype=torch.int64)
        dist.all_reduce(wr)
        row.append((statistics.median(times[b]), int(wr.item())))
    return row


def print_header(title: str, backends: List[str]) -> None:
    """nccl-tests' header, one column group per backend (rank 0 prints)."""
    print(title)
    cols = "".join(f" {b + ' time':>14} {'algbw':>7} {'busbw':>7} {'#wrong':>6}" for b in backends)
    print(f"# {'size':>12} {'count':>12}{cols} {'ratio':>7}")
    print(f"# {'(B)':>12} {'(elements)':>12}" + " " + " ".join(f"{'(us)':>14} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"
                                                                     for _ in backends) + f" {backends[1] + '/' + backends[0] if len(backends) > 1 else '':>7}")


def print_row(size: int, count: int, row: List[Cell], busbw_factor: float, time_factor: float = 1.0) -> None:
    """A row: `size` bytes (nccl-tests' size of the operation: algbw is
    size / time), `count` elements (its count column), per backend time
    (us), algbw, busbw = algbw * busbw_factor, #wrong, and the ratio of
    the second backend's time to the first's. A cell's seconds are
    multiplied by time_factor (a ping-pong's round trip: 0.5). A backend
    that did not run prints "-"."""
    cells, ts = "", []
    for c in row:
        if c is None:
            cells += f" {'-':>14} {'-':>7} {'-':>7} {'-':>6}"
            ts.append(None)
            continue
        t = c[0] * time_factor
        algbw = size / t / 1e9
        cells += f" {t * 1e6:14.1f} {algbw:7.3f} {algbw * busbw_factor:7.3f} {c[1]:6d}"
        ts.append(t)
    ratio = ""
    if len(ts) > 1:
        ratio = f"{ts[1] / ts[0]:7.2f}" if ts[0] and ts[1] else f"{'-':>7}"
    print(f"  {size:12d} {count:12d}{cells} {ratio}", flush=True)
