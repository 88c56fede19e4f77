#!/usr/bin/env bash
# dpkit's all-reduce against the best native one on this node, from one
# command: allreduce_perf (np=2, float sum, 8 B .. 256 MiB by default) runs
#   1. every dpkit algorithm (-A all: ring, tree, auto, ...) and native
#      MPI_Allreduce under Open MPI's default coll/tuned, back to back per size;
#   2. native MPI_Allreduce under coll/sm forced (mpirun --mca
#      coll_sm_priority 100; dpkit's algorithms use point-to-point messages,
#      which coll/sm does not change, so they are not run again);
# then prints one table per half (out-of-place, in-place): time in us per
# size for each dpkit algorithm, native tuned and native sm, and the ratio of
# dpkit's auto to the faster native (> 1: auto is faster).
#
#   scripts/bench_native.sh                      # 8 B .. 256 MiB, -f 2
#   scripts/bench_native.sh -b 8 -e 16M -f 4     # other sizes
#   scripts/bench_native.sh -R auto -I 1         # any allreduce_perf flag
#   NP=4 scripts/bench_native.sh                 # more ranks (--oversubscribe)
#   KEEP=dir scripts/bench_native.sh             # keep both runs' CSV and logs in dir
#   ROUNDS=5 scripts/bench_native.sh             # 5 rounds of both runs, alternated
#   CLUSTER=1 SECOND=han NP=4 scripts/bench_native.sh   # on the emulated cluster
#                                                # (scripts/cluster.sh up first): the second run
#                                                # forces coll/han (Open MPI's hierarchical
#                                                # collectives) instead of coll/sm
#
# With ROUNDS=k > 1 the two runs alternate k times (tuned, sm, tuned, sm, ...)
# and every cell is the median over the k rounds of that cell; the last
# column then also says in how many rounds auto was at least as fast as the
# faster native of the same round. On a shared machine whose speed drifts
# over seconds (this project's VM: whole runs 2-4x slower at times), one run
# per column puts the drift into the ratios; alternated rounds and medians
# give every column the same mix of fast and slow periods.
#
# Extra arguments are passed to both runs; a flag given there replaces the
# default (-b 8 -e 256M -f 2 -d float -o sum -c 1). Environment: NP (2),
# ROUNDS (1), BUILD (build), KEEP (a directory for the raw files; default: a
# temporary one, removed), CLUSTER (1: launch through scripts/cluster.sh run,
# across its nodes), SECOND (sm or han: the native component of the second
# run, default sm), DPKIT_TUNING_FILE (what auto reads; passed to the ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
BUILD=${BUILD:-build}
[ -d "$BUILD/meson-info" ] || meson setup "$BUILD" --buildtype=release
ninja -C "$BUILD" benchmarks/allreduce_perf >/dev/null
NP=${NP:-2}
if [ -n "${KEEP:-}" ]; then
  mkdir -p "$KEEP"
  dir=$KEEP
else
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
fi
# Defaults, each dropped when the arguments set that flag (CLI11 takes one of each).
defaults=()
for d in "-b --minbytes 8" "-e --maxbytes 256M" "-f --stepfactor 2" "-d --datatype float" "-o --op sum" "-c --check 1"; do
  read -r short long value <<<"$d"
  given=0
  for a in "$@"; do [ "$a" = "$short" ] || [ "$a" = "$long" ] || [[ "$a" == "$long="* ]] && given=1; done
  [ $given = 1 ] || defaults+=("$short" "$value")
done
if [ "${CLUSTER:-0}" = 1 ]; then
  launch=(scripts/cluster.sh run -np "$NP")
else
  launch=(mpirun -np "$NP" --oversubscribe)
fi
SECOND=${SECOND:-sm}
case "$SECOND" in
sm) second_mca=(--mca coll_sm_priority 100); second_extra= ;;
# Open MPI 4.1.4's coll/han crashes on in-place all-reduces from 256 KiB (it
# reads MPI_IN_PLACE as a buffer address): its run is out of place only.
han) second_mca=(--mca coll_han_priority 100); second_extra=--skip-in-place ;;
*) echo "bench_native.sh: SECOND must be sm or han, not '$SECOND'" >&2; exit 2 ;;
esac
run() { # name, -A value, extra mpirun args...
  local name=$1 algos=$2
  shift 2
  echo "# run: ${launch[*]} $* $BUILD/benchmarks/allreduce_perf ${defaults[*]} -A $algos $EXTRA --csv $dir/$name.csv" >&2
  # shellcheck disable=SC2086
  if ! "${launch[@]}" "$@" "$BUILD/benchmarks/allreduce_perf" "${defaults[@]}" -A "$algos" $EXTRA \
      --csv "$dir/$name.csv" >"$dir/$name.log" 2>&1; then
    cat "$dir/$name.log" >&2
    echo "bench_native.sh: the $name run failed (log above)" >&2
    exit 1
  fi
  grep -E '^# (Algorithm:|Out of bounds)' "$dir/$name.log" | paste - - | sed "s/^/# $name: /" >&2
}
EXTRA="$*"
ROUNDS=${ROUNDS:-1}
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "bench_native.sh: ROUNDS must be a positive integer, not '$ROUNDS'" >&2; exit 2; }
for ((k = 1; k <= ROUNDS; ++k)); do
  suffix=$([ "$ROUNDS" = 1 ] || echo ".$k")
  run "tuned$suffix" all
  EXTRA="$EXTRA $second_extra" run "$SECOND$suffix" native "${second_mca[@]}"
done
python3 - "$dir" "$NP" "$ROUNDS" "$SECOND" <<'EOF'
import csv
import statistics
import sys

dir_, np, rounds, second = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
names = [""] if rounds == 1 else [f".{k}" for k in range(1, rounds + 1)]


def load(path):
    rows = {}
    algos = []
    with open(path, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            a = r["algorithm"]
            if a not in algos:
                algos.append(a)
            rows[(a, int(r["size"]))] = r
    return rows, algos


t_runs = [load(f"{dir_}/tuned{n}.csv") for n in names]
s_runs = [load(f"{dir_}/{second}{n}.csv")[0] for n in names]
t_algos = t_runs[0][1]
dpkit = [a for a in t_algos if a != "native"]
sizes = sorted({s for (_, s) in t_runs[0][0]})


def human(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def one(rows, a, s, half):
    r = rows.get((a, s))
    if not r:
        return None
    v = float(r[half + "_time_us"])
    return None if v != v else v  # NaN: not measured (--skip-in-place)


def cell(runs, a, s, half):
    """The median over the rounds (the value itself for one round)."""
    v = [x for x in (one(rows, a, s, half) for rows in runs) if x is not None]
    return statistics.median(v) if v else None


def best_native(k, s, half):
    v = [x for x in (one(t_runs[k][0], "native", s, half), one(s_runs[k], "native", s, half)) if x is not None]
    return min(v) if v else None


def fmt(v):
    return "-" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.1f}" if v < 10000 else f"{v:.0f}")


all_rows = [rows for rows, _ in t_runs] + s_runs
wrong = sum(int(r[h + "_wrong"] or 0) for rows in all_rows for r in rows.values() for h in ("oop", "ip"))
t_only = [rows for rows, _ in t_runs]
what = "time per op (us), slowest rank" + ("" if rounds == 1 else f", median of {rounds} alternated rounds")
for half, title in (("oop", "out-of-place"), ("ip", "in-place")):
    print(f"\n### allreduce, np={np}, float sum, {title}: {what}\n")
    cols = [f"dpkit {a}" for a in dpkit] + ["native tuned", f"native {second}", "auto / best native"]
    if rounds > 1:
        cols.append("rounds auto >= best native")
    print("| size | " + " | ".join(cols) + " |")
    print("|---:|" + "---:|" * len(cols))
    for s in sizes:
        vals = [cell(t_only, a, s, half) for a in dpkit]
        nt, ns = cell(t_only, "native", s, half), cell(s_runs, "native", s, half)
        auto = cell(t_only, "auto", s, half)
        best = min(v for v in (nt, ns) if v is not None) if (nt or ns) else None
        ratio = f"{best / auto:.2f}x" if auto and best else "-"
        line = f"| {human(s)} | " + " | ".join(fmt(v) for v in vals + [nt, ns]) + f" | {ratio} |"
        if rounds > 1:
            pairs = [(one(t_only[k], "auto", s, half), best_native(k, s, half)) for k in range(rounds)]
            wins = sum(1 for a, b in pairs if a is not None and b is not None and a <= b)
            line += f" {wins}/{rounds} |"
        print(line)
print(f"\n#wrong over every run, algorithm and size: {wrong}")
sys.exit(1 if wrong else 0)
EOF
