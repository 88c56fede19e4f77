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


def monitored_barrier(group, timeout, wait_all_ranks=False):
    """dist.monitored_barrier; torch 1.13's refuses every backend but gloo
    in Python ("only implemented for GLOO backend"), so there the group's
    own method is called (the backend's monitoredBarrier, as 2.x calls it)."""
    if torch.__version__ >= "2":
        return dist.monitored_barrier(group, timeout, wait_all_ranks=wait_all_ranks)
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def case_ops():
    """Every operation the backend adds beside the all-reduce family, on the
    default ("dpkit") group, each against the exact local reference and
    against a gloo group on the same inputs: gather, scatter, all_to_all
    (even, uneven splits, lists), send/recv/isend/irecv with tags, recv from
    any source, batch_isend_irecv, the object collectives, all_gather in
    its coalesced and flat forms, reduce_scatter_tensor, bitwise ops on
    integers, bool and complex all-reduces, a sparse all-reduce, the
    monitored barrier and the sequence number; and a subgroup."""
    r, w = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    checked = 0

    def same(a, b, what):
        assert torch.equal(a, b), (what, a, b)

    # gather / scatter, every root, 0 and some elements, two dtypes
    for n in (0, 3, 10_000):
        for dtype in (torch.float32, torch.int64):
            for root in range(w):
                x = inputs(r, n, dtype)
                outs = [torch.empty(n, dtype=dtype) for _ in range(w)] if r == root else None
                dist.gather(x, outs, dst=root)
                if r == root:
                    for p in range(w):
                        same(outs[p], inputs(p, n, dtype), ("gather", n, dtype, root))
                if n:  # torch 1.13's gloo dies on empty tensors
                    gouts = [torch.empty(n, dtype=dtype) for _ in range(w)] if r == root else None
                    dist.gather(x, gouts, dst=root, group=gloo)
                    if r == root:
                        for p in range(w):
                            same(outs[p], gouts[p], "gather vs gloo")
                y = torch.empty(n, dtype=dtype)
                dist.scatter(y, [inputs(p, n, dtype) * 3 for p in range(w)] if r == root else None, src=root)
                same(y, inputs(r, n, dtype) * 3, ("scatter", n, dtype, root))
                checked += 2
    # all_to_all_single: even and uneven splits (rank r sends (r + p) % 3 + 1 rows of 4 to rank p)
    x = torch.arange(w * 6, dtype=torch.float32) + 100 * r
    y = torch.empty(w * 6)
    dist.all_to_all_single(y, x)
    yg = torch.empty(w * 6)
    dist.all_to_all_single(yg, x, group=gloo)
    same(y, yg, "all_to_all_single even vs gloo")
    for p in range(w):
        same(y[p * 6:(p + 1) * 6], torch.arange(r * 6, r * 6 + 6, dtype=torch.float32) + 100 * p, "all_to_all_single even")
    send = [(r + p) % 3 + 1 for p in range(w)]
    recv = [(p + r) % 3 + 1 for p in range(w)]
    x = torch.cat([torch.full((send[p], 4), float(r * 10 + p)) for p in range(w)])
    y = torch.empty(sum(recv), 4)
    dist.all_to_all_single(y, x, output_split_sizes=recv, input_split_sizes=send)
    yg = torch.empty(sum(recv), 4)
    dist.all_to_all_single(yg, x, output_split_sizes=recv, input_split_sizes=send, group=gloo)
    same(y, yg, "all_to_all_single uneven vs gloo")
    same(y, torch.cat([torch.full((recv[p], 4), float(p * 10 + r)) for p in range(w)]), "all_to_all_single uneven")
    # all_to_all of lists, any sizes
    ins = [torch.full((p + 1 + r,), float(r * 100 + p), dtype=torch.float64) for p in range(w)]
    outs = [torch.empty(r + 1 + p, dtype=torch.float64) for p in range(w)]
    dist.all_to_all(outs, ins)
    for p in range(w):
        same(outs[p], torch.full((r + 1 + p,), float(p * 100 + r), dtype=torch.float64), "all_to_all lists")
    checked += 3
    # send / recv / isend / irecv with tags; recv from any source; batch_isend_irecv
    right, left = (r + 1) % w, (r - 1) % w
    if w > 1:
        a = torch.full((5,), float(r))
        b = torch.empty(5)
        works = [dist.isend(a, right, tag=7), dist.irecv(b, left, tag=7)]
        for wk in works:
            wk.wait()
        same(b, torch.full((5,), float(left)), "isend/irecv")
        # two tags between one pair, received in the other order
        if r == 0:
            dist.send(torch.full((3,), 1.0), 1, tag=1)
            dist.send(torch.full((3,), 2.0), 1, tag=2)
        elif r == 1:
            t2, t1 = torch.empty(3), torch.empty(3)
            w2 = dist.irecv(t2, 0, tag=2)
            dist.recv(t1, 0, tag=1)
            w2.wait()
            same(t1, torch.full((3,), 1.0), "tag 1")
            same(t2, torch.full((3,), 2.0), "tag 2")
        # every other rank sends to rank 0, which receives from any source
        if r == 0:
            got = set()
            for _ in range(w - 1):
                t = torch.empty(2, dtype=torch.int64)
                src = dist.recv(t, tag=11)
                assert t.tolist() == [src, src * src], (src, t)
                got.add(src)
            assert got == set(range(1, w)), got
        else:
            dist.send(torch.tensor([r, r * r]), 0, tag=11)
        ops = [dist.P2POp(dist.irecv, torch.empty(4), left, tag=3), dist.P2POp(dist.isend, torch.full((4,), float(r)), right, tag=3)]
        reqs = dist.batch_isend_irecv(ops)
        for q in reqs:
            q.wait()
        same(ops[0].tensor, torch.full((4,), float(left)), "batch_isend_irecv")
        checked += 4
    # object collectives (torch builds them from gather, scatter, broadcast, all_gather)
    objs = [None] * w
    dist.all_gather_object(objs, {"rank": r, "sq": [r] * r})
    assert objs == [{"rank": p, "sq": [p] * p} for p in range(w)], objs
    gathered = [None] * w if r == 0 else None
    dist.gather_object(("r", r), gathered, dst=0)
    if r == 0:
        assert gathered == [("r", p) for p in range(w)], gathered
    got = [None]
    dist.scatter_object_list(got, [{"for": p} for p in range(w)] if r == w - 1 else None, src=w - 1)
    assert got == [{"for": r}], got
    lst = [r, "x"] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0, "x"], lst
    checked += 4
    # all_gather, coalesced and flat
    ins = [inputs(r, 3, torch.float32), inputs(r + 10, 7, torch.float32)]
    outs = [[torch.empty(3), torch.empty(7)] for _ in range(w)]
    dist.all_gather_coalesced(outs, ins)
    for p in range(w):
        same(outs[p][0], inputs(p, 3, torch.float32), "all_gather_coalesced 0")
        same(outs[p][1], inputs(p + 10, 7, torch.float32), "all_gather_coalesced 1")
    if hasattr(dist, "all_gather_into_tensor"):
        flat = torch.empty(w * 9, dtype=torch.int32)
        dist.all_gather_into_tensor(flat, inputs(r, 9, torch.int32))
        same(flat, torch.cat([inputs(p, 9, torch.int32) for p in range(w)]), "all_gather_into_tensor")
        full = [inputs(p, w * 5, torch.float64) for p in range(w)]
        out = torch.empty(5, dtype=torch.float64)
        dist.reduce_scatter_tensor(out, full[r].clone())
        same(out, reference("sum", full)[r * 5:(r + 1) * 5], "reduce_scatter_tensor")
        checked += 2
    # bitwise ops on integers, against gloo
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        x = inputs(r, 50, torch.int64, 0, 1 << 20)
        t, u = x.clone(), x.clone()
        dist.all_reduce(t, op)
        dist.all_reduce(u, op, group=gloo)
        same(t, u, ("bitwise", op))
        checked += 1
    # bool (Gloo's rule: the byte sum) and complex sums, against the exact
    # local sums, and against gloo where it takes them (torch 1.13's gloo
    # refuses bool: "Invalid scalar type")
    bx = [inputs(p, 40, torch.int64, 0, 2).bool() for p in range(w)]
    t = bx[r].clone()
    dist.all_reduce(t)
    same(t.view(torch.uint8), sum(b.to(torch.uint8) for b in bx), "bool sum")
    if torch.__version__ >= "2":
        u = bx[r].clone()
        dist.all_reduce(u, group=gloo)
        same(t.view(torch.uint8), u.view(torch.uint8), "bool sum vs gloo")
    cx = [torch.complex(inputs(p, 10, torch.float32), inputs(p + 7, 10, torch.float32)) for p in range(w)]
    t, u = cx[r].clone(), cx[r].clone()
    dist.all_reduce(t)
    dist.all_reduce(u, group=gloo)
    same(t, u, "complex sum vs gloo")
    same(t, sum(cx), "complex sum")
    checked += 2
    # a sparse all-reduce, against gloo: rank r's nonzeros at rows r, r + 1 (overlapping)
    i = torch.tensor([[r % 6, (r + 1) % 6]])
    v = torch.tensor([[1.0 + r, 2.0], [3.0, 4.0 * r]])
    sp = torch.sparse_coo_tensor(i, v, (6, 2))
    t, u = sp.clone(), sp.clone()
    dist.all_reduce(t)
    dist.all_reduce(u, group=gloo)
    same(t.to_dense(), u.to_dense(), "sparse sum")
    checked += 1
    # the monitored barrier and the sequence number
    monitored_barrier(None, datetime.timedelta(seconds=30))
    monitored_barrier(None, datetime.timedelta(seconds=30), wait_all_ranks=True)
    # a group's sequence number counts its operations (Gloo's rule: sends and
    # receives too), so ranks that ran the same ones agree
    fresh = dist.new_group(backend="dpkit")
    pg = fresh._get_backend(torch.device("cpu")) if hasattr(fresh, "_get_backend") else fresh
    before = pg._get_sequence_number_for_group()
    for _ in range(3):
        dist.all_reduce(torch.ones(2), group=fresh)
    seq = pg._get_sequence_number_for_group()
    seqs = [None] * w
    dist.all_gather_object(seqs, seq)
    assert len(set(seqs)) == 1 and seq == before + 3, (seqs, before)
    checked += 2
    if w >= 3:  # the operations in a subgroup of ranks 1 and 2
        sub = dist.new_group([1, 2], backend="dpkit")
        if r in (1, 2):
            outs = [torch.empty(2) for _ in range(2)] if r == 1 else None
            dist.gather(torch.full((2,), float(r)), outs, dst=1, group=sub)
            if r == 1:
                same(outs[1], torch.full((2,), 2.0), "subgroup gather")
            y = torch.empty(2)
            dist.all_to_all_single(y, torch.full((2,), float(r)), group=sub)
            same(y, torch.tensor([1.0, 2.0]), "subgroup all_to_all")
            if r == 1:
                dist.send(torch.ones(3), 2, group=sub, tag=4)
            else:
                t = torch.empty(3)
                dist.recv(t, 1, group=sub, tag=4)
                same(t, torch.ones(3), "subgroup send/recv")
            checked += 3
        dist.barrier()
    return {"checked": checked}


def case_ops_errors():
    """The unhappy path of the added operations (2 ranks, a 2 s group
    timeout): ranks calling different ones (rank 0 gather, rank 1 scatter),
    all_to_all split sizes that disagree, a send nobody receives, a
    monitored barrier a rank never reaches; bad tags, ranks and sizes. Each
    in a group of its own (a failed group stays failed)."""
    r = dist.get_rank()
    out = {}

    def err(f):
        try:
            f()
            return "no error"
        except Exception as e:  # noqa: BLE001 - the test checks the type and the text
            return type(e).__name__ + ": " + str(e)

    def fresh():
        return dist.new_group(backend="dpkit", timeout=datetime.timedelta(seconds=2))

    g = fresh()
    out["kinds"] = err(lambda: dist.gather(torch.ones(4), [torch.empty(4), torch.empty(4)], dst=0, group=g) if r == 0
                       else dist.scatter(torch.empty(4), [torch.ones(4), torch.ones(4)], src=1, group=g))
    g = fresh()
    send = [2, 2] if r == 1 else [2, 3]  # rank 0 sends 3 rows to rank 1, which expects 2
    recv = [2, 2]
    out["splits"] = err(lambda: dist.all_to_all_single(torch.empty(sum(recv), 2), torch.ones(sum(send), 2),
                                                       output_split_sizes=recv, input_split_sizes=send, group=g))
    g = fresh()
    t0 = time.monotonic()
    if r == 0:  # 4 MiB: not eager, so the send waits for a receive that never comes
        out["unreceived"] = err(lambda: dist.send(torch.ones(1 << 20), 1, group=g))
    else:
        out["unreceived"] = err(lambda: dist.recv(torch.empty(1 << 20), 0, group=g, tag=5))  # another tag
    out["unreceived_s"] = time.monotonic() - t0
    g = fresh()
    if r == 0:
        out["monitored"] = err(lambda: monitored_barrier(g, datetime.timedelta(seconds=1)))
    else:
        time.sleep(2)
        out["monitored"] = "skipped"
    dist.barrier()
    g = fresh()
    out["tag"] = err(lambda: g.send([torch.ones(2)], 1 - r, -3) if hasattr(g, "send") else
                     dist.send(torch.ones(2), 1 - r, group=g, tag=-3))
    out["rank"] = err(lambda: dist.distributed_c10d._get_default_group().recv([torch.ones(2)], 5, 0))
    out["sizes"] = err(lambda: dist.all_to_all_single(torch.empty(5), torch.ones(5), group=g))
    dist.barrier()
    return out


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


def train(group, steps=30, hook=None, model_fn=make_model):
    r = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(model_fn(), process_group=group, bucket_cap_mb=0.01)
    if hook is not None:
        model.register_comm_hook(*hook)
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


def case_registered():
    """DDP over "dpkit" with its bucket buffers registered
    (registered_allreduce_hook) against DDP over "gloo": the same losses and
    parameters; then register_memory / release_memory on tensors directly."""
    r, w = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    state = dpkit.distributed.RegisteredAllreduce()

    def wide_model():
        # 1.1 MB of parameters: past DDP's first bucket (1 MiB), so the
        # 10 KB cap makes several buckets
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4096),
                                   torch.nn.Tanh(), torch.nn.Linear(4096, 4))
    l_reg, p_reg = train(None, steps=10, hook=(state, dpkit.distributed.registered_allreduce_hook), model_fn=wide_model)
    l_gloo, p_gloo = train(gloo, steps=10, model_fn=wide_model)
    pg = dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):
        pg = pg._get_backend(torch.device("cpu"))
    out = {"dpkit": l_reg, "gloo": l_gloo, "params_equal": bool(torch.equal(p_reg, p_gloo)),
           "max_param_diff": float((p_reg - p_gloo).abs().max()), "buckets": len(state.buffers),
           "shared_buckets": sum(state.shared.values()), "registered_during": pg._registered_tensors}
    state.release()
    out["registered_after_release"] = pg._registered_tensors
    # 5000 floats inline, 300k on the worker thread: right, and the data
    # survive registration and release
    ranks_sum = w * (w + 1) // 2
    checks = []
    for n in (5000, 300_000):
        t = torch.arange(n, dtype=torch.float32) * (r + 1)
        shared = dpkit.distributed.register_memory(t)
        same = dpkit.distributed.register_memory(t)  # already registered: a no-op
        kept = bool(torch.equal(t, torch.arange(n, dtype=torch.float32) * (r + 1)))
        dist.all_reduce(t)
        right = bool(torch.equal(t, torch.arange(n, dtype=torch.float32) * ranks_sum))
        released = dpkit.distributed.release_memory(t)
        again = dpkit.distributed.release_memory(t)
        after = bool(torch.equal(t, torch.arange(n, dtype=torch.float32) * ranks_sum))
        checks.append([shared, same, kept, right, released, again, after])
    out["checks"] = checks
    try:
        dpkit.distributed.register_memory(torch.zeros(64, 64).t())
        out["noncontiguous"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["noncontiguous"] = f"{type(e).__name__}: {e}"
    try:
        dpkit.distributed.register_memory(torch.zeros(4), group=gloo)
        out["gloo_group"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["gloo_group"] = f"{type(e).__name__}: {e}"
    return out


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
        dist.all_reduce(torch.ones(4), dist.ReduceOp.BAND)  # bitwise ops take integer tensors (as gloo)
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
    timeout = datetime.timedelta(seconds=2 if case in ("timeout", "errors") else 5 if case == "rank_death" else
                                 10 if case == "ops_errors" else 120)
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
