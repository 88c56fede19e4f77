#!/usr/bin/env python3
"""The rank-death matrix: one rank of N dies in the middle of a large
all-reduce (algorithms x ways to die) and every survivor must throw, destroy
its transport, finalize MPI and exit, each within the deadline + 5 s.

    scripts/rank_death_matrix.py BUILD/tests/mpi/rank_death [--np 3]
        [--mib 64] [--timeout 5] [--algos ring,tree,native,shm,auto]
        [--hows exit,kill,finalize] [--orders transport-first,buffer-first]
        [--runs 1] [--markdown]

--orders: whether a survivor destroys its transport while its buffer is
alive (transport-first) or frees the buffer first (buffer-first: the
program declared the transport before the buffer; the buffer is a mapping
of its own, so MPI still holding it is a segfault). --runs repeats every
case; the summary counts the runs per algorithm in which every survivor
met the bound.

Runs `mpirun -np N --mca orte_abort_on_non_zero_status 0` (a job that
handles its own errors) with DPKIT_TIMEOUT and RANK_DEATH_DIR (a temporary
directory); the program (tests/mpi/rank_death.cpp) writes its pid and the
agreed moment of death t0 on CLOCK_MONOTONIC, which is Python's
time.monotonic() on Linux, to a file there (and a survivor its last line),
so this script measures each survivor's process exit (its pid gone) on the
same clock. The files, not mpirun's forwarded stdout, are what is read: in
CI Open MPI 4.1's mpirun twice dropped rank 0's first line.
Prints a table (every time in seconds after the death) and exits 1 if any
survivor got no error, or its error, its teardown or its exit came later than
the deadline + 5 s. Open MPI 4.1's mpirun itself may not return after a rank
is SIGKILLed with abort-on-non-zero off, although every survivor has exited:
the script ends it once the survivors are gone (that is mpirun's, not the
ranks').
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by its orted) has ended
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def read_reports(d):
    """The lines the ranks wrote to files in `d` (rank.R, survivor.R), in one
    text; a file is renamed into place only once it is whole."""
    lines = []
    for name in sorted(os.listdir(d)):
        if name.startswith(("rank.", "survivor.")) and not name.endswith(".tmp"):
            with open(os.path.join(d, name)) as f:
                lines.append(f.read().rstrip("\n"))
    return "\n".join(lines) + "\n"


def run_one(exe, np_, algo, how, mib, timeout, order="transport-first"):
    with tempfile.TemporaryDirectory(prefix="rank_death.") as reports:
        return run_in(exe, np_, algo, how, mib, timeout, order, reports)


def run_in(exe, np_, algo, how, mib, timeout, order, reports):
    env = dict(os.environ, DPKIT_TIMEOUT=str(timeout), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", RANK_DEATH_DIR=reports)
    env.setdefault("OMPI_MCA_btl", "self,vader")
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--mca", "orte_abort_on_non_zero_status", "0",
           "-x", "DPKIT_TIMEOUT", "-x", "RANK_DEATH_DIR", exe, algo, how, str(np_ - 1), str(mib), order]
    limit = timeout + 5.0
    with tempfile.TemporaryFile(mode="w+") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        pids, t0, exits = {}, None, {}
        start = time.monotonic()
        while True:
            time.sleep(0.02)
            # each rank's pid line from its own file, not from mpirun's
            # forwarding of stdout: in CI, Open MPI 4.1 twice forwarded no pid
            # line of rank 0 (its later lines arrived) and the case failed
            for m in re.finditer(r"^rank (\d+) pid (\d+) t0 (\d+)$", read_reports(reports), re.M):
                pids[int(m.group(1))] = int(m.group(2))
                t0 = int(m.group(3)) / 1e9
            survivors = [r for r in pids if r != np_ - 1]
            now = time.monotonic()
            if t0 is not None and len(pids) == np_:
                for r in survivors:
                    if r not in exits and not alive(pids[r]):
                        exits[r] = now - t0
                if len(exits) == len(survivors):
                    break
            if now - start > limit + 30 or (t0 is not None and now - t0 > limit + 10):
                break
            if p.poll() is not None and len(pids) < np_:
                break
        if p.poll() is None:
            time.sleep(0.5)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        out.seek(0)
        text = out.read()
    reported = read_reports(reports)
    rows = []
    for r in sorted(r for r in pids if r != np_ - 1):
        m = re.search(rf"^survivor {r}: error ([+-][\d.]+) s \((\w+): .*; transport destroyed ([+-][\d.]+) s; "
                      rf"MPI_Finalize ([+-][\d.]+) s$", reported, re.M)
        row = {"algo": algo, "how": how, "order": order, "rank": r, "exit": exits.get(r)}
        if m:
            row.update(error=float(m.group(1)), type=m.group(2), destroyed=float(m.group(3)),
                       finalized=float(m.group(4)))
        rows.append(row)
    log = f"{text[-2000:]}--- the ranks' files:\n{reported}"
    if len(rows) != np_ - 1:
        rows.append({"algo": algo, "how": how, "order": order, "rank": "?", "exit": None, "log": log})
    for row in rows:
        ok = all(row.get(k) is not None and row[k] <= limit for k in ("error", "destroyed", "finalized", "exit"))
        row["ok"] = ok
        if not ok:
            row["log"] = log
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exe")
    ap.add_argument("--np", type=int, default=3)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=5)
    ap.add_argument("--algos", default="ring,tree,native,shm,auto")
    ap.add_argument("--hows", default="exit,kill,finalize")
    ap.add_argument("--orders", default="transport-first")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    rows = []
    runs = {}  # (algo, order) -> [runs, runs in which every survivor met the bound]
    for run in range(a.runs):
        for algo in a.algos.split(","):
            for order in a.orders.split(","):
                for how in a.hows.split(","):
                    got = run_one(a.exe, a.np, algo, how, a.mib, a.timeout, order)
                    for g in got:
                        g["run"] = run + 1
                    rows += got
                    c = runs.setdefault((algo, order, how), [0, 0])
                    c[0] += 1
                    c[1] += all(g["ok"] for g in got)
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    print(f"rank death matrix: {a.np} ranks, {a.mib} MiB all-reduce, DPKIT_TIMEOUT={a.timeout:g}, "
          f"rank {a.np - 1} dies; seconds after the death (bound {a.timeout + 5:g})")
    print("| run | algorithm | death | freed first | survivor | error | to error | transport destroyed | "
          "MPI_Finalize returned | process exited | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['algo']} | {r['how']} | {'buffer' if r['order'] == 'buffer-first' else 'transport'} | "
              f"{r['rank']} | {r.get('type', '-')} | {fmt(r.get('error'))} | "
              f"{fmt(r.get('destroyed'))} | {fmt(r.get('finalized'))} | {fmt(r.get('exit'))} | "
              f"{'yes' if r['ok'] else 'NO'} |")
    print()
    print("| algorithm | freed first | death | runs | runs with every survivor within the bound |")
    print("|---|---|---|---|---|")
    for (algo, order, how), (n, good) in runs.items():
        print(f"| {algo} | {'buffer' if order == 'buffer-first' else 'transport'} | {how} | {n} | {good} |")
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(f"--- run {r['run']} {r['algo']} {r['how']} {r['order']} rank {r['rank']}: output tail\n{r.get('log', '')}",
              file=sys.stderr)
    print(f"survivors within the bound: {len(rows) - len(bad)} of {len(rows)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
