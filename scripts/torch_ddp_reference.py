#!/usr/bin/python3
"""Reference check and benchmark of dpkit's DistributedDataParallel for libtorch
against PyTorch's own DDP (python3-torch, gloo backend).

Subcommands:

  train  --data DIR     PyTorch DDP (gloo, --world processes) trains the model of
                        examples/torch_lm_model.hpp from DIR/init.bin on
                        DIR/batches.rank<R>.bin; writes per-step losses
                        (--loss-log) and a timing summary (--json).
  check                 runs `mpirun -np 2 torch_lm --dump DIR --loss-log` on the
                        real corpus, then `train` on the dumped weights and
                        batches, and compares the two loss curves step by step
                        (exit 1 if the relative difference exceeds --tol).
  resume                trains --steps uninterrupted, then --resume-at steps with a
                        checkpoint and --resume to --steps: the losses after the
                        resume must equal the uninterrupted run's exactly; a
                        truncated checkpoint must be refused with an error.
  bench                 one run, the same model and batches, four rows: dpkit DDP
                        (2 ranks), the official libtorch example's per-parameter
                        MPI_Allreduce (2 ranks), PyTorch DDP with gloo (2
                        processes), one rank alone. Prints step time, tokens/s,
                        scaling efficiency and exposed communication.

Run with Debian's /usr/bin/python3 (python3-torch). Example:
  /usr/bin/python3 scripts/torch_ddp_reference.py check --torch-lm build/examples/torch_lm --steps 50
"""
import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


# ---- the model: identical to examples/torch_lm_model.hpp ----
class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.heads = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        hd = C // self.heads
        qkv = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)
        h1 = x + self.proj(y)
        return h1 + self.fc2(F.gelu(self.fc1(self.ln2(h1))))


class LM(nn.Module):
    def __init__(self, vocab, d, heads, layers, max_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, dtype=torch.long))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.lnf(x))


def lm_loss(model, rows):
    r = rows.long()
    L = r.shape[1]
    inputs = r[:, : L - 1].clamp_min(0)
    targets = r[:, 1:].masked_fill(r[:, 1:] < 0, -100)
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[2]), targets.reshape(-1), ignore_index=-100)


# ---- the files torch_lm writes (formats in examples/torch_lm_model.hpp) ----
def read_weights(path):
    out = {}
    with open(path, "rb") as f:
        if f.read(8) != b"DPKW0001":
            raise ValueError(f"{path}: bad magic")
        (n,) = struct.unpack("<Q", f.read(8))
        for _ in range(n):
            (ln,) = struct.unpack("<Q", f.read(8))
            name = f.read(ln).decode()
            (nd,) = struct.unpack("<Q", f.read(8))
            dims = struct.unpack(f"<{nd}q", f.read(8 * nd))
            numel = math.prod(dims)
            data = f.read(4 * numel)
            if len(data) != 4 * numel:
                raise ValueError(f"{path}: truncated at {name}")
            out[name] = torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(dims).clone()
    return out


def read_batches(path):
    out = []
    with open(path, "rb") as f:
        if f.read(8) != b"DPKB0001":
            raise ValueError(f"{path}: bad magic")
        (steps,) = struct.unpack("<Q", f.read(8))
        for s in range(steps):
            b, l = struct.unpack("<QQ", f.read(16))
            data = f.read(4 * b * l)
            if len(data) != 4 * b * l:
                raise ValueError(f"{path}: truncated at step {s}")
            out.append(torch.frombuffer(bytearray(data), dtype=torch.int32).reshape(b, l).clone())
    return out


# ---- PyTorch DDP training (one process per rank) ----
def threads_per_rank(world):
    """Intra-op threads for each of `world` processes sharing this process's CPUs."""
    return max(1, len(os.sched_getaffinity(0)) // world)


def _worker(rank, a, port, result_q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # the CPUs this process may run on, shared by the world's processes (all
    # unbound on one node): what dpkit::size_torch_threads gives torch_lm
    torch.set_num_threads(threads_per_rank(world=a.world))
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    world = a.world
    w = read_weights(os.path.join(a.data, "init.bin"))
    vocab, d = w["tok.weight"].shape
    max_len = w["pos.weight"].shape[0]
    layers = len({k.split(".")[1] for k in w if k.startswith("blocks.")})
    model = LM(vocab, d, a.heads, layers, max_len)
    missing = set(dict(model.named_parameters())) ^ set(w)
    if missing:
        raise ValueError(f"init.bin and the Python model differ in {sorted(missing)}")
    model.load_state_dict(w, strict=True)
    batches = read_batches(os.path.join(a.data, f"batches.rank{rank}.bin"))
    steps = min(a.steps, len(batches))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb,
                                              gradient_as_bucket_view=a.bucket_view)
    # Exposed communication: from the last gradient accumulator post hook
    # (after DDP's own hook on it) until backward() returns, which DDP's
    # reducer delays until every bucket is reduced and copied back. And from
    # the end of the backward graph task, where DDP's reducer records
    # kBackwardComputeEnd: a final callback queued at the first hook runs
    # just before the one DDP queues at its last (callbacks run in order).
    last_hook = [0.0]
    compute_end = [0.0]
    queued = [False]

    def stamp_compute_end():
        compute_end[0] = time.perf_counter()

    def on_accumulated(*unused):
        last_hook[0] = time.perf_counter()
        if not queued[0]:
            queued[0] = True
            torch.autograd.Variable._execution_engine.queue_callback(stamp_compute_end)

    accs = []
    for p in model.parameters():
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(on_accumulated)
        accs.append(acc)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, foreach=False)
    losses, times, exposed, exposed_last, exposed_compute, skew, tokens = [], [], [], [], [], [], []
    for step in range(steps):
        rows = batches[step]
        ntok = float((rows[:, 1:] >= 0).sum().item())
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = lm_loss(ddp, rows)
        queued[0] = False
        loss.backward()
        t_back = time.perf_counter()
        ex = t_back - last_hook[0]
        finite = True
        if a.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            finite = bool(torch.isfinite(norm))
        if finite:
            opt.step()
        dt = time.perf_counter() - t0
        # perf_counter is CLOCK_MONOTONIC on Linux, the clock of torch_lm's
        # steady_clock too: comparable across the node's processes
        m = torch.tensor([loss.item(), ntok, dt, ex, last_hook[0], t_back, compute_end[0]], dtype=torch.float64)
        gathered = [torch.zeros(7, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(gathered, m)
        gl = 0.0
        for g in gathered:
            gl += g[0].item() / world
        losses.append(gl)
        tokens.append(sum(g[1].item() for g in gathered))
        times.append(max(g[2].item() for g in gathered))
        exposed.append(max(g[3].item() for g in gathered))
        ends = [g[4].item() for g in gathered]
        back_max = max(g[5].item() for g in gathered)
        exposed_last.append(back_max - max(ends))
        exposed_compute.append(back_max - max(g[6].item() for g in gathered))
        skew.append(max(ends) - min(ends))
        if rank == 0 and a.log_every > 0 and step % a.log_every == 0:
            print(f"pytorch-ddp step {step} loss {gl:.4f} step {1e3 * times[-1]:.1f} ms exposed_comm {1e3 * exposed[-1]:.2f} ms",
                  flush=True)
    if rank == 0:
        result_q.put({"losses": losses, "times": times, "exposed": exposed, "exposed_last": exposed_last,
                      "exposed_compute_last": exposed_compute, "skew": skew, "tokens": tokens})
    dist.barrier()
    dist.destroy_process_group()


def train(a):
    """PyTorch DDP on a.world processes; returns rank 0's result dict."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + (os.getpid() % 2000)
    procs = [ctx.Process(target=_worker, args=(r, a, port, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    res = None
    deadline = time.time() + a.timeout
    while res is None:
        try:
            res = q.get(timeout=5)
        except Exception:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            if time.time() > deadline:
                break
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    if res is None or any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"PyTorch DDP workers failed (exit codes {[p.exitcode for p in procs]})")
    return res


def summarize(res, warmup):
    """Means over the steps after warm-up (all steps if there are no others)."""
    w = warmup if len(res["times"]) > warmup else 0
    t, k = res["times"][w:], res["tokens"][w:]
    mean = lambda key: sum(res[key][w:]) / len(t)
    return {"step_s": sum(t) / len(t), "tokens_per_s": sum(k) / sum(t), "exposed_s": mean("exposed"),
            "exposed_last_s": mean("exposed_last"), "exposed_compute_last_s": mean("exposed_compute_last"),
            "skew_s": mean("skew")}


def cmd_train(a):
    res = train(a)
    if a.loss_log:
        with open(a.loss_log, "w") as f:
            for s, l in enumerate(res["losses"]):
                f.write(f"{s} {l:.9g}\n")
    s = summarize(res, a.warmup)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(s, losses=res["losses"]), f)
    print(f"pytorch-ddp summary: step_ms={1e3 * s['step_s']:.2f} tokens_per_s={s['tokens_per_s']:.0f} "
          f"exposed_comm_ms={1e3 * s['exposed_s']:.3f}")
    return res


def mpi_env():
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader",
                "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    return env


def run_torch_lm(a, extra, np=2, bind_to_none=False):
    # bind_to_none: the benchmark runs every row unbound, as PyTorch's spawned
    # workers are, so that the rows differ in their communication only. The
    # checks run mpirun's default, the command a user types.
    cmd = ([a.mpirun, "-np", str(np)] + (["--bind-to", "none"] if bind_to_none else []) if np else []) + [
        a.torch_lm, "--corpus", a.corpus, "--spm", a.spm, "--seed", str(a.seed), "--lr", str(a.lr),
        "--clip", str(a.clip), "--bucket-cap-mb", str(a.bucket_cap_mb), "--heads", str(a.heads)] + extra
    if a.bucket_view:
        cmd.append("--bucket-view")
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=mpi_env(), timeout=a.timeout)


def read_losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            s, l = line.split()
            out[int(s)] = float(l)
    return [out[k] for k in sorted(out)]


def cmd_check(a):
    work = a.workdir or tempfile.mkdtemp(prefix="dpkit_torch_ref_")
    dpkit_log = os.path.join(work, "dpkit_losses.txt")
    run_torch_lm(a, ["--steps", str(a.steps), "--dump", work, "--loss-log", dpkit_log, "--log-every", "10"])
    a.data = work
    a.world = 2
    res = train(a)
    ours = read_losses(dpkit_log)
    theirs = res["losses"]
    if len(ours) != len(theirs) or len(ours) != a.steps:
        print(f"FAIL: {len(ours)} dpkit steps, {len(theirs)} PyTorch DDP steps, {a.steps} expected")
        return 1
    worst, worst_step = 0.0, 0
    for s, (x, y) in enumerate(zip(ours, theirs)):
        rel = abs(x - y) / max(abs(y), 1e-12)
        if not (rel <= worst):
            worst, worst_step = rel, s
    for s in sorted({0, len(ours) // 2, len(ours) - 1}):
        print(f"step {s}: dpkit {ours[s]:.7f}  pytorch-ddp {theirs[s]:.7f}")
    ok = worst <= a.tol
    print(f"{'PASS' if ok else 'FAIL'}: max relative loss difference over {a.steps} steps on 2 ranks "
          f"{worst:.3e} (step {worst_step}), tolerance {a.tol:g}")
    return 0 if ok else 1


def cmd_resume(a):
    work = a.workdir or tempfile.mkdtemp(prefix="dpkit_torch_resume_")
    os.makedirs(work, exist_ok=True)
    full, part, ckpt = (os.path.join(work, n) for n in ("full_losses.txt", "resumed_losses.txt", "ckpt.pt"))
    for f in (full, part, ckpt):
        if os.path.exists(f):
            os.remove(f)
    run_torch_lm(a, ["--steps", str(a.steps), "--loss-log", full, "--log-every", "0"])
    run_torch_lm(a, ["--steps", str(a.resume_at), "--loss-log", part, "--checkpoint", ckpt, "--log-every", "0"])
    run_torch_lm(a, ["--steps", str(a.steps), "--loss-log", part, "--resume", ckpt, "--log-every", "0"])
    with open(full) as f:
        x = f.read().split("\n")
    with open(part) as f:
        y = f.read().split("\n")
    ok = x == y and len([l for l in x if l]) == a.steps
    for l in y:
        if l:
            print("resumed run:", l, "" if l in x else "  <- differs from the uninterrupted run")
    leftovers = [n for n in os.listdir(work) if ".tmp." in n]
    if leftovers:
        print(f"FAIL: temporary checkpoint files left behind: {leftovers}")
        ok = False
    # A damaged checkpoint is refused with an error, not a crash or a silent restart.
    bad = os.path.join(work, "truncated.pt")
    with open(ckpt, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    cmd = [a.mpirun, "-np", "2", a.torch_lm, "--corpus", a.corpus, "--spm", a.spm,
           "--steps", str(a.steps), "--resume", bad, "--log-every", "0"]
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=a.timeout)
    refused = p.returncode != 0 and "not a readable torch_lm checkpoint" in p.stderr
    print(f"truncated checkpoint: exit {p.returncode}, {'refused with a clear error' if refused else 'NOT refused'}")
    ok = ok and refused
    print(f"{'PASS' if ok else 'FAIL'}: losses of steps {a.resume_at}..{a.steps - 1} after --resume at step "
          f"{a.resume_at} {'equal' if x == y else 'differ from'} the uninterrupted run's (2 ranks)")
    return 0 if ok else 1


def cmd_bench(a):
    work = a.workdir or tempfile.mkdtemp(prefix="dpkit_torch_bench_")
    # 1. batches and initial weights, from the corpus (one dpkit run).
    run_torch_lm(a, ["--steps", str(a.steps), "--dump", work, "--log-every", "0"], bind_to_none=True)
    gloo, pp = "PyTorch DDP, gloo (2 processes)", "per-parameter MPI_Allreduce (2 ranks)"
    order = ["dpkit DDP (2 ranks)", "dpkit DDP, no comm thread (2 ranks)", gloo, pp, "one rank alone"]
    extras = {order[0]: (["--ddp", "dpkit", "--algorithm", a.algorithm], 2),
              order[1]: (["--ddp", "dpkit", "--algorithm", a.algorithm, "--no-comm-thread"], 2),
              pp: (["--ddp", "per-param"], 2),
              # alone, with the threads each of the two ranks has: the per-rank compute
              "one rank alone": (["--ddp", "none", "--as-rank", "0", "--threads", str(threads_per_rank(2))], 0)}
    rows = {}
    for rep in range(a.repeat):
        # each round runs every approach once; the order rotates from round to
        # round so that no approach always runs first or after the same one
        for name in order[rep % len(order):] + order[:rep % len(order)]:
            if name == gloo:
                a.data = work
                a.world = 2
                res = train(a)
                rows.setdefault(name, []).append(dict(summarize(res, a.warmup), last_bucket_s=float("nan")))
                continue
            extra, np = extras[name]
            j = os.path.join(work, f"row{order.index(name)}_{rep}.json")
            run_torch_lm(a, extra + ["--steps", str(a.steps), "--batches", work, "--json", j, "--warmup",
                                     str(a.warmup), "--log-every", "0"], np, bind_to_none=True)
            with open(j) as f:
                rows.setdefault(name, []).append(json.load(f))
    print(f"dpkit DDP rows use --algorithm {a.algorithm}", flush=True)
    with open(os.path.join(work, "rounds.json"), "w") as f:  # every round of every row, for a later look
        json.dump(rows, f)
    fields = ("step_s", "tokens_per_s", "exposed_s", "exposed_last_s", "exposed_compute_last_s", "skew_s",
              "last_bucket_s")
    med = {k: {f: statistics.median(r.get(f, float("nan")) for r in v) for f in fields} for k, v in rows.items()}
    single = med["one rank alone"]["tokens_per_s"]
    print(f"\nmodel from {work}/init.bin, {a.steps} steps ({a.warmup} warm-up steps not timed), bucket_cap_mb "
          f"{a.bucket_cap_mb}, gradient_as_bucket_view {a.bucket_view}, median of {a.repeat} round(s) (each round runs "
          f"every approach once, the order rotating from round to round)")
    print("exposed: from the end of a rank's backward (its last gradient hook) to its gradients in place, the largest "
          "over ranks (includes waiting for the slowest rank's backward); after last: from the last gradient hook of "
          "the last rank's backward to the last rank's gradients in place (the node's shared clock); after end: the "
          "same from the end of the last rank's backward graph task, where PyTorch DDP's reducer records "
          "kBackwardComputeEnd (its logging's non-overlapped communication); skew: last minus first backward end; "
          "last bucket: the last bucket's all-reduce on the rank whose backward ended last (on the other it includes "
          "the skew)")
    print(f"{'approach':40} {'step ms':>9} {'tokens/s':>9} {'scaling':>8} {'exposed ms':>11} {'after last ms':>14} "
          f"{'after end ms':>13} {'skew ms':>8} {'last bucket ms':>15}")
    for k in order:
        m = med[k]
        eff = m["tokens_per_s"] / (2 * single) if k != "one rank alone" else 1.0
        lb = "" if math.isnan(m["last_bucket_s"]) or not k.startswith("dpkit") else f"{1e3 * m['last_bucket_s']:.2f}"
        print(f"{k:40} {1e3 * m['step_s']:9.1f} {m['tokens_per_s']:9.0f} {eff:8.2f} {1e3 * m['exposed_s']:11.2f} "
              f"{1e3 * m['exposed_last_s']:14.2f} {1e3 * m['exposed_compute_last_s']:13.2f} {1e3 * m['skew_s']:8.2f} "
              f"{lb:>15}")
    p, q = med[gloo], med[pp]
    for k in order[:2]:
        d = med[k]
        # rounds in which this row was at least as fast as the other in the same round
        wins_g = sum(x["step_s"] <= y["step_s"] for x, y in zip(rows[k], rows[gloo]))
        wins_p = sum(x["step_s"] <= y["step_s"] for x, y in zip(rows[k], rows[pp]))
        print(f"\n{k}: step time / PyTorch DDP: {d['step_s'] / p['step_s']:.3f} (not slower in {wins_g} of {a.repeat} "
              f"rounds); / per-parameter: {d['step_s'] / q['step_s']:.3f} (not slower in {wins_p} of {a.repeat}); "
              f"exposed / PyTorch DDP's: {d['exposed_s'] / p['exposed_s']:.3f}; after the last backward: "
              f"{d['exposed_last_s'] / p['exposed_last_s']:.3f} of PyTorch DDP's and "
              f"{d['exposed_last_s'] / d['last_bucket_s']:.3f} of its last bucket's all-reduce; after the end of the "
              f"graph task: {d['exposed_compute_last_s'] / p['exposed_compute_last_s']:.3f} of PyTorch DDP's and "
              f"{d['exposed_compute_last_s'] / d['last_bucket_s']:.3f} of its last bucket's all-reduce")
        checks = [("step <= PyTorch DDP's", d["step_s"] <= p["step_s"]),
                  ("step <= per-parameter's", d["step_s"] <= q["step_s"])]
        for col, what in (("exposed_last_s", "from the last hook"), ("exposed_compute_last_s", "from the graph end")):
            checks += [(f"exposed {what} <= 0.5x PyTorch DDP's", d[col] <= 0.5 * p[col]),
                       (f"exposed {what} <= last bucket", d[col] <= d["last_bucket_s"])]
        print("  targets (medians): " + "; ".join(f"{t}: {'yes' if ok else 'NO'}" for t, ok in checks))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["train", "check", "resume", "bench"])
    ap.add_argument("--resume-at", type=int, default=3)
    ap.add_argument("--algorithm", default="automatic", help="bench: dpkit's bucket all-reduce algorithm")
    ap.add_argument("--data", help="train: directory with init.bin and batches.rank<R>.bin")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view on both sides")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--loss-log")
    ap.add_argument("--json")
    ap.add_argument("--workdir")
    ap.add_argument("--torch-lm", default="build/examples/torch_lm")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--corpus", default="build/data/debian-descriptions.jsonl")
    ap.add_argument("--spm", default="data/debian-bpe-8k.model")
    a = ap.parse_args()
    if a.command == "train":
        if not a.data:
            ap.error("train needs --data")
        cmd_train(a)
        return 0
    if a.command == "check":
        return cmd_check(a)
    if a.command == "resume":
        return cmd_resume(a)
    return cmd_bench(a)


if __name__ == "__main__":
    sys.exit(main())
