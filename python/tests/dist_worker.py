"""Run under mpirun by test_distributed.py, or as plain processes with
torch's env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) by
test_torch_launch.py: `python dist_worker.py CASE OUTDIR`. DPKIT_TEST_INIT
says how the group is made: "mpi" (default: dpkit.distributed's mpirun
helper), "env" (init_process_group("dpkit"): env://, what torchrun gives),
or an init_method URL (file://..., tcp://...) with RANK and WORLD_SIZE.
Writes one JSON file per rank (OUTDIR/rank<R>.json, written whole and then
renamed into place) for the test to check; any failed check raises (non-zero
exit). Files, not stdout: mpirun forwards each rank's stdout in chunks, and a
long line of one rank can be cut by another rank's output (CI saw two RESULT
lines joined)."""
import atexit
import datetime
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

import dpkit


def inputs(rank, n, dtype, lo=-8, hi=9):
    """Rank `rank`'s integer-valued input: every rank can compute every
    rank's, so the reference is a plain local reduction (exact)."""
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def reference(op, xs):
    acc = xs[0].clone().double()
    for x in xs[1:]:
        x = x.double()
        if op in ("sum", "avg"):
            acc += x
        elif op == "product":
            acc *= x
        elif op == "min":
            acc = torch.minimum(acc, x)
        elif op == "max":
            acc = torch.maximum(acc, x)
    if op == "avg":
        acc /= len(xs)
    return acc


OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def case_collectives():
    r, w = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    checked = 0
    for n in (0, 1, 5, w - 1, 1000, 300_000):  # 300k floats: past inline_bytes, on the worker thread
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
            for op in ("sum", "product", "min", "max", "avg"):
                if op == "avg" and not dtype.is_floating_point:
                    continue
                lo, hi = (1, 3) if op == "product" else (-8, 9)
                xs = [inputs(p, n, dtype, lo, hi) for p in range(w)]
                t = xs[r].clone()
                dist.all_reduce(t, OPS[op])
                ref = reference(op, xs)
                assert torch.equal(t.double(), ref.to(dtype).double()), (n, dtype, op)
                if op != "avg" and dtype != torch.bfloat16:  # gloo has no AVG and no bf16
                    u = xs[r].clone()
                    dist.all_reduce(u, OPS[op], group=gloo)
                    assert torch.equal(t, u), (n, dtype, op, "gloo")
                checked += 1
    for n in (0, 3, 100_000):
        for root in range(w):
            t = inputs(r, n, torch.float32)
            dist.broadcast(t, root)
            assert torch.equal(t, inputs(root, n, torch.float32))
        outs = [torch.empty(n) for _ in range(w)]
        dist.all_gather(outs, inputs(r, n, torch.float32))
        for p in range(w):
            assert torch.equal(outs[p], inputs(p, n, torch.float32))
        flat = torch.empty(w * n)
        dist._all_gather_base(flat, inputs(r, n, torch.float32))
        assert torch.equal(flat, torch.cat([inputs(p, n, torch.float32) for p in range(w)]))
        # reduce-scatter: rank p's input list is inputs(p, w*n) split in w parts
        full = [inputs(p, w * n, torch.float32) for p in range(w)]
        out = torch.empty(n)
        dist.reduce_scatter(out, list(full[r].split(n)) if n else [torch.empty(0)] * w)
        assert torch.equal(out, reference("sum", full).float()[r * n:(r + 1) * n])
        out2 = torch.empty(n)
        dist._reduce_scatter_base(out2, full[r].clone())
        assert torch.equal(out2, out)
        for root in range(w):
            t = inputs(r, n, torch.float32)
            dist.reduce(t, root, dist.ReduceOp.MAX)
            if r == root:
                assert torch.equal(t, reference("max", [inputs(p, n, torch.float32) for p in range(w)]).float())
    # async: several in flight, waited in order
    ts = [inputs(r, 50_000, torch.float32) for _ in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for wk in works:
        wk.wait()
    for t in ts:
        assert torch.equal(t, reference("sum", [inputs(p, 50_000, torch.float32) for p in range(w)]).float())
    fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    assert torch.equal(fut.wait()[0], torch.full((3,), float(w)))
    dist.barrier()
    # a subgroup of ranks 0 and 1 (dpkit backend, MPI_Comm_create_group)
    if w >= 3:
        sub = dist.new_group([0, 1], backend="dpkit")
        if r in (0, 1):
            t = torch.full((4,), float(r + 1))
            dist.all_reduce(t, group=sub)
            assert torch.equal(t, torch.full((4,), 3.0))
    return {"checked": checked}


def dpkit_group_transport():
    """"gloo" or "mpi": the transport of the default group's dpkit backend."""
    pg = dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):  # torch 2.x: the backend under torch's ProcessGroup
        pg = pg._get_backend(torch.device("cpu"))
    return pg.transport


def case_short():
    """The collectives over a group met through torch's store, briefly: every
    reduce op on a few sizes and dtypes, broadcast from every root,
    all-gather, reduce-scatter (list and flat), reduce, barrier, async and
    a subgroup; against the exact local reference and a gloo group."""
    r, w = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    checked = 0
    for n in (0, 5, 1000, 100_000):  # 100k floats: past inline_bytes, on the worker thread
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            for op in ("sum", "product", "min", "max", "avg"):
                if op == "avg" and not dtype.is_floating_point:
                    continue
                lo, hi = (1, 3) if op == "product" else (-8, 9)
                xs = [inputs(p, n, dtype, lo, hi) for p in range(w)]
                t = xs[r].clone()
                dist.all_reduce(t, OPS[op])
                assert torch.equal(t.double(), reference(op, xs).to(dtype).double()), (n, dtype, op)
                if op != "avg" and dtype != torch.bfloat16:  # gloo has no AVG and no bf16
                    u = xs[r].clone()
                    dist.all_reduce(u, OPS[op], group=gloo)
                    assert torch.equal(t, u), (n, dtype, op, "gloo")
                checked += 1
    for n in (0, 3, 20_000):
        for root in range(w):
            t = inputs(r, n, torch.float32)
            dist.broadcast(t, root)
            assert torch.equal(t, inputs(root, n, torch.float32))
            checked += 1
        outs = [torch.empty(n) for _ in range(w)]
        dist.all_gather(outs, inputs(r, n, torch.float32))
        gouts = [torch.empty(n) for _ in range(w)]
        if n:  # torch 1.13's gloo all_gather of empty tensors dies of SIGFPE
            dist.all_gather(gouts, inputs(r, n, torch.float32), group=gloo)
        for p in range(w):
            assert torch.equal(outs[p], inputs(p, n, torch.float32)) and (not n or torch.equal(outs[p], gouts[p]))
        flat = torch.empty(w * n)
        dist._all_gather_base(flat, inputs(r, n, torch.float32))
        assert torch.equal(flat, torch.cat([inputs(p, n, torch.float32) for p in range(w)]))
        full = [inputs(p, w * n, torch.float32) for p in range(w)]
        out = torch.empty(n)
        dist.reduce_scatter(out, list(full[r].split(n)) if n else [torch.empty(0)] * w)
        assert torch.equal(out, reference("sum", full).float()[r * n:(r + 1) * n])
        out2 = torch.empty(n)
        dist._reduce_scatter_base(out2, full[r].clone())
        assert torch.equal(out2, out)
        t = inputs(r, n, torch.float32)
        dist.reduce(t, w - 1, dist.ReduceOp.MAX)
        if r == w - 1:
            assert torch.equal(t, reference("max", [inputs(p, n, torch.float32) for p in range(w)]).float())
        checked += 4
    ts = [inputs(r, 30_000, torch.float32) for _ in range(3)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for wk in works:
        wk.wait()
    for t in ts:
        assert torch.equal(t, reference("sum", [inputs(p, 30_000, torch.float32) for p in range(w)]).float())
    dist.barrier()
    if w >= 3:  # a subgroup of ranks 0 and 1 meets under its own prefix of the store
        sub = dist.new_group([0, 1], backend="dpkit")
        if r in (0, 1):
            t = torch.full((4,), float(r + 1))
            dist.all_reduce(t, group=sub)
            assert torch.equal(t, torch.full((4,), 3.0))
            checked += 1
        dist.barrier()
    return {"checked": checked, "transport": dpkit_group_transport()}


def case_init_error():
    """init_process_group itself fails (ranks disagree on the world size, or
    the other ranks never come): the error's type, message and time."""
    t0 = time.monotonic()
    try:
        init_group(datetime.timedelta(seconds=float(os.environ.get("DPKIT_TEST_TIMEOUT", "3"))))
        return {"error": "none"}
    except Exception as e:  # noqa: BLE001  (what the user sees, recorded for the test)
        return {"error": type(e).__name__ + ": " + str(e)[:600], "elapsed_s": time.monotonic() - t0,
                "dpkit": isinstance(e, (dpkit.Error, dpkit.InvalidArgument))}


def init_group(timeout):
    init = os.environ.get("DPKIT_TEST_INIT", "mpi")
    if init == "mpi":
        dpkit.distributed.init_process_group("dpkit", timeout=timeout)
    elif init == "env":
        dist.init_process_group("dpkit", timeout=timeout)
    else:
        dist.init_process_group("dpkit", init_method=init, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 4))


def train(group, steps=30):
    r = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(make_model(), process_group=group, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(42 + r)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t, group=group)
        losses.append(t.item() / dist.get_world_size())
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return losses, params


def case_ddp():
    gloo = dist.new_group(backend="gloo")
    l_dpkit, p_dpkit = train(None)  # the default group: "dpkit"
    l_gloo, p_gloo = train(gloo)
    return {"dpkit": l_dpkit, "gloo": l_gloo, "params_equal": bool(torch.equal(p_dpkit, p_gloo)),
            "max_param_diff": float((p_dpkit - p_gloo).abs().max())}


def case_errors():
    r, w = dist.get_rank(), dist.get_world_size()
    out = {}
    # a non-contiguous tensor is refused on the calling rank, before any message
    try:
        dist.all_reduce(torch.ones(4, 4).t())
        out["noncontiguous"] = "no error"
    except ValueError as e:
        out["noncontiguous"] = type(e).__name__ + ": " + str(e)
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.int32), dist.ReduceOp.BAND)
        out["band"] = "no error"
    except ValueError as e:
        out["band"] = type(e).__name__ + ": " + str(e)
    dist.barrier()
    # ranks disagree on the size: an error on every rank, never a wrong result
    t = torch.ones(4 if r == 0 else 8)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        out["mismatch"] = "no error: " + str(t.tolist())
    except dpkit.Error as e:
        out["mismatch"] = type(e).__name__ + ": " + str(e)
    out["mismatch_s"] = time.monotonic() - t0
    # the group failed: later calls say so at once
    try:
        dist.all_reduce(torch.ones(2))
        out["after"] = "no error"
    except dpkit.Error as e:
        out["after"] = type(e).__name__ + ": " + str(e)
    return out


def case_timeout():
    """Rank 1 never calls: rank 0 raises dpkit.TimeoutError within the
    group's timeout (2 s)."""
    r = dist.get_rank()
    out = {}
    if r == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(16))
            out["timeout"] = "no error"
        except dpkit.Error as e:
            out["timeout"] = type(e).__name__ + ": " + str(e)
        out["elapsed_s"] = time.monotonic() - t0
    else:
        time.sleep(4)
    return out


def case_rank_death():
    """The last rank _exits 300 ms into a loop of 64 MiB all-reduces; the
    survivors raise (dpkit.PeerError) and record when. Their exit path
    (dpkit's atexit: the group's shutdown, MPI_Finalize) is timed by the hook
    main() registered before dpkit's."""
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(16 << 20)
    dist.all_reduce(t)
    dist.barrier()
    if r == n - 1:
        time.sleep(0.3)
        (OUTDIR / "death").write_text(repr(time.monotonic()))
        os._exit(3)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 60:
            dist.all_reduce(t)
        return {"error": "none"}
    except dpkit.Error as e:
        return {"error": type(e).__name__ + ": " + str(e)[:300], "error_at": time.monotonic()}


def case_raise():
    """The last rank raises (an unhandled exception ends its program) while
    the others all-reduce with it, a 120 s timeout: dpkit's excepthook must
    MPI_Abort so that mpirun ends the job at once."""
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1024)
    dist.all_reduce(t)
    if r == n - 1:
        raise RuntimeError(f"rank {r} fails on purpose")
    dist.all_reduce(t)
    return {"error": "not ended"}


def case_spin():
    """After one all-reduce, writes ready<rank> (with this process's pid)
    and all-reduces 4 MiB until killed (the test SIGKILLs every rank in the
    middle of a collective)."""
    r = dist.get_rank()
    t = torch.ones(1 << 20)
    dist.all_reduce(t)
    (OUTDIR / f"ready{r}").write_text(str(os.getpid()))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        dist.all_reduce(t)
    return {"error": "not killed"}


def case_destroy_busy():
    """A group destroyed while its worker still runs queued all-reduces
    whose tensors and Works Python has already dropped: the group's
    destructor runs in Python's dealloc, with the GIL, and waits for the
    worker; the worker's release of a tensor whose Python object C++ now
    owns takes the GIL. Before the fix the two waited for each other forever
    (dist_allreduce_perf.py hung so at its destroy_process_group)."""
    g = dist.new_group(backend="dpkit")
    for _ in range(4):
        dist.all_reduce(torch.ones(16 << 20), group=g, async_op=True)  # 64 MiB: queued to the worker
    t0 = time.monotonic()
    dist.destroy_process_group(g)
    del g  # the last reference: ~process_group_dpkit, with the GIL
    destroy_s = time.monotonic() - t0
    t = torch.ones(4)
    dist.all_reduce(t)  # the default group still works
    return {"destroy_s": destroy_s, "sum": t.tolist()}


OUTDIR = None


def main():
    global OUTDIR
    case, outdir = sys.argv[1], pathlib.Path(sys.argv[2])
    OUTDIR = outdir
    if case == "rank_death":
        # runs after dpkit's own atexit hook (registered later, run earlier)
        atexit.register(lambda: (outdir / f"exit{os.environ.get('OMPI_COMM_WORLD_RANK', '?')}").write_text(
            repr(time.monotonic())))
    timeout = datetime.timedelta(seconds=2 if case in ("timeout", "errors") else 5 if case == "rank_death" else 120)
    if case == "init_error":
        result = case_init_error()
        rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    else:
        init_group(timeout)
        result = globals()["case_" + case]()
        rank = dist.get_rank()
    tmp = outdir / f"rank{rank}.json.tmp"
    tmp.write_text(json.dumps({"rank": rank, **result}))
    os.replace(tmp, outdir / f"rank{rank}.json")


if __name__ == "__main__":
    main()
