#!/bin/bash
# The rounds of 2026-12-05-registered-memory.md, from the repository root:
# per round, allreduce_perf --floor at np 2 on host buffers (the two-shot
# through the segment), the same host buffers after dpkit::register_memory
# (the direct path) and dpkit::allocate_symmetric's memory, alternated.
# Output: OUT/r<round>_<host|registered|symmetric>.txt; tables:
#   benchmarks/results/2026-12-04-symmetric-direct/parse.py "host=OUT/r*_host.txt" "reg=OUT/r*_registered.txt" "sym=OUT/r*_symmetric.txt"
#   OUT=/tmp/reg ROUNDS=5 benchmarks/results/2026-12-05-registered-memory/rounds.sh
set -u
OUT=${OUT:-/tmp/registered-rounds}
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT"
. scripts/env.sh
for i in $(seq 1 "$ROUNDS"); do
  for m in host registered symmetric; do
    timeout 600 mpirun -np 2 build/benchmarks/allreduce_perf -b 1M -e 256M -f 2 --floor --memory "$m" -n 20 \
      > "$OUT/r${i}_${m}.txt" 2>&1
  done
done
