#!/usr/bin/env python3
"""dist.all_reduce through torch.distributed, backend "dpkit" against "gloo"
(and any other), side by side in one run, in nccl-tests' table (time of the
slowest rank, algbw = bytes / time, busbw = algbw * 2 (n - 1) / n).

    torchrun --nproc-per-node 2 benchmarks/python/dist_allreduce_perf.py -b 8 -e 256M -f 4
    mpirun -np 2 build-python/venv/bin/python benchmarks/python/dist_allreduce_perf.py -b 8 -e 256M -f 4

Both groups live in one process: the default group is "dpkit", the others
are dist.new_group(backend=...). For each size the backends alternate batch
by batch (--batches of them), so the machine's noise hits both; a backend's
time is the median over its batches of the slowest rank's mean time per call
(one batch: nccl-tests' plain mean). A batch is -n calls, or with -n 0 as
many as fill --batch-seconds (0.04 s) of that backend, counted from a timed
loop of at least a quarter of that (calls doubling from 1; the slowest
rank's time, so every rank makes the same count). A single call is no
measure for it: the first call at a new size, after the other backend's
batch, took 80-180 us where the next thousand took 16 us each (dpkit, 2
ranks), which made batches of 3-8 ms that one lost time slice could double.
A call of a few microseconds is mostly Python and torch, and a batch now and
then loses the core to something else; the median keeps such a batch from
deciding a row. 15 batches by default: with 5, "dpkit" against itself in one
run (--backends dpkit,dpkit_store under mpirun) came out more than 10% apart
at 3 of 26 sizes in each of three runs, with 15 at 0-1 of 26 in five
(benchmarks/results/2026-11-29-bootstrap-ab.md). Out of place is not measured (dist.all_reduce is
in place). The float32 SUM of every size is checked against the exact sum
(#wrong, as nccl-tests' -c 1).
"""
import argparse
import datetime
import statistics
import sys
import time

import torch
import torch.distributed as dist

import dpkit


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def seconds_per_call(x: torch.Tensor, group, at_least: float) -> float:
    """Mean seconds of dist.all_reduce(x, group=group) on the slowest rank,
    from a loop of 1, 2, 4, ... calls until the slowest rank's loop took
    `at_least` seconds (each loop's time is agreed by a MAX over the default
    group, so every rank runs the same loops)."""
    k = 1
    while True:
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(k):
            dist.all_reduce(x, group=group)
        el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(el, dist.ReduceOp.MAX)
        if el.item() >= at_least or k >= 1 << 20:
            return el.item() / k
        k *= 2


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
                         "through torch's store even under mpirun")
    ap.add_argument("--bind", action="store_true",
                    help="bind each rank to its share of the CPUs (dpkit.distributed.bind_to_cores), as mpirun "
                         "does by default and torchrun does not; no effect under mpirun")
    args = ap.parse_args()

    backends = args.backends.split(",")
    if "dpkit_store" in backends:
        register_dpkit_store()
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
    # warm every group up before the first row (its first calls set up
    # connections and fault in memory), as nccl-tests warms up before timing
    w = torch.zeros(max(1, parse_size(args.minbytes) // 4))
    for b in backends:
        for _ in range(50):
            dist.all_reduce(w, group=groups[b])
        dist.barrier(group=groups[b])
    sizes = []
    s = parse_size(args.minbytes)
    while s <= parse_size(args.maxbytes):
        sizes.append(s)
        s *= args.stepfactor
    if rank == 0:
        print(f"# dist.all_reduce float32 sum, {world} ranks, backends {', '.join(backends)} (torch {torch.__version__})")
        cols = "".join(f" {b + ' time':>14} {'algbw':>7} {'busbw':>7} {'#wrong':>6}" for b in backends)
        print(f"# {'size':>12} {'count':>12}{cols} {'ratio':>7}")
        print(f"# {'(B)':>12} {'(elements)':>12}" + " " + " ".join(f"{'(us)':>14} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"
                                                                         for _ in backends) + f" {backends[1] + '/' + backends[0] if len(backends) > 1 else '':>7}")
    for size in sizes:
        count = max(1, size // 4)
        x = torch.full((count,), float(rank + 1))
        expect = float(world * (world + 1) // 2)
        wrongs, iters = {}, {}
        for b in backends:
            g = groups[b]
            x.fill_(float(rank + 1))
            dist.all_reduce(x, group=g)
            wrongs[b] = int((x != expect).sum().item())
            for _ in range(args.warmup_iters):
                dist.all_reduce(x, group=g)
            iters[b] = args.iters if args.iters > 0 else \
                max(5, round(args.batch_seconds / seconds_per_call(x, g, args.batch_seconds / 4)))
        times = {b: [] for b in backends}
        for _ in range(max(1, args.batches)):
            for b in backends:
                g = groups[b]
                dist.barrier(group=g)
                t0 = time.perf_counter()
                for _ in range(iters[b]):
                    dist.all_reduce(x, group=g)
                dt = torch.tensor([(time.perf_counter() - t0) / iters[b]], dtype=torch.float64)
                dist.all_reduce(dt, dist.ReduceOp.MAX)
                times[b].append(dt.item())
        row = []
        for b in backends:
            wr = torch.tensor([wrongs[b]], dtype=torch.int64)
            dist.all_reduce(wr)
            t = statistics.median(times[b])
            algbw = count * 4 / t / 1e9
            row.append((t * 1e6, algbw, algbw * 2 * (world - 1) / world, int(wr.item())))
        if rank == 0:
            cells = "".join(f" {t:14.1f} {a:7.3f} {bb:7.3f} {w:6d}" for t, a, bb, w in row)
            ratio = f"{row[1][0] / row[0][0]:7.2f}" if len(row) > 1 else ""
            print(f"  {count * 4:12d} {count:12d}{cells} {ratio}", flush=True)
    dist.barrier()
    # Every group, before the interpreter finalizes: torch 2.15's gloo worker
    # thread otherwise may release its last work's tensors during
    # finalization, take the GIL, and abort the process ("terminate called
    # without an active exception" in ProcessGroupGloo::runLoop; rank 0, 2 of
    # 6 torchrun runs to 256 MiB), which torchrun reports as a failed job.
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
