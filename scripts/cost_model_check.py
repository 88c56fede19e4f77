#!/usr/bin/env python3
"""The cost model against a measured tuning file.

allreduce_perf --tune writes, for every size it measured, each algorithm's
time as a comment of the size's rule ("# at 65536 B, us: ring 413.3 tree
550.5 hier 275.0 native 546.7") and the link costs it fitted ("link intra",
"link inter", "reduce"). This script asks the cost model (allreduce_perf
--predict NODESxLOCAL, with the same file's link costs) for the same sizes
and layout and prints model / measured per algorithm and size, and how many
sizes from --from bytes on are within --within of the measurement.

    scripts/cost_model_check.py benchmarks/results/2026-11-25-cluster/tuning-2x2.txt
    scripts/cost_model_check.py FILE --build build --from 32K --within 0.25

Needs a built allreduce_perf (BUILD/benchmarks/allreduce_perf); runs it
without mpirun (--predict measures nothing). Python's standard library only.
"""
import argparse
import os
import re
import subprocess
import sys

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 32K)")
    return int(m.group(1)) * UNITS[m.group(2)]


def measured(path):
    """{size: {algorithm: us}} and (ranks, nodes, local) from a tuning file."""
    sizes, shape = {}, None
    rule = re.compile(r"^allreduce (\d+) (\d+) (\d+) \S+ \S+ \S+\s+# at (\d+) B, us: (.*)$")
    with open(path) as f:
        for line in f:
            m = rule.match(line.strip())
            if not m:
                continue
            shape = tuple(int(m.group(i)) for i in (1, 2, 3))
            words = m.group(5).split()
            sizes[int(m.group(4))] = {words[i]: float(words[i + 1]) for i in range(0, len(words) - 1, 2)}
    if not sizes:
        sys.exit(f"cost_model_check: {path} has no measured rules (# at N B, us: ...): not written by --tune?")
    return sizes, shape


def predicted(exe, path, nodes, local, lo, hi):
    """{size: {algorithm: us}} from allreduce_perf --predict."""
    env = dict(os.environ, DPKIT_TUNING_FILE=path)
    out = subprocess.run([exe, "--predict", f"{nodes}x{local}", "-b", str(lo), "-e", str(hi), "-f", "2"],
                         env=env, check=True, capture_output=True, text=True).stdout
    head, table = None, {}
    for line in out.splitlines():
        if line.startswith("#") and "size (B)" in line:
            head = line.lstrip("#").split()
            continue
        if line.startswith("#") or not line.strip() or head is None:
            continue
        cols = line.split()
        # header: size (B) ring us busbw tree us busbw ... best
        algos = [head[i] for i in range(2, len(head) - 1, 3)]
        table[int(cols[0])] = {a: float(cols[1 + 2 * k]) for k, a in enumerate(algos)}
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tuning_file")
    ap.add_argument("--build", default="build")
    ap.add_argument("--from", dest="lo", type=parse_bytes, default=parse_bytes("32K"),
                    help="count sizes from this many bytes on (default 32K)")
    ap.add_argument("--within", type=float, default=0.25, help="tolerance of model/measured - 1 (default 0.25)")
    a = ap.parse_args()
    exe = os.path.join(a.build, "benchmarks", "allreduce_perf")
    if not os.access(exe, os.X_OK):
        sys.exit(f"cost_model_check: {exe} is not built (ninja -C {a.build} benchmarks/allreduce_perf)")
    meas, (ranks, nodes, local) = measured(a.tuning_file)
    pred = predicted(exe, a.tuning_file, nodes, local, min(meas), max(meas))
    algos = [x for x in ("ring", "tree", "hier") if any(x in m for m in meas.values())]
    print(f"# {a.tuning_file}: {ranks} ranks, {nodes} nodes x {local}; model / measured per size")
    print("| size (B) | " + " | ".join(algos) + " |")
    print("|---:|" + "---:|" * len(algos))
    ok = {x: [0, 0] for x in algos}
    for s in sorted(meas):
        cells = []
        for x in algos:
            if x not in meas[s] or s not in pred or x not in pred[s]:
                cells.append("-")
                continue
            r = pred[s][x] / meas[s][x]
            cells.append(f"{r:.2f}")
            if s >= a.lo:
                ok[x][1] += 1
                ok[x][0] += abs(r - 1) <= a.within
        print(f"| {s} | " + " | ".join(cells) + " |")
    for x in algos:
        print(f"# {x}: {ok[x][0]}/{ok[x][1]} sizes from {a.lo} B within {a.within:.0%}")


if __name__ == "__main__":
    main()
