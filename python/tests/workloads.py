"""Workloads beyond DDP over the backend "dpkit", each run on "dpkit" and on
"gloo" in the same processes (same model, data and seeds), so that what
torch builds on top of a process group is checked against torch's own CPU
backend and against a single-process computation:

- fsdp2: FSDP2 (fully_shard over a DeviceMesh of the group) training a small
  transformer for 20 steps (all_gather_single / reduce_scatter_single);
- dcp_save / dcp_load: torch.distributed.checkpoint of an FSDP2 model and its
  AdamW state saved at one world size (3) and loaded at another (2), every
  tensor compared with what was saved (read back from per-rank files, no
  collective involved);
- pipeline: torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B: P2P
  through batch_isend_irecv) and the same pipeline by hand (send/recv), one
  stage per rank, against the whole model in one process;
- moe: a mixture-of-experts token dispatch (all_to_all_single of the counts,
  then of the tokens with uneven and empty splits, and back), against the
  same computation in one process.

Launched like dist_worker.py's env:// cases (test_workloads.py, run_ranks):
`python workloads.py CASE OUTDIR` as N plain processes with torch's env://
variables; each rank writes OUTDIR/CASE-rank<R>.json (written whole, then
renamed). The default group is "dpkit"; the "gloo" group is a new_group of
every rank. gloo runs first: a failure on "dpkit" (recorded with its error
text, not raised) cannot stall the gloo run. Comparisons between the two
backends are made here, in each process, on tensors that never leave it."""
import datetime
import importlib
import json
import os
import pathlib
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import dpkit  # noqa: F401  (registers the backend "dpkit")

BACKENDS = ("gloo", "dpkit")
OUTDIR = None
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("DPKIT_WORKLOADS_TIMEOUT", "30")))


# ---------------------------------------------------------------- helpers

def error_text(e):
    """The error and where in torch it was raised (the last frames)."""
    frames = traceback.extract_tb(e.__traceback__)[-4:]
    where = [f"{pathlib.Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]
    return {"error": (type(e).__name__ + ": " + str(e))[:3000], "where": where}


def run_both(fn, groups):
    """fn(group, backend) for each backend; returns {backend: result} with
    time_s, or error and where when it raised."""
    out = {}
    for b in BACKENDS:
        t0 = time.monotonic()
        try:
            res = fn(groups[b], b)
        except Exception as e:  # noqa: BLE001 - recorded for the backend's author
            res = error_text(e)
        res["time_s"] = round(time.monotonic() - t0, 3)
        out[b] = res
    return out


def max_abs(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) if a.numel() else 0.0


def max_rel(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float(((a - b).abs() / b.abs().clamp_min(1e-30)).max()) if a.numel() else 0.0


def local(t):
    """A DTensor's local shard, a tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def make_groups():
    """The default group ("dpkit") and a "gloo" group of every rank, with the
    same timeout."""
    return {"dpkit": dist.group.WORLD, "gloo": dist.new_group(backend="gloo", timeout=TIMEOUT)}


def mesh_of(group):
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh.from_group(group, "cpu")


# ---------------------------------------------------------------- the transformer

VOCAB, D_MODEL, SEQ, LAYERS = 128, 64, 32, 2


class TinyLM(nn.Module):
    """2 pre-norm encoder layers with a causal mask: a small GPT."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(D_MODEL, 4, 2 * D_MODEL, dropout=0.0,
                                                                batch_first=True, norm_first=True)
                                     for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, x):
        h = self.tok(x) + self.pos[: x.shape[1]]
        for layer in self.layers:
            h = layer(h, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def lm_batch(g, batch=4):
    x = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def lm_loss(model, inp, tgt):
    return F.cross_entropy(model(inp).reshape(-1, VOCAB), tgt.reshape(-1))


def sharded_lm(group, seed=0):
    from torch.distributed.fsdp import fully_shard
    mesh = mesh_of(group)
    torch.manual_seed(seed)
    model = TinyLM()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# ---------------------------------------------------------------- fsdp2

FSDP_STEPS = 20


def fsdp_reference(w, steps=FSDP_STEPS):
    """One process, no FSDP: the mean of the ranks' losses (each rank's
    batch through the model separately), AdamW on the full model."""
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gens = [torch.Generator().manual_seed(100 + p) for p in range(w)]
    losses = []
    for _ in range(steps):
        ls = [lm_loss(model, *lm_batch(gens[p])) for p in range(w)]
        loss = sum(ls) / w
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append([v.item() for v in ls])
    return losses


def reduce_order_probe(group, n=4096):
    """Which summation order each backend's reduce_scatter_single uses for
    this rank's chunk (FSDP2's gradient reduction: AVG for float32): the
    forms (a left fold of the ranks' chunks in some order, then the
    division) that its output equals bit for bit. Two backends that sum
    in different orders give FSDP2 losses that differ in the last bits."""
    import itertools
    r, w = dist.get_rank(), dist.get_world_size()
    xs = [torch.randn(w * n, generator=torch.Generator().manual_seed(2000 + p)) for p in range(w)]
    out = {}
    for name, op in (("avg", dist.ReduceOp.AVG), ("sum", dist.ReduceOp.SUM)):
        y = torch.empty(n)
        try:
            rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # torch < 2.15
            rs(y, xs[r].clone(), op=op, group=group)
        except Exception as e:  # noqa: BLE001
            out[name] = error_text(e)
            continue
        chunks = [x[r * n:(r + 1) * n] for x in xs]
        forms = []
        for perm in itertools.permutations(range(w)):
            acc = chunks[perm[0]].clone()
            for p in perm[1:]:
                acc += chunks[p]
            divs = {"": acc} if name == "sum" else {"/w": acc / w, "*(1/w)": acc * (1.0 / w)}
            for dname, v in divs.items():
                if torch.equal(y, v):
                    forms.append("+".join(map(str, perm)) + dname)
            if name == "avg":
                pre = chunks[perm[0]] / w
                for p in perm[1:]:
                    pre = pre + chunks[p] / w
                if torch.equal(y, pre):
                    forms.append("+".join(f"{p}/w" for p in perm))
        out[name] = forms
    return out


def case_fsdp2():
    r, w = dist.get_rank(), dist.get_world_size()
    groups = make_groups()
    params = {}

    def train(group, b):
        model = sharded_lm(group)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(100 + r)
        local_losses, mean_losses = [], []
        t0 = time.monotonic()
        for step in range(FSDP_STEPS):
            if step == FSDP_STEPS // 2:
                t_half = time.monotonic()
            loss = lm_loss(model, *lm_batch(g))
            opt.zero_grad()
            loss.backward()
            opt.step()
            t = loss.detach().clone()
            dist.all_reduce(t, group=group)
            local_losses.append(loss.item())
            mean_losses.append(t.item() / w)
        train_s, steady_s = time.monotonic() - t0, time.monotonic() - t_half  # the second half: warmed up
        params[b] = torch.cat([local(p).detach().reshape(-1) for p in model.parameters()])
        full = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
        return {"local_losses": local_losses, "mean_losses": mean_losses, "train_s": round(train_s, 3),
                "steady_s": round(steady_s, 3),
                "full_params_sum": float(full.double().sum())}

    res = run_both(train, groups)
    probe = run_both(lambda group, b: reduce_order_probe(group), groups)
    ref = fsdp_reference(w)
    ref_local = [step[r] for step in ref]
    ref_mean = [sum(step) / w for step in ref]
    out = {"backends": res, "reference_local_losses": ref_local, "reference_mean_losses": ref_mean,
           "reduce_order": probe}
    for b in BACKENDS:
        if "error" not in res[b]:
            res[b]["max_abs_diff_vs_reference"] = max_abs(res[b]["local_losses"], ref_local)
            res[b]["max_rel_diff_vs_reference"] = max_rel(res[b]["local_losses"], ref_local)
    if all("error" not in res[b] for b in BACKENDS):
        d, g = res["dpkit"], res["gloo"]
        out["compare"] = {
            "local_losses_equal": d["local_losses"] == g["local_losses"],
            "mean_losses_equal": d["mean_losses"] == g["mean_losses"],
            "max_abs_diff_local_losses": max_abs(d["local_losses"], g["local_losses"]),
            "max_abs_diff_mean_losses": max_abs(d["mean_losses"], g["mean_losses"]),
            "params_equal": bool(torch.equal(params["dpkit"], params["gloo"])),
            "max_abs_diff_params": max_abs(params["dpkit"], params["gloo"]),
        }
    return out


# ---------------------------------------------------------------- dcp

DCP_SAVE_STEPS = 3


def flatten(obj, prefix=""):
    """{path: value} of a nested state dict."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}/"))
        return out
    if isinstance(obj, (list, tuple)) and any(isinstance(v, (dict, list, tuple, torch.Tensor)) for v in obj):
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}{i}/"))
        return out
    return {prefix.rstrip("/"): obj}


def dcp_model(group, b, seed):
    """An FSDP2 model over the group and its AdamW, or a plain replicated
    one if fully_shard fails on this backend (recorded)."""
    try:
        return sharded_lm(group, seed), "fsdp2", None
    except Exception as e:  # noqa: BLE001
        torch.manual_seed(seed)
        return TinyLM(), "replicated", error_text(e)


def case_dcp_save():
    """At this world size (3): train DCP_SAVE_STEPS steps, save model and
    optimizer state with DCP into OUTDIR/dcp-<backend>; each rank also
    writes its local shards (torch.save) for dcp_load to compare with."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    r, w = dist.get_rank(), dist.get_world_size()
    groups = make_groups()

    def save(group, b):
        model, mode, ferr = dcp_model(group, b, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(100 + r)
        for _ in range(DCP_SAVE_STEPS):
            loss = lm_loss(model, *lm_batch(g))
            opt.zero_grad()
            loss.backward()
            if mode == "replicated":  # DDP's averaging by hand
                for p in model.parameters():
                    dist.all_reduce(p.grad, group=group)
                    p.grad /= w
            opt.step()
        eval_loss = lm_loss(model, *lm_batch(torch.Generator().manual_seed(999))).item()
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        ckpt = OUTDIR / f"dcp-{b}"
        t0 = time.monotonic()
        dcp.save(sd, checkpoint_id=str(ckpt), process_group=group)
        save_s = time.monotonic() - t0
        flat = flatten(sd)
        mine = {k: {"dtensor": hasattr(v, "to_local"),
                    "value": local(v).detach().clone() if isinstance(v, torch.Tensor) else v}
                for k, v in flat.items()}
        torch.save({"mode": mode, "world": w, "eval_loss": eval_loss, "state": mine},
                   OUTDIR / f"dcp-{b}-saved-rank{r}.pt")
        res = {"mode": mode, "save_s": round(save_s, 3), "entries": len(flat), "eval_loss": eval_loss,
               "tensors": sum(isinstance(v, torch.Tensor) for v in flat.values())}
        if ferr:
            res["fsdp2_error"] = ferr
        return res

    return {"backends": run_both(save, groups)}


def check(flat, ref):
    """A loaded state dict (flattened) against the saving ranks' entries:
    a DTensor's local shard against the torch.chunk of the saved full
    tensor (the saving ranks' shards concatenated: no collective) and its
    full_tensor() (an all-gather over its group) against that full tensor;
    other tensors and values equal."""
    r, w = dist.get_rank(), dist.get_world_size()
    bad, compared, max_diff = [], 0, 0.0
    for k, v in flat.items():
        if k not in ref[0]:
            bad.append(f"{k}: not saved")
            continue
        e = ref[0][k]
        if e["dtensor"]:
            full = torch.cat([s[k]["value"] for s in ref], dim=0)
            chunks = torch.chunk(full, w, dim=0)
            want = chunks[r] if r < len(chunks) else full[:0]
            for what, got, exp in (("local", local(v), want), ("full", v.full_tensor(), full)):
                compared += 1
                if got.shape != exp.shape or not torch.equal(got, exp):
                    bad.append(f"{k} ({what}): shape {tuple(got.shape)} vs {tuple(exp.shape)}")
                    if got.shape == exp.shape:
                        max_diff = max(max_diff, max_abs(got, exp))
        elif isinstance(v, torch.Tensor):
            compared += 1
            if not torch.equal(v, e["value"]):
                bad.append(k)
        else:
            compared += 1
            if v != e["value"]:
                bad.append(f"{k}: {v!r} vs {e['value']!r}")
    return {"keys_equal": set(flat) == set(ref[0]), "compared": compared, "mismatches": bad[:20],
            "n_mismatches": len(bad), "max_abs_diff": max_diff}


def case_dcp_load():
    """At this world size (2): a fresh model (another seed) and optimizer,
    dcp.load from OUTDIR/dcp-<backend>, set_state_dict; then every entry of
    the state dict against what the saving ranks wrote: local shards against
    the torch.chunk of the saved full tensor (no collective), full tensors
    (full_tensor: an all-gather over the group) against the saved full
    tensor, scalars and hyper-parameters equal; and the eval loss equal."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    r, w = dist.get_rank(), dist.get_world_size()
    groups = make_groups()

    def load(group, b):
        files = sorted(OUTDIR.glob(f"dcp-{b}-saved-rank*.pt"), key=lambda p: int(p.stem.rsplit("rank", 1)[1]))
        saved = [torch.load(f, weights_only=False) for f in files]
        if not saved:
            raise FileNotFoundError(f"nothing saved for {b} in {OUTDIR}")
        mode = saved[0]["mode"]
        if mode == "fsdp2":
            model = sharded_lm(group, seed=123)
        else:
            torch.manual_seed(123)
            model = TinyLM()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        ref = [s["state"] for s in saved]
        before = check(flatten(sd), ref)  # the control: a fresh model differs from what was saved
        t0 = time.monotonic()
        dcp.load(sd, checkpoint_id=str(OUTDIR / f"dcp-{b}"), process_group=group)
        load_s = time.monotonic() - t0
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        msd2, osd2 = get_state_dict(model, opt)
        after = check(flatten({"model": msd2, "optim": osd2}), ref)
        eval_loss = lm_loss(model, *lm_batch(torch.Generator().manual_seed(999))).item()
        return {"mode": mode, "saved_world": saved[0]["world"], "load_s": round(load_s, 3), **after,
                "mismatches_before_load": before["n_mismatches"], "eval_loss": eval_loss,
                "saved_eval_loss": saved[0]["eval_loss"], "eval_loss_equal": eval_loss == saved[0]["eval_loss"]}

    return {"backends": run_both(load, groups)}


# ---------------------------------------------------------------- pipeline

PIPE_STEPS, PIPE_MICRO, PIPE_BATCH, PIPE_IN, PIPE_OUT = 10, 4, 16, 16, 8


def pipe_model(n_stages):
    """2 Linear+Tanh blocks per stage, the last stage ends in Linear(32, 8)."""
    torch.manual_seed(0)
    stages = []
    for s in range(n_stages):
        layers = [nn.Linear(PIPE_IN if s == 0 else 32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh()]
        if s == n_stages - 1:
            layers.append(nn.Linear(32, PIPE_OUT))
        stages.append(nn.Sequential(*layers))
    return stages


def pipe_data():
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(PIPE_BATCH, PIPE_IN, generator=g), torch.randn(PIPE_BATCH, PIPE_OUT, generator=g))
            for _ in range(PIPE_STEPS)]


def pipe_loss(out, target):
    return F.mse_loss(out, target)


def pipe_reference(n_stages):
    """One process, the whole model, the same micro-batches: each
    micro-batch's loss backward in order, gradients divided by their count
    (the schedules' scale_grads), SGD."""
    stages = pipe_model(n_stages)
    full = nn.Sequential(*stages)
    opt = torch.optim.SGD(full.parameters(), lr=0.1)
    losses = []
    for x, y in pipe_data():
        opt.zero_grad()
        step = []
        for xm, ym in zip(x.tensor_split(PIPE_MICRO), y.tensor_split(PIPE_MICRO)):
            loss = pipe_loss(full(xm), ym)
            loss.backward()
            step.append(loss.item())
        for p in full.parameters():
            p.grad.div_(PIPE_MICRO)
        opt.step()
        losses.append(step)
    return losses, [torch.cat([p.detach().reshape(-1) for p in s.parameters()]) for s in stages]


def pipe_by_hand(group, r, w):
    """GPipe by hand: all forwards (recv the activation from r-1, send to
    r+1), then all backwards in the same order (recv the gradient from r+1,
    send the input's gradient to r-1)."""
    mod = pipe_model(w)[r]
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    get_global_rank = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank  # torch 1.13
    grank = lambda p: get_global_rank(group, p)  # noqa: E731
    losses = []
    for x, y in pipe_data():
        opt.zero_grad()
        ins, outs, step = [], [], []
        for m, (xm, ym) in enumerate(zip(x.tensor_split(PIPE_MICRO), y.tensor_split(PIPE_MICRO))):
            if r == 0:
                a = xm
            else:
                a = torch.empty(xm.shape[0], 32)
                dist.recv(a, grank(r - 1), group=group, tag=m)
                a.requires_grad_()
            o = mod(a)
            if r == w - 1:
                o = pipe_loss(o, ym)
                step.append(o.item())
            else:
                dist.send(o.detach(), grank(r + 1), group=group, tag=m)
            ins.append(a)
            outs.append(o)
        for m in range(PIPE_MICRO):
            if r == w - 1:
                outs[m].backward()
            else:
                gr = torch.empty_like(outs[m])
                dist.recv(gr, grank(r + 1), group=group, tag=100 + m)
                outs[m].backward(gr)
            if r > 0:
                dist.send(ins[m].grad, grank(r - 1), group=group, tag=100 + m)
        for p in mod.parameters():
            p.grad.div_(PIPE_MICRO)
        opt.step()
        losses.append(step)
    return losses, torch.cat([p.detach().reshape(-1) for p in mod.parameters()])


def pipe_schedule(group, r, w, schedule):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    mod = pipe_model(w)[r]
    stage = PipelineStage(mod, r, w, torch.device("cpu"), group=group)
    sched = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule](stage, n_microbatches=PIPE_MICRO,
                                                                        loss_fn=pipe_loss)
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    losses = []
    for x, y in pipe_data():
        opt.zero_grad()
        step = []
        if r == 0:
            sched.step(x)
        elif r == w - 1:
            sched.step(target=y, losses=step)
        else:
            sched.step()
        opt.step()
        losses.append([float(v.detach()) for v in step])
    return losses, torch.cat([p.detach().reshape(-1) for p in mod.parameters()])


def case_pipeline():
    """One stage per rank (w stages at w ranks). Losses are the last rank's."""
    r, w = dist.get_rank(), dist.get_world_size()
    groups = make_groups()
    ref_losses, ref_params = pipe_reference(w)
    out = {"reference_losses": ref_losses if r == w - 1 else None}
    try:
        importlib.import_module("torch.distributed.pipelining")  # torch >= 2.4
        names = ("by_hand", "gpipe", "1f1b")
    except ImportError as e:
        names = ("by_hand",)
        out["pipelining_missing"] = str(e)
    for name in names:
        params = {}

        def run(group, b):
            if name == "by_hand":
                losses, params[b] = pipe_by_hand(group, r, w)
            else:
                losses, params[b] = pipe_schedule(group, r, w, name)
            res = {"params_equal_reference": bool(torch.equal(params[b], ref_params[r])),
                   "max_abs_diff_params_vs_reference": max_abs(params[b], ref_params[r])}
            if r == w - 1:
                res.update(losses=losses, losses_equal_reference=losses == ref_losses,
                           max_abs_diff_vs_reference=max_abs(losses, ref_losses),
                           max_rel_diff_vs_reference=max_rel(losses, ref_losses))
            return res

        res = run_both(run, groups)
        if all(b in params for b in BACKENDS):
            res["params_equal_across_backends"] = bool(torch.equal(params["dpkit"], params["gloo"]))
        out[name] = res
    return out


# ---------------------------------------------------------------- moe

MOE_D, MOE_HIDDEN = 16, 32
MOE_ROUNDS = ("natural", "skip_next_expert", "all_to_expert0", "large")


def moe_tokens(p, rnd):
    n = 2000 + 377 * p if rnd == "large" else 8 + 5 * p  # uneven across ranks
    return torch.randn(n, MOE_D, generator=torch.Generator().manual_seed(500 + 10 * p + MOE_ROUNDS.index(rnd)))


def moe_modules(w):
    torch.manual_seed(1)
    router = nn.Linear(MOE_D, w)
    experts = []
    for e in range(w):
        torch.manual_seed(1000 + e)
        experts.append(nn.Sequential(nn.Linear(MOE_D, MOE_HIDDEN), nn.GELU(), nn.Linear(MOE_HIDDEN, MOE_D)))
    return router, experts


def moe_route(router, x, rnd, p, w):
    """Top-1 routing of rank p's tokens: (expert of each token, its gate);
    in round skip_next_expert rank p sends nothing to expert p+1 (mod w)."""
    logits = router(x)
    if rnd == "skip_next_expert" and w > 1:
        logits[:, (p + 1) % w] = float("-inf")
    if rnd == "all_to_expert0":
        logits[:, 0] = float("inf")
        logits = logits.nan_to_num(posinf=1e4)
    gate, idx = logits.softmax(-1).max(-1)
    return idx, gate


def moe_reference(router, experts, rnd, r, w):
    """Every rank's tokens here: expert e sees the batch it sees in the
    dispatch (the tokens routed to it, source rank by source rank, each in
    its order); rank r's outputs picked back out. Exact by construction;
    also the naive per-rank computation (expert on r's own tokens only)."""
    per_rank = []
    for p in range(w):
        x = moe_tokens(p, rnd)
        idx, gate = moe_route(router, x, rnd, p, w)
        per_rank.append((x, idx, gate))
    outs = {}
    for e in range(w):
        batch = torch.cat([x[idx == e] for x, idx, _ in per_rank])
        y = experts[e](batch) if batch.shape[0] else batch
        off = 0
        for p, (x, idx, _) in enumerate(per_rank):
            k = int((idx == e).sum())
            outs[(p, e)] = y[off: off + k]
            off += k
    x, idx, gate = per_rank[r]
    exact = torch.empty_like(x)
    naive = torch.empty_like(x)
    for e in range(w):
        exact[idx == e] = outs[(r, e)]
        if (idx == e).any():
            naive[idx == e] = experts[e](x[idx == e])
    return exact * gate[:, None], naive * gate[:, None]


def moe_dispatch(group, router, experts, rnd, r, w):
    x = moe_tokens(r, rnd)
    idx, gate = moe_route(router, x, rnd, r, w)
    order = torch.argsort(idx, stable=True)
    xs = x[order]
    send = torch.bincount(idx, minlength=w)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    got = x.new_empty(int(recv.sum()), MOE_D)
    dist.all_to_all_single(got, xs, recv.tolist(), send.tolist(), group=group)
    y = experts[r](got) if got.shape[0] else got
    back = torch.empty_like(xs)
    dist.all_to_all_single(back, y.contiguous(), send.tolist(), recv.tolist(), group=group)
    out = torch.empty_like(x)
    out[order] = back
    return out * gate[:, None], send.tolist(), recv.tolist()


def case_moe():
    r, w = dist.get_rank(), dist.get_world_size()
    groups = make_groups()
    router, experts = moe_modules(w)
    out = {}
    with torch.no_grad():
        for rnd in MOE_ROUNDS:
            exact, naive = moe_reference(router, experts, rnd, r, w)
            ys = {}

            def run(group, b):
                t0 = time.monotonic()
                ys[b], send, recv = moe_dispatch(group, router, experts, rnd, r, w)
                return {"dispatch_s": round(time.monotonic() - t0, 4), "send_counts": send, "recv_counts": recv,
                        "equal_reference": bool(torch.equal(ys[b], exact)),
                        "max_abs_diff_vs_reference": max_abs(ys[b], exact),
                        "max_abs_diff_vs_naive": max_abs(ys[b], naive)}

            res = run_both(run, groups)
            if all(b in ys for b in BACKENDS):
                res["equal_across_backends"] = bool(torch.equal(ys["dpkit"], ys["gloo"]))
            out[rnd] = res
    return out


# ---------------------------------------------------------------- main

def main():
    global OUTDIR
    case, OUTDIR = sys.argv[1], pathlib.Path(sys.argv[2])
    dist.init_process_group("dpkit", timeout=TIMEOUT)
    r = dist.get_rank()
    torch.set_num_threads(1)
    t0 = time.monotonic()
    result = globals()["case_" + case]()
    result.update(rank=r, world=dist.get_world_size(), case=case, torch=torch.__version__,
                  time_s=round(time.monotonic() - t0, 3))
    tmp = OUTDIR / f"{case}-rank{r}.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, OUTDIR / f"{case}-rank{r}.json")


if __name__ == "__main__":
    main()
