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
(#wrong, as nccl-tests' -c 1). The loop, the launch and the table are
dist_perf_common.py's, shared with dist_collectives_perf.py (every other
collective and a send/recv ping-pong, the same flags).
"""
import sys

import torch
import torch.distributed as dist

import dist_perf_common as common


def main() -> None:
    args = common.parser(__doc__).parse_args()
    rank, world, backends, groups = common.init(args)
    if rank == 0:
        common.print_header(f"# dist.all_reduce float32 sum, {world} ranks, backends {', '.join(backends)} "
                            f"(torch {torch.__version__})", backends)
    for size in common.sizes(args):
        count = max(1, size // 4)
        x = torch.full((count,), float(rank + 1))
        expect = float(world * (world + 1) // 2)

        def prepare(b, g):
            x.fill_(float(rank + 1))
            dist.all_reduce(x, group=g)
            return (lambda: dist.all_reduce(x, group=g)), int((x != expect).sum().item())

        row = common.measure(args, backends, groups, prepare)
        if rank == 0:
            common.print_row(count * 4, count, row, 2 * (world - 1) / world)
    common.finish()


if __name__ == "__main__":
    sys.exit(main())
