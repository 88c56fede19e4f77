#!/usr/bin/env python3
"""Elastic training test over torch_lm --elastic (docs/elastic.md, "Healing,
exactly-once data and DDP"), or over dpkit.elastic from Python with
--python-worker (python/tests/elastic_worker.py, docs/python.md): processes on one machine meet through a file
store; members end themselves (_exit) at each failure point and processes
join while the group trains. Then the logs (torch_lm's --sample-log) are
checked against an independent account:

- every generation's members hold bitwise the same parameters after the heal
  (equal checksums on every member, joiners included), and that state is the
  one some member logged after the last step that counts (no half-applied
  step);
- the steps that count: in generation g, those from its heal's step up to the
  next healed generation's step; each was run by every rank of g (one sample
  line per rank) at the global position offset + (step - heal step) * world +
  rank;
- over the steps that count, every sample id 0..N-1 of the epoch (N =
  --limit-samples: the sampler keeps every sample under the truncate policy)
  was trained exactly once;
- a joiner whose id is the lowest (rank 0 without a state) gets the state
  from a member that has one;
- survivors apply a step within seconds of each failure, and the survivors
  finish the epoch with equal parameters.

Usage: torch_elastic_check.py --torch-lm BUILD/examples/torch_lm --corpus
BUILD/data/debian-descriptions.jsonl --spm data/debian-bpe-8k.model
--workdir DIR
       torch_elastic_check.py --python-worker PYTHON python/tests/elastic_worker.py
--workdir DIR --timeout 240
"""
import argparse
import collections
import os
import shutil
import subprocess
import sys
import time

N_SAMPLES = 1500


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch-lm")
    ap.add_argument("--corpus")
    ap.add_argument("--spm")
    ap.add_argument("--python-worker", nargs=2, metavar=("PYTHON", "WORKER"),
                    help="run the members as PYTHON WORKER (python/tests/elastic_worker.py: dpkit.elastic from "
                         "Python, the same logs) instead of torch_lm")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--scenario", choices=("failures", "stuck"), default="failures",
                    help="failures: members end themselves at each failure point (default); stuck (with "
                         "--python-worker): a member sleeps in its step with its heartbeat alive, another is "
                         "stopped with SIGSTOP; both must be expelled within the step deadline and come back")
    ap.add_argument("--step-deadline", type=float, default=2.0, help="--scenario stuck: the group's step deadline (s)")
    ap.add_argument("--sampler", choices=("token-budget", "distributed"), default="token-budget",
                    help="with --python-worker: the members' sampler (distributed: dpkit.DistributedSampler, "
                         "--batch-size samples per member per step)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--check-only", action="store_true", help="check the logs of an earlier run in --workdir")
    ap.add_argument("--external-failures", action="store_true",
                    help="with --check-only: the failures came from outside (processes killed), not from --control, "
                         "so there are no injected-failure records to check")
    args = ap.parse_args()
    if not args.python_worker and not (args.torch_lm and args.corpus and args.spm):
        ap.error("--torch-lm, --corpus and --spm are required without --python-worker")
    if args.scenario == "stuck" and not args.python_worker:
        ap.error("--scenario stuck needs --python-worker")
    if args.check_only:
        logs = os.path.join(os.path.abspath(args.workdir), "logs")
        recs = []
        for name in os.listdir(logs):
            with open(os.path.join(logs, name)) as f:
                recs += [line.split() for line in f if line.endswith("\n")]
        check(recs, lambda msg: sys.exit("FAIL: " + msg), injected=not args.external_failures)
        print("PASS")
        return

    wd = os.path.abspath(args.workdir)
    shutil.rmtree(wd, ignore_errors=True)
    store, logs, control = (os.path.join(wd, d) for d in ("store", "logs", "control"))
    for d in (store, logs, control):
        os.makedirs(d)
    open(os.path.join(control, "pace"), "w").close()
    deadline = time.time() + args.timeout
    procs = {}

    def start(i):
        if args.python_worker:
            cmd = list(args.python_worker) + ["--store", "file://" + store, "--id", str(i), "--first-size", "3",
                                              "--logs", logs, "--control", control]
            if args.scenario == "stuck":
                cmd += ["--step-deadline", str(args.step_deadline)]
            if args.sampler == "distributed":
                cmd += ["--sampler", "distributed", "--batch-size", str(args.batch_size)]
            out = open(os.path.join(wd, "out.%d.txt" % i), "w")
            procs[i] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            return
        cmd = [args.torch_lm, "--elastic", "file://" + store, "--id", str(i), "--first-size", "3",
               "--corpus", args.corpus, "--spm", args.spm, "--layers", "1", "--d-model", "16", "--heads", "2",
               "--max-len", "16", "--max-tokens", "32", "--limit-samples", str(N_SAMPLES), "--epochs", "1",
               "--steps", "100000", "--threads", "1", "--heartbeat-ms", "50", "--dead-after-ms", "600",
               "--sample-log", logs, "--control", control, "--log-every", "10",
               # the scenario ends with the master of a 2-member generation exiting and
               # the other going on alone: not a majority (the rule is tested in tests/gloo)
               "--no-majority"]
        out = open(os.path.join(wd, "out.%d.txt" % i), "w")
        procs[i] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def read_logs():
        recs = []
        for name in os.listdir(logs):
            with open(os.path.join(logs, name)) as f:
                for line in f:
                    if line.endswith("\n"):
                        recs.append(line.split())
        return recs

    def wait_for(what, pred):
        while time.time() < deadline:
            recs = read_logs()
            if pred(recs):
                return recs
            for i, p in procs.items():
                if p.poll() not in (None, 0, 3):
                    fail("process %d exited with %s while waiting for %s" % (i, p.returncode, what))
            time.sleep(0.05)
        fail("timed out waiting for " + what)

    def fail(msg):
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for i in sorted(procs):
            path = os.path.join(wd, "out.%d.txt" % i)
            sys.stderr.write("---- id %d output:\n%s" % (i, open(path).read() if os.path.exists(path) else ""))
        sys.exit("FAIL: " + msg)

    def applied_after(recs, t0):
        # a step applied in a generation healed after t0
        healed = min((float(r[0]) for r in recs if r[1] == "J" and float(r[0]) > t0), default=None)
        return healed is not None and any(r[1] == "A" and float(r[0]) > healed for r in recs)

    def inject(i, where):
        with open(os.path.join(control, "fail.%d" % i), "w") as f:
            f.write(where)
        recs = wait_for("id %d to fail (%s)" % (i, where), lambda rs: any(r[1] == "F" and r[2] == str(i) for r in rs))
        t = max(float(r[0]) for r in recs if r[1] == "F" and r[2] == str(i))
        wait_for("a step applied after id %d failed" % i, lambda rs: applied_after(rs, t))

    def finish_epoch(ids):
        # the members `ids` run to the end of the epoch and exit 0
        for i in ids:
            try:
                procs[i].wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                fail("id %d did not finish the epoch" % i)
            if procs[i].returncode != 0:
                fail("id %d exited with %d" % (i, procs[i].returncode))

    if args.scenario == "stuck":
        run_stuck(args, start, procs, wait_for, read_logs, fail, applied_after, control, finish_epoch)
        return

    # Generation 0: ids 1, 2, 3. Failures: during a collective (2), during a
    # join (5), before a collective (3), after one, the master (1); joiners 4,
    # 0 and 6 must receive the state. Ids 0 and 6 join last, together; id 0
    # has the lowest id: it is rank 0 of its generation without a state, so
    # the state must come from id 4.
    for i in (1, 2, 3):
        start(i)
    wait_for("two steps of generation 0", lambda rs: sum(1 for r in rs if r[1] == "A" and r[2] == "0") >= 6)
    inject(2, "during")
    start(4)
    wait_for("id 4 to join", lambda rs: any(r[1] == "J" and r[3] == "4" for r in rs))
    with open(os.path.join(control, "fail.5"), "w") as f:
        f.write("join")
    start(5)
    recs = wait_for("id 5 to fail in its join", lambda rs: any(r[1] == "F" and r[2] == "5" for r in rs))
    t5 = max(float(r[0]) for r in recs if r[1] == "F" and r[2] == "5")
    wait_for("a step applied after id 5 failed", lambda rs: applied_after(rs, t5))
    inject(3, "before")
    inject(1, "after")
    # Two joiners at once: id 0 (the lowest id of all, so rank 0 without a
    # state) and id 6 start together and must both be healed from id 4.
    start(0)
    start(6)
    wait_for("ids 0 and 6 to join", lambda rs: all(any(r[1] == "J" and r[3] == i for r in rs) for i in ("0", "6")))
    os.remove(os.path.join(control, "pace"))
    finish_epoch((4, 0, 6))
    for i in (1, 2, 3, 5):
        procs[i].wait(timeout=10)
        if procs[i].returncode != 3:
            fail("id %d exited with %d, expected its injected _exit(3)" % (i, procs[i].returncode))

    check(read_logs(), fail, unit=args.batch_size if args.sampler == "distributed" else 1)

    # A process that arrives when every process holding the state is gone
    # forms a generation alone and cannot be healed: it must fail with an
    # error that says so, not rebuild forever.
    start(9)
    try:
        procs[9].wait(timeout=max(15.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        fail("id 9 (no member holds the state) did not end")
    out9 = open(os.path.join(wd, "out.9.txt")).read()
    if procs[9].returncode != 1 or "no member holds the training state" not in out9:
        fail("id 9 exited with %d: %s" % (procs[9].returncode, out9))
    print("a process alone without the state: exit 1, '%s'" % out9.strip().splitlines()[-1])
    print("PASS")


def run_stuck(args, start, procs, wait_for, read_logs, fail, applied_after, control, finish_epoch):
    """Ids 1, 2, 3 with a step deadline: id 2's main thread sleeps 8 s in a
    step (its heartbeat alive), then id 3 is stopped with SIGSTOP (its
    heartbeat too) for 4 s. Each time the others must apply a step within
    the step deadline (plus re-forming and healing: the bound checked is
    the deadline + 3 s), and the member must come back (admitted and healed)
    and finish the epoch with the others."""
    import signal
    for i in (1, 2, 3):
        start(i)
    wait_for("two steps of generation 0", lambda rs: sum(1 for r in rs if r[1] == "A" and r[2] == "0") >= 6)
    bound = args.step_deadline + 3.0
    lost = []

    def recovered(what, t):
        recs = wait_for("a step applied after " + what, lambda rs: applied_after(rs, t))
        healed = min(float(j[0]) for j in recs if j[1] == "J" and float(j[0]) > t)
        nxt = min(float(a[0]) for a in recs if a[1] == "A" and float(a[0]) > healed)
        print("%s: healed %.2f s later, next step applied %.2f s later (step deadline %.1f s)" %
              (what, healed - t, nxt - t, args.step_deadline))
        if nxt - t > bound:
            fail("%s: the next step was applied %.2f s later, more than the deadline + 3 s" % (what, nxt - t))
        lost.append(nxt - t)

    def came_back(ident, t):
        wait_for("id %d to be healed again" % ident,
                 lambda rs: any(r[1] == "J" and r[3] == str(ident) and float(r[0]) > t for r in rs))
        print("id %d came back (admitted and healed)" % ident)

    with open(os.path.join(control, "fail.2"), "w") as f:
        f.write("sleep")
    recs = wait_for("id 2 to sleep", lambda rs: any(r[1] == "F" and r[2] == "2" for r in rs))
    t2 = max(float(r[0]) for r in recs if r[1] == "F" and r[2] == "2")
    recovered("id 2 asleep in its step (heartbeat alive)", t2)
    came_back(2, t2 + 8)
    os.remove(os.path.join(control, "fail.2"))
    t3 = time.time()
    os.kill(procs[3].pid, signal.SIGSTOP)
    recovered("id 3 stopped (SIGSTOP)", t3)
    time.sleep(max(0.0, t3 + 4 - time.time()))
    os.kill(procs[3].pid, signal.SIGCONT)
    came_back(3, t3 + 4)
    os.remove(os.path.join(control, "pace"))
    finish_epoch((1, 2, 3))
    recs = read_logs()
    check(recs, fail, injected=False)
    D = [r for r in recs if r[1] == "D"]
    if len(D) != 3:
        fail("finish lines %s" % D)
    # generations: the first, each expulsion, each return (one spare: a
    # member may wake while the others re-form). A stuck member counted as a
    # joiner before it woke re-formed the group at every step (7+ here).
    gens = {int(r[2]) for r in recs if r[1] == "J"}
    if len(gens) > 6:
        fail("%d generations for two expulsions and two returns: %s" % (len(gens), sorted(gens)))
    print("PASS")


def check(recs, fail, injected=True, unit=1):
    """unit: global positions one rank's step takes (1: a batch of the
    token-budget sampler's sequence; B: B samples of a DistributedSampler,
    whose logged position is the rank's first sample's)."""
    J = [r for r in recs if r[1] == "J"]
    S = [r for r in recs if r[1] == "S"]
    A = [r for r in recs if r[1] == "A"]
    F = [r for r in recs if r[1] == "F"]
    D = [r for r in recs if r[1] == "D"]
    # Heals: per generation, equal step/offset/checksum on every member that
    # logged one.
    heal = {}
    for r in J:
        gen, ident, rank, world, step, epoch, offset, cks, src, members = \
            int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]), int(r[8]), r[9], int(r[10]), r[11]
        key = (step, epoch, offset, cks, world, members)
        if gen in heal and heal[gen]["key"] != key:
            fail("generation %d: members disagree after the heal: %s vs %s" % (gen, heal[gen]["key"], key))
        h = heal.setdefault(gen, {"key": key, "ids": set(), "step": step, "offset": offset, "world": world,
                                  "cks": cks, "members": members, "time": float(r[0])})
        h["ids"].add(ident)
        if members.split(",")[rank] != str(ident):
            fail("generation %d: id %d logged rank %d of members %s" % (gen, ident, rank, members))
    gens = sorted(heal)
    applied = collections.defaultdict(dict)  # (gen, step) -> {checksum}
    for r in A:
        applied[(int(r[2]), int(r[3]))].setdefault(r[6], []).append(int(r[5]))
    for (g, s), by in applied.items():
        if len(by) != 1:
            fail("generation %d step %d: ranks that applied it hold different parameters %s" % (g, s, list(by)))
    # The state a heal broadcast is one a member logged after the last step
    # that counted (or the initial state at step 0).
    for g in gens:
        h = heal[g]
        if h["step"] > 0 and not any(h["cks"] in by for (g2, s), by in applied.items() if g2 < g and s == h["step"] - 1):
            fail("generation %d: the healed state (step %d, %s) is no state logged after step %d" %
                 (g, h["step"], h["cks"], h["step"] - 1))
        if g in applied_gens(applied) and len(h["ids"]) != h["world"]:
            fail("generation %d trained, but only ids %s of %s logged its heal" % (g, sorted(h["ids"]), h["members"]))
    # The steps that count, and their samples.
    seen = collections.Counter()
    positions = collections.Counter()
    counted = 0
    for n, g in enumerate(gens):
        h = heal[g]
        end = heal[gens[n + 1]]["step"] if n + 1 < len(gens) else None
        steps = sorted(s for (g2, s) in applied if g2 == g and (end is None or s < end))
        if end is not None and steps != list(range(h["step"], end)):
            fail("generation %d: steps %d..%d count, but applied steps are %s" % (g, h["step"], end - 1, steps))
        for s in steps:
            lines = [r for r in S if int(r[2]) == g and int(r[3]) == s]
            ranks = sorted(int(r[6]) for r in lines)
            if ranks != list(range(h["world"])):
                fail("generation %d step %d: sample lines of ranks %s, world %d" % (g, s, ranks, h["world"]))
            for r in lines:
                pos, rank, pad = int(r[5]), int(r[6]), r[7] == "1"
                want = h["offset"] + (s - h["step"]) * h["world"] * unit + rank
                if pos != want:
                    fail("generation %d step %d rank %d: position %d, expected %d" % (g, s, rank, pos, want))
                if not pad:
                    positions[pos] += 1
                    for i in r[8:]:
                        seen[int(i)] += 1
            counted += 1
    expected = collections.Counter(range(N_SAMPLES))
    if seen != expected:
        missing = sorted(set(expected) - set(seen))
        twice = sorted(i for i, c in seen.items() if c > 1)
        extra = sorted(set(seen) - set(expected))
        fail("samples trained: %d missing %s, %d more than once %s, %d foreign %s" %
             (len(missing), missing[:10], len(twice), twice[:10], len(extra), extra[:10]))
    if any(c != 1 for c in positions.values()):
        fail("a global position counted twice")
    # Failure points, and recovery within seconds.
    wheres = sorted(r[3] for r in F)
    if injected and wheres != ["after", "before", "during", "join"]:
        fail("injected failures %s" % wheres)
    for r in F:
        # the first step applied in a generation healed after the failure
        t = float(r[0])
        healed = min((float(j[0]) for j in J if float(j[0]) > t), default=None)
        nxt = None if healed is None else min((float(a[0]) for a in A if float(a[0]) > healed), default=None)
        if nxt is None or nxt - t > 20:
            fail("no step applied within 20 s of id %s failing (%s)" % (r[2], r[3]))
        print("id %s failed (%s, step %s): healed %.2f s later, next step applied %.2f s later" %
              (r[2], r[3], r[4], healed - t, nxt - t))
    # Joiners got the state and their position.
    for ident in ((4, 0, 6) if injected else ()):
        if not any(ident in h["ids"] for h in heal.values()):
            fail("id %s never healed" % ident)
    if injected:
        both = [g for g in gens if {0, 6} <= heal[g]["ids"] and not any(
            {0, 6} & heal[g2]["ids"] for g2 in gens if g2 < g)]
        print("ids 0 and 6 (started together) joined %s" %
              ("in one generation (%d)" % both[0] if both else "in two generations"))
    # The survivors end equal (the test's scenario: exactly ids 4, 0 and 6 finish).
    if (injected and len(D) != 3) or not D or len({r[5] for r in D}) != 1:
        fail("finish lines %s" % D)
    print("%d generations healed, %d steps counted, %d samples each trained once, final checksum %s" %
          (len(gens), counted, N_SAMPLES, D[0][5]))


def applied_gens(applied):
    return {g for (g, s) in applied}


if __name__ == "__main__":
    main()
