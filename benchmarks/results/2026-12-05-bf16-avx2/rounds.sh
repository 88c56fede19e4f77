#!/bin/bash
# The 64 MiB all-reduce, np 2, per type at the same byte count, alternated
# (as benchmarks/results/2026-12-02-f16c-reduction.md), with the bf16 AVX2
# loop on and off (DPKIT_BF16_AVX2=0). MEMORY=host (the two-shot) or
# registered (the direct path); OUT=dir ROUNDS=n.
set -eu
. "$(dirname "$0")/../../../scripts/env.sh"
OUT=${OUT:-/tmp/bf16}; ROUNDS=${ROUNDS:-3}; MEMORY=${MEMORY:-host}
mkdir -p "$OUT"
B="build/benchmarks/allreduce_perf -b 64M -e 64M -n 10 -w 2 --memory $MEMORY"
for r in $(seq 1 "$ROUNDS"); do
  mpirun -np 2 $B -d float > "$OUT/float_$r.txt"
  mpirun -np 2 $B -d bfloat16 > "$OUT/bfloat16_$r.txt"
  DPKIT_BF16_AVX2=0 mpirun -x DPKIT_BF16_AVX2 -np 2 $B -d bfloat16 > "$OUT/bfloat16_portable_$r.txt"
  mpirun -np 2 $B -d half > "$OUT/half_$r.txt"
done
# one more of each with the floor measured by the run's own ranks
for d in float bfloat16 half; do mpirun -np 2 $B -d $d --floor > "$OUT/floor_$d.txt"; done
