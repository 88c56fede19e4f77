#!/usr/bin/env python3
"""Every torch.distributed collective and a send/recv ping-pong, backend
"dpkit" against "gloo" (and any other), side by side in one run, one
nccl-tests table per operation; the sibling of dist_allreduce_perf.py, with
its flags and its measurement (dist_perf_common.py: the backends alternate
batch by batch, each batch sized to fill --batch-seconds, the median over
--batches of the slowest rank's mean time per call), and --ops.

    torchrun --nproc-per-node 2 benchmarks/python/dist_collectives_perf.py -b 8 -e 256M -f 4
    mpirun -np 2 build-python/venv/bin/python benchmarks/python/dist_collectives_perf.py --ops all_gather,send_recv

Operations (float32; root 0 where there is one), with nccl-tests' size (the
larger of a rank's input and output, in bytes: algbw = size / time), count
(elements: of the buffer, or of one rank's part where the buffer is split
in n) and busbw factor:

    all_reduce       dist.all_reduce, sum, in place           size = buffer       2(n-1)/n
    broadcast        dist.broadcast from 0, in place          size = buffer       1
    reduce           dist.reduce to 0, sum, in place          size = buffer       1
    all_gather       all_gather_into_tensor (_all_gather_base size = output       (n-1)/n
                     in torch 1.x), one output tensor
    reduce_scatter   reduce_scatter_tensor (_reduce_scatter_  size = input        (n-1)/n
                     base in torch 1.x), sum
    all_to_all       all_to_all_single, even split            size = input        (n-1)/n
    gather           dist.gather to 0                         size = 0's output   (n-1)/n
    scatter          dist.scatter from 0                      size = 0's input    (n-1)/n
    send_recv        rank 0 sends, rank 1 receives and sends  size = message      1
                     it back; time = half the round trip;
                     other ranks idle

(gather and scatter: (n-1)/n as nccl-tests' gather.cu and scatter.cu, the
part that stays on the root not crossing the bus.) Where the size does not
split in n, each rank's part is size / 4 / n elements rounded down, at
least 1, and the row shows the size that was sent. Every size's result is
checked against the exact expected values (#wrong, summed over the ranks):
small integers that name the sending rank and the position, sums of them,
so float32 holds them exactly. A backend that raises on an operation is
left out of that table ("-") and the exception printed under it; the run
goes on.
"""
import sys

import torch
import torch.distributed as dist

import dist_perf_common as common

OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
       "send_recv"]

# torch 2.x names, torch 1.13's otherwise
all_gather_into_tensor = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
reduce_scatter_tensor = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base


def pattern(tag: int, n: int) -> torch.Tensor:
    """n float32 values naming `tag` (a rank, or a pair of ranks) and the
    position: tag * 1024 + i % 1024, exact in float32 (and their sums over a
    few ranks)."""
    return (torch.arange(n, dtype=torch.int64) % 1024 + 1024 * tag).to(torch.float32)


def wrong(got: torch.Tensor, want: torch.Tensor) -> int:
    return int((got != want).sum().item())


def op_setup(op: str, nominal: int, rank: int, world: int):
    """One size of `op`: returns (size, count, busbw factor, title,
    prepare) as common.measure takes prepare: prepare(backend, group) sets
    the inputs, makes one call, and returns (call, this rank's #wrong)."""
    c = max(1, nominal // 4)
    per = max(1, c // world)  # a rank's part where the buffer is split in n
    split = (world - 1) / world
    ranks = range(world)

    if op == "all_reduce":
        common.release_registered()  # the previous size's
        x = torch.empty(c)
        want = sum(pattern(p, c) for p in ranks)

        def prepare(b, g):
            # "dpkit_registered": a tensor of its own, registered first
            t = common.register(torch.empty(c), g) if b == "dpkit_registered" else x
            t.copy_(pattern(rank, c))
            dist.all_reduce(t, group=g)
            return (lambda: dist.all_reduce(t, group=g)), wrong(t, want)
        return c * 4, c, 2 * split, "dist.all_reduce float32 sum, in place", prepare

    if op == "broadcast":
        x = torch.empty(c)
        want = pattern(0, c)

        def prepare(b, g):
            x.copy_(want if rank == 0 else pattern(rank + 1, c))
            dist.broadcast(x, 0, group=g)
            return (lambda: dist.broadcast(x, 0, group=g)), wrong(x, want)
        return c * 4, c, 1.0, "dist.broadcast float32 from rank 0, in place", prepare

    if op == "reduce":
        x = torch.empty(c)
        want = sum(pattern(p, c) for p in ranks)

        def prepare(b, g):
            x.copy_(pattern(rank, c))
            dist.reduce(x, 0, group=g)
            return (lambda: dist.reduce(x, 0, group=g)), wrong(x, want) if rank == 0 else 0
        return c * 4, c, 1.0, "dist.reduce float32 sum to rank 0, in place", prepare

    if op == "all_gather":
        x, y = torch.empty(per), torch.empty(per * world)
        want = torch.cat([pattern(p, per) for p in ranks])

        def prepare(b, g):
            x.copy_(pattern(rank, per))
            y.fill_(-1)
            all_gather_into_tensor(y, x, group=g)
            return (lambda: all_gather_into_tensor(y, x, group=g)), wrong(y, want)
        return per * world * 4, per, split, f"dist.{all_gather_into_tensor.__name__} float32", prepare

    if op == "reduce_scatter":
        x, y = torch.empty(per * world), torch.empty(per)
        want = sum(pattern(p, per * world) for p in ranks)[rank * per:(rank + 1) * per]

        def prepare(b, g):
            x.copy_(pattern(rank, per * world))
            y.fill_(-1)
            reduce_scatter_tensor(y, x, group=g)
            return (lambda: reduce_scatter_tensor(y, x, group=g)), wrong(y, want)
        return per * world * 4, per, split, f"dist.{reduce_scatter_tensor.__name__} float32 sum", prepare

    if op == "all_to_all":
        # rank r's part for rank p names the pair (r, p): r * world + p
        x, y = torch.empty(per * world), torch.empty(per * world)
        mine = torch.cat([pattern(rank * world + p, per) for p in ranks])
        want = torch.cat([pattern(p * world + rank, per) for p in ranks])

        def prepare(b, g):
            x.copy_(mine)
            y.fill_(-1)
            dist.all_to_all_single(y, x, group=g)
            return (lambda: dist.all_to_all_single(y, x, group=g)), wrong(y, want)
        return per * world * 4, per, split, "dist.all_to_all_single float32, even split", prepare

    if op == "gather":
        x = torch.empty(per)
        outs = [torch.empty(per) for _ in ranks] if rank == 0 else None

        def prepare(b, g):
            x.copy_(pattern(rank, per))
            if outs is not None:
                for o in outs:
                    o.fill_(-1)
            dist.gather(x, outs, 0, group=g)
            bad = sum(wrong(outs[p], pattern(p, per)) for p in ranks) if outs is not None else 0
            return (lambda: dist.gather(x, outs, 0, group=g)), bad
        return per * world * 4, per, split, "dist.gather float32 to rank 0", prepare

    if op == "scatter":
        y = torch.empty(per)
        ins = [pattern(p, per) for p in ranks] if rank == 0 else None

        def prepare(b, g):
            y.fill_(-1)
            dist.scatter(y, ins, 0, group=g)
            return (lambda: dist.scatter(y, ins, 0, group=g)), wrong(y, pattern(rank, per))
        return per * world * 4, per, split, "dist.scatter float32 from rank 0", prepare

    if op == "send_recv":
        x, y = torch.empty(c), torch.empty(c)
        want = pattern(0, c)

        def ping(g):
            dist.send(x, 1, group=g)
            dist.recv(y, 1, group=g)

        def pong(g):
            dist.recv(y, 0, group=g)
            dist.send(y, 0, group=g)

        def prepare(b, g):
            x.copy_(want)
            y.fill_(-1)
            if rank == 0:
                ping(g)
                return (lambda: ping(g)), wrong(y, want)  # what came back
            if rank == 1:
                pong(g)
                return (lambda: pong(g)), wrong(y, want)  # what came
            return (lambda: None), 0
        return c * 4, c, 1.0, "dist.send/dist.recv float32 ping-pong, ranks 0 and 1, half the round trip", prepare

    raise ValueError(f"unknown op {op!r} (ops: {', '.join(OPS)})")


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of: {', '.join(OPS)} (default all)")
    args = ap.parse_args()
    ops = args.ops.split(",")
    for op in ops:
        if op not in OPS:
            ap.error(f"unknown op {op!r} (ops: {', '.join(OPS)})")
    rank, world, backends, groups = common.init(args)
    if "send_recv" in ops and world < 2:
        ap.error("send_recv needs 2 ranks")
    for i, op in enumerate(ops):
        failed = {}
        for j, nominal in enumerate(common.sizes(args)):
            size, count, factor, title, prepare = op_setup(op, nominal, rank, world)
            if rank == 0 and j == 0:
                common.print_header(("" if i == 0 else "\n") + f"# {op}: {title}, {world} ranks, backends "
                                    f"{', '.join(backends)} (torch {torch.__version__})", backends)
            row = common.measure(args, backends, groups, prepare, failed)
            if rank == 0:
                common.print_row(size, count, row, factor, 0.5 if op == "send_recv" else 1.0)
        if rank == 0:
            for b, why in failed.items():
                print(f"# {op} over {b}: {why}", flush=True)
    common.finish()


if __name__ == "__main__":
    sys.exit(main())
