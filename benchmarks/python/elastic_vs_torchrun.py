#!/usr/bin/env python3
"""Time lost when a worker dies: torchrun --max-restarts (restart every worker
from the last checkpoint) against dpkit.elastic (the survivors go on), same
model, data and sampler, side by side in one run (issue 35, docs/python.md
"Elastic training").

Both train examples/python/train_elastic.py's section classifier (a bag of
byte bigrams over the corpus, Adam) with 3 processes on this machine and
SIGKILL one of them (not rank 0) once the job has applied step --kill-at:

- torchrun: `torchrun --standalone --nproc-per-node 3 --max-restarts 1` of
  this file's worker (DDP over --backend, TokenBudgetBatchSampler per rank,
  rank 0 checkpoints every --checkpoint-every steps, a restarted worker
  resumes from the checkpoint). torchrun's agent sees the death, stops the
  other workers and starts all three again: they re-join, load the
  checkpoint and redo the steps since it.
- dpkit.elastic: three members of train_elastic.py over a file store; the
  two survivors re-form and heal, then go on with the step that failed.

Measured from per-step wall-time logs: the step time before the kill
(median), the first step applied after the kill (torchrun: the restarted
workers' first, a step redone from the checkpoint; the others: the first
step not applied before the kill), and "time lost" (kill -> the job
applies a step it had not applied before, minus one step time). dpkit.elastic
and torchft also start the killed member again at --rejoin-at: the time from
its start to its first applied step (healed from a peer's state) is
reported. torchft runs one process per replica group (its own TCPStore),
its lighthouse with --heartbeat_timeout_ms = --dead-after and
--join_timeout_ms = --join-wait (dpkit.elastic: --dead-after and
announce_wait = --join-wait). torchrun's job must finish (exit 0) and /dev/shm must hold no
dpkit entry afterwards.

    xz -dk data/debian-descriptions.jsonl.xz
    VENV/bin/python benchmarks/python/elastic_vs_torchrun.py --data data/debian-descriptions.jsonl \\
        --torchrun VENV/bin/torchrun --rounds 3 --workdir /tmp/evt

(VENV: PyPI torch 2.x with dpkit installed; Debian's torch 1.13 torchrun
fails on Python 3.11.)
"""
import argparse
import glob
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))


def worker(args):
    """One torchrun worker: DDP over args.backend, checkpoint/resume."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import dpkit
    import dpkit.distributed  # noqa: F401 (registers the "dpkit" backend)
    from train_elastic import BagOfBigrams, bigrams

    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    logs = os.path.join(args.workdir, "logs")
    with open(os.path.join(logs, "pid.r%d.a%d" % (rank, attempt)), "w") as f:
        f.write(str(os.getpid()))
    fd = os.open(os.path.join(logs, "r%d.a%d.log" % (rank, attempt)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    ds = dpkit.JsonlDataset(args.data, length_field="num_tokens", progress=False)
    n = min(len(ds), args.limit_samples) if args.limit_samples > 0 else len(ds)
    lengths = ds.lengths()[:n]
    sections = {s: i for i, s in enumerate(sorted({ds[i]["section"] for i in range(len(ds))}))}
    sampler = dpkit.TokenBudgetBatchSampler(lengths, args.max_tokens, world, rank, max_sample_tokens=args.max_tokens,
                                            oversize="truncate", seed=17)
    batches = list(sampler)
    torch.manual_seed(0)
    model = BagOfBigrams(len(sections))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ckpt = os.path.join(args.workdir, "ckpt.pt")
    start = 0
    if os.path.exists(ckpt):
        st = torch.load(ckpt, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        start = st["step"]
    os.write(fd, ("%.3f R %d %d\n" % (time.time(), attempt, start)).encode())
    for step in range(start, args.steps):
        idx = batches[step % len(batches)]
        flat, offsets, labels = bigrams([ds[i] for i in idx], sections)
        loss = F.cross_entropy(ddp(flat, offsets), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        os.write(fd, ("%.3f A %d %d %.5f\n" % (time.time(), attempt, step, loss.item())).encode())
        if rank == 0 and (step + 1) % args.checkpoint_every == 0:
            tmp = ckpt + ".tmp"
            torch.save({"step": step + 1, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
            os.replace(tmp, ckpt)  # never a half-written checkpoint
        if args.pace > 0:
            time.sleep(args.pace)
    dist.destroy_process_group()


def torchft_worker(args):
    """One replica group of one process under torchft: its own TCPStore, a
    Manager talking to the lighthouse, torchft's DDP and optimizer wrapper
    (quorum per step, live recovery from a peer: torchft's train_ddp.py)."""
    from datetime import timedelta

    import torch
    import torch.nn.functional as F
    from torch.distributed import TCPStore
    from torchft import Manager, Optimizer, ProcessGroupGloo
    from torchft.ddp import PureDistributedDataParallel

    import dpkit
    from train_elastic import BagOfBigrams, bigrams

    torch.set_num_threads(1)
    rid = int(os.environ["REPLICA_GROUP_ID"])
    fd = os.open(os.path.join(args.workdir, "logs", "rg%d.log" % rid), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    ds = dpkit.JsonlDataset(args.data, length_field="num_tokens", progress=False)
    n = min(len(ds), args.limit_samples) if args.limit_samples > 0 else len(ds)
    lengths = ds.lengths()[:n]
    sections = {s: i for i, s in enumerate(sorted({ds[i]["section"] for i in range(len(ds))}))}
    # torchft shards by replica group and does not re-shard when one is lost (its DistributedSampler)
    batches = list(dpkit.TokenBudgetBatchSampler(lengths, args.max_tokens, 3, rid, max_sample_tokens=args.max_tokens,
                                                 oversize="truncate", seed=17))
    torch.manual_seed(0)
    model = BagOfBigrams(len(sections))
    inner = torch.optim.Adam(model.parameters(), lr=args.lr)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id="evt_%d" % rid,
                      store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, timeout=timedelta(seconds=10))
    # torchft 0.2.0's DistributedDataParallel dies at the first failed all-reduce under torch 2.15 (AssertionError
    # "assert fut._fut" in its comm hook); its per-tensor PureDistributedDataParallel survives it
    ddp = PureDistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    os.write(fd, ("%.3f R %d\n" % (time.time(), rid)).encode())
    while manager.current_step() < args.steps:
        step = manager.current_step()
        flat, offsets, labels = bigrams([ds[i] for i in batches[step % len(batches)]], sections)
        opt.zero_grad()  # starts the step's quorum
        loss = F.cross_entropy(ddp(flat, offsets), labels)
        loss.backward()
        opt.step()  # applies the step only if every participant's all-reduce succeeded
        if manager.current_step() > step:
            os.write(fd, ("%.3f A %d %d %d\n" % (time.time(), rid, step, manager.num_participants())).encode())
    manager.shutdown()


def read(path):
    out = []
    for p in glob.glob(path):
        with open(p) as f:
            out += [line.split() for line in f if line.endswith("\n")]
    return out


def dpkit_shm():
    return sorted(e for e in os.listdir("/dev/shm") if "dpkit" in e)


def run_torchrun(args, wd):
    logs = os.path.join(wd, "logs")
    os.makedirs(logs)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not args.share_rdzv_store:
        # torch 2.15's agent keeps one TCPStore across restarts with no per-attempt prefix for the workers, so a
        # restarted gloo worker may read the dead workers' addresses ("connectFullMesh ... Connection refused")
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = [args.torchrun, "--standalone", "--nproc-per-node", "3", "--max-restarts", "1", os.path.abspath(__file__),
           "--worker", "--backend", args.backend, "--workdir", wd, "--data", args.data, "--steps", str(args.steps),
           "--limit-samples", str(args.limit_samples), "--checkpoint-every", str(args.checkpoint_every),
           "--pace", str(args.pace)]
    out = open(os.path.join(wd, "torchrun.out"), "w")
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + args.timeout
    t_kill = None
    while time.time() < deadline:
        recs = read(os.path.join(logs, "r*.a0.log"))
        steps = [int(r[3]) for r in recs if r[1] == "A"]
        if steps and max(steps) >= args.kill_at:
            pid = int(open(os.path.join(logs, "pid.r1.a0")).read())
            os.kill(pid, signal.SIGKILL)
            t_kill = time.time()
            break
        if p.poll() is not None:
            break
        time.sleep(0.01)
    try:
        rc = p.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "timeout"
    wall = time.time() - t0
    if t_kill is None:
        sys.exit("torchrun: the job did not reach step %d (rc %s); see %s" % (args.kill_at, rc, out.name))
    after = [r for r in read(os.path.join(logs, "r0.a1.log")) if r[1] == "A"]
    resumed = [r for r in read(os.path.join(logs, "r0.a1.log")) if r[1] == "R"]
    if not after or not resumed:
        sys.exit("torchrun: no step after the restart (rc %s); see %s" % (rc, out.name))
    res = measure(read(os.path.join(logs, "r*.a*.log")), t_kill, None)
    res.update(rc=rc, wall=wall, shm=dpkit_shm(), first_after=float(after[0][0]) - t_kill,
               redo=res["killed_after"] + 1 - int(resumed[0][3]))
    return res


def measure(recs, t_kill, t_start, rejoined=None):
    """From 'T A who step ...' lines: the job's progress is the first time
    each step number is applied. Step time: the median gap between progress
    events before the kill. Time lost to the kill: the longest gap between
    progress events from the last one before the kill to the restart (or the
    end), minus one step time (steps redone after a restart are not
    progress). Rejoin: from the killed member's new start to its first step
    applied while the others still train (rejoined(recs): its lines), and the
    time lost by the job around it (as above, from the start on)."""
    A = [(float(r[0]), int(r[3])) for r in recs if r[1] == "A"]
    first = {}
    for t, st in sorted(A):
        first.setdefault(st, t)
    prog = sorted(first.values())
    before = [t for t in prog if t <= t_kill]
    step_time = statistics.median(b - a for a, b in zip(before, before[1:]))
    done = max(st for t, st in A if t <= t_kill)

    def lost(t0, t1):
        ts = [t for t in prog if t0 <= t <= t1]
        return max((b - a for a, b in zip(ts, ts[1:])), default=float("nan")) - step_time

    end = t_start if t_start is not None else float("inf")
    res = {"step_time": step_time, "killed_after": done, "lost": lost(before[-1], end),
           "first_after": min(t for t in prog if t > t_kill) - t_kill, "redo": 0,
           "rejoin": float("nan"), "rejoin_lost": float("nan")}
    if t_start is not None:
        mine = sorted(float(r[0]) for r in rejoined(recs) if float(r[0]) > t_start)
        if mine and any(t > mine[0] for t, st in A if first.get(st) == t):
            res["rejoin"] = mine[0] - t_start
            res["rejoin_lost"] = lost(max(t for t in prog if t <= t_start), mine[0] + 1.0)
    return res


def run_elastic(args, wd):
    logs, store = os.path.join(wd, "logs"), os.path.join(wd, "store")
    os.makedirs(logs)
    os.makedirs(store)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = {}
    t0 = time.time()
    for i in range(3):
        cmd = [sys.executable, os.path.join(ROOT, "examples", "python", "train_elastic.py"), "--store", "file://" + store,
               "--id", str(i), "--first-size", "3", "--data", args.data, "--limit-samples", str(args.limit_samples),
               "--steps", str(args.steps), "--threads", "1", "--sample-log", logs, "--log-every", "0",
               "--dead-after", str(args.dead_after), "--announce-wait", str(args.join_wait)]
        if args.pace > 0:
            sys.exit("--pace is for torchrun's worker only")
        procs[i] = subprocess.Popen(cmd, stdout=open(os.path.join(wd, "out.%d" % i), "w"), stderr=subprocess.STDOUT,
                                    env=env)
    def restart():
        procs[1].wait()
        cmd = [sys.executable, os.path.join(ROOT, "examples", "python", "train_elastic.py"), "--store",
               "file://" + store, "--id", "3", "--first-size", "3", "--data", args.data, "--limit-samples",
               str(args.limit_samples), "--steps", str(args.steps), "--threads", "1", "--sample-log", logs,
               "--log-every", "0", "--dead-after", str(args.dead_after), "--announce-wait", str(args.join_wait)]
        procs[3] = subprocess.Popen(cmd, stdout=open(os.path.join(wd, "out.3"), "w"), stderr=subprocess.STDOUT,
                                    env=env)

    # train_elastic's lines: "T A gen step epoch offset checksum", per member file
    def recs_now():
        out = []
        for i in (0, 1, 2, 3):
            out += [r[:2] + [str(i)] + r[3:] for r in read(os.path.join(logs, "id%d.log" % i))]
        return out

    own = lambda recs: [r for r in recs if r[1] == "A" and r[2] == "3"]
    t_kill, t_start = follow(args, recs_now, lambda: procs[1].send_signal(signal.SIGKILL), restart, own)
    rcs = {}
    deadline = time.time() + args.timeout
    for i in (0, 2, 3):
        try:
            rcs[i] = procs[i].wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            procs[i].kill()
            rcs[i] = "timeout"
    res = measure(recs_now(), t_kill, t_start, own)
    res.update(rc=rcs, wall=time.time() - t0, shm=dpkit_shm())
    return res


def free_port():
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def run_torchft(args, wd):
    logs = os.path.join(wd, "logs")
    os.makedirs(logs)
    port = free_port()
    lighthouse = subprocess.Popen([args.lighthouse_bin, "--min_replicas", "1", "--bind", "127.0.0.1:%d" % port,
                                   "--heartbeat_timeout_ms", str(int(args.dead_after * 1000)),
                                   "--join_timeout_ms", str(int(args.join_wait * 1000))],
                                  stdout=open(os.path.join(wd, "lighthouse.out"), "w"), stderr=subprocess.STDOUT)
    procs = {}

    def start(i):
        env = dict(os.environ, OMP_NUM_THREADS="1", REPLICA_GROUP_ID=str(i))
        cmd = [sys.executable, os.path.abspath(__file__), "--torchft-worker", "--workdir", wd, "--data", args.data,
               "--steps", str(args.steps), "--limit-samples", str(args.limit_samples),
               "--lighthouse", "http://127.0.0.1:%d" % port]
        procs[i] = subprocess.Popen(cmd, stdout=open(os.path.join(wd, "out.%d.%d" % (i, len(procs))), "w"),
                                    stderr=subprocess.STDOUT, env=env)

    t0 = time.time()
    for i in range(3):
        start(i)
    # the restarted replica group's steps with the others (a group alone is no rejoin)
    own = lambda recs: [r for r in recs if r[1] == "A" and r[2] == "1" and int(r[4]) > 1]
    t_kill, t_start = follow(args, lambda: read(os.path.join(logs, "rg*.log")),
                             lambda: procs[1].send_signal(signal.SIGKILL), lambda: (procs[1].wait(), start(1)), own)
    rcs = {}
    deadline = time.time() + args.timeout
    for i in (0, 1, 2):
        try:
            rcs[i] = procs[i].wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            procs[i].kill()
            rcs[i] = "timeout"
    lighthouse.kill()
    lighthouse.wait()
    res = measure(read(os.path.join(logs, "rg*.log")), t_kill, t_start, own)
    res.update(rc=rcs, wall=time.time() - t0, shm=dpkit_shm())
    return res


def follow(args, recs_now, kill, restart, own):
    """Kill a member once step --kill-at was applied; restart it once step
    --rejoin-at was applied; times from the logs (lines 'T A who step ...')."""
    deadline = time.time() + args.timeout
    t_kill = t_start = None
    while time.time() < deadline:
        recs = recs_now()
        steps = [int(r[3]) for r in recs if r[1] == "A"]
        top = max(steps) if steps else -1
        if t_kill is None and top >= args.kill_at:
            kill()
            t_kill = time.time()
        elif t_kill is not None and t_start is None and top >= args.rejoin_at:
            restart()
            t_start = time.time()
        elif t_start is not None and own([r for r in recs if float(r[0]) > t_start + 1.0]):
            break
        time.sleep(0.01)
    if t_start is None:
        sys.exit("the job did not reach step %d, or the killed member was not restarted" % args.rejoin_at)
    return t_kill, t_start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help="(internal) run as torchrun's worker")
    ap.add_argument("--torchft-worker", action="store_true", help="(internal) run as a torchft replica group")
    ap.add_argument("--lighthouse", help="(internal) the torchft lighthouse's URL")
    ap.add_argument("--lighthouse-bin", default="torchft_lighthouse", help="torchft's lighthouse server")
    ap.add_argument("--launchers", default="torchrun,dpkit,torchft",
                    help="which to run, comma-separated: torchrun, dpkit (dpkit.elastic), torchft")
    ap.add_argument("--data", required=True, help="the JSONL corpus (text, section, num_tokens)")
    ap.add_argument("--workdir", default="/tmp/elastic_vs_torchrun")
    ap.add_argument("--torchrun", default="torchrun", help="torchrun of a torch 2.x with dpkit installed")
    ap.add_argument("--backend", default="gloo", help="torchrun workers' DDP backend (gloo, dpkit)")
    ap.add_argument("--share-rdzv-store", action="store_true",
                    help="keep torchrun's default shared rendezvous store (gloo workers may then fail after the "
                         "restart; by default TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--kill-at", type=int, default=75, help="SIGKILL a worker once this step was applied")
    ap.add_argument("--rejoin-at", type=int, default=150,
                    help="dpkit.elastic and torchft: start the killed member again once this step was applied")
    ap.add_argument("--dead-after", type=float, default=2.0,
                    help="seconds without a heartbeat before a member is dead: dpkit.elastic's --dead-after, "
                         "torchft's lighthouse --heartbeat_timeout_ms")
    ap.add_argument("--join-wait", type=float, default=8.0,
                    help="seconds a re-formation waits for live members that have not taken part yet: "
                         "dpkit.elastic's announce_wait, torchft's lighthouse --join_timeout_ms")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--limit-samples", type=int, default=20000)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--pace", type=float, default=0.0, help="(worker) seconds to sleep after each step")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    args.data = os.path.abspath(args.data)
    if args.worker:
        worker(args)
        return
    if args.torchft_worker:
        torchft_worker(args)
        return
    import shutil
    import torch
    rows = []
    for n in range(args.rounds):
        chosen = args.launchers.split(",")
        for kind, fn in (("torchrun --max-restarts 1", run_torchrun), ("dpkit.elastic", run_elastic),
                         ("torchft", run_torchft)):
            if kind.split()[0].split(".")[0] not in chosen:
                continue
            wd = os.path.join(os.path.abspath(args.workdir), "%d-%s" % (n, kind.split()[0]))
            shutil.rmtree(wd, ignore_errors=True)
            os.makedirs(wd)
            r = fn(args, wd)
            rows.append((n, kind, r))
            print("round %d %-26s rc %s step %.1f ms, killed after step %d, first step after the kill %.2f s, "
                  "redid %d steps, time lost %.2f s; restarted member's first step %.2f s after its start, "
                  "the job lost %.2f s to it; wall %.1f s, /dev/shm dpkit entries after: %s" %
                  (n, kind, r["rc"], r["step_time"] * 1e3, r["killed_after"], r["first_after"], r["redo"],
                   r["lost"], r["rejoin"], r["rejoin_lost"], r["wall"], r["shm"] or "none"), flush=True)
    print("\ntorch %s, torchrun backend %s, checkpoint every %d steps, kill after step %d, restart at step %d, "
          "dead after %.1f s, join wait %.1f s, %d rounds" %
          (torch.__version__, args.backend, args.checkpoint_every, args.kill_at, args.rejoin_at, args.dead_after,
           args.join_wait, args.rounds))
    print("| launcher | step (ms) | first step after the kill (s) | steps redone | time lost to the kill (s) | "
          "restarted member: first step after its start (s) | time lost to its return (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    f = lambda x: "-" if x != x else "%.2f" % x
    for n, kind, r in rows:
        print("| %s (round %d) | %.1f | %.2f | %d | %.2f | %s | %s |" %
              (kind, n, r["step_time"] * 1e3, r["first_after"], r["redo"], r["lost"], f(r["rejoin"]),
               f(r["rejoin_lost"])))
    ok = lambda rc: rc == 0 or (isinstance(rc, dict) and all(v == 0 for v in rc.values()))
    bad = [(n, k) for n, k, r in rows if r["shm"] or not ok(r["rc"])]
    if bad:
        sys.exit("FAIL: %s (a job that did not finish, or dpkit entries left in /dev/shm)" % bad)


if __name__ == "__main__":
    main()
