#!/usr/bin/env bash
# What dpkit's collective checking costs (docs/reliability.md, docs/tuning.md
# "Checking cost"): allreduce_perf at 8 B, 64 KiB and 16 MiB with checking off
# (DPKIT_CHECK=0: plain tags) and on (1: sequence number + fingerprint in every
# tag, the default), alternating in one run so both see the same machine.
# Prints the median out-of-place time per (size, algorithm, level) and the
# on/off ratio.   scripts/bench_check_cost.sh [rounds, default 5] [np, default 2]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
rounds=${1:-5}
np=${2:-2}
exe=build/benchmarks/allreduce_perf
[ -x "$exe" ] || { echo "build first: scripts/test.sh" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 0; r < rounds; r++)); do
  for level in 0 1; do
    for spec in "8 2000" "64K 500" "16M 10"; do
      set -- $spec
      DPKIT_CHECK=$level mpirun -np "$np" -x DPKIT_CHECK "$exe" -b "$1" -e "$1" -n "$2" -w 20 -c 0 -A ring,tree 2>/dev/null |
        awk -v lvl="$level" '/^ *[0-9]/ && NF >= 13 {print lvl, $1, $6}' >> "$out" || true
    done
  done
done
python3 - "$out" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
order = []
lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
# allreduce_perf -A ring,tree prints one table per algorithm: ring rows, then tree rows
seen = collections.Counter()
for lvl, size, t in lines:
    k = (lvl, size)
    algo = "ring" if seen[k] % 2 == 0 else "tree"
    seen[k] += 1
    rows[(int(size), algo, lvl)].append(float(t))
print("| size (B) | algorithm | off: DPKIT_CHECK=0 (us) | on: DPKIT_CHECK=1 (us) | on/off |")
print("|---|---|---|---|---|")
for size in sorted({s for s, _, _ in rows}):
    for algo in ("ring", "tree"):
        off = statistics.median(rows[(size, algo, "0")]); on = statistics.median(rows[(size, algo, "1")])
        print(f"| {size} | {algo} | {off:.2f} | {on:.2f} | {on/off:.3f} |")
PY
