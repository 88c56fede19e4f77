#!/bin/bash
# The rounds of 2026-12-04-direct-fused-nontemporal.md, from the repository
# root: per round, allreduce_perf --floor at np 2 on symmetric memory
# (the direct all-reduce) with the build before the change ($OLD, the
# 8 KiB block copied out with non-temporal stores) and this build (lines
# streamed from registers), alternated. Output: OUT/r<round>_<old|new>.txt;
# tables: ../2026-12-04-symmetric-direct/parse.py.
#   OLD=/tmp/wt_old/build/benchmarks/allreduce_perf OUT=/tmp/fused ROUNDS=3 benchmarks/results/2026-12-04-direct-fused-nontemporal/rounds.sh
set -u
OUT=${OUT:-/tmp/fused-rounds}
ROUNDS=${ROUNDS:-3}
OLD="${OLD:?path of the old build allreduce_perf}"
mkdir -p "$OUT"
. scripts/env.sh
for i in $(seq 1 "$ROUNDS"); do
  for v in old new; do
    bin=build/benchmarks/allreduce_perf
    [ "$v" = old ] && bin=$OLD
    timeout 600 mpirun -np 2 "$bin" -b 1M -e 256M -f 2 --floor --memory symmetric -n 20 > "$OUT/r${i}_${v}.txt" 2>&1
  done
done
