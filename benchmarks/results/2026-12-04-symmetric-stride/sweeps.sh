#!/bin/bash
# The sweeps of 2026-12-04-symmetric-stride.md, from the repository root:
# allreduce_perf --floor on symmetric memory, np 2, up to 64, 128 and 256
# MiB (the largest size sets the regions' size, hence their distance), three
# rounds. Output: OUT/r<round>_e<max>.txt; tables:
# ../2026-12-04-symmetric-direct/parse.py "e64M=OUT/r*_e64M.txt" ...
set -u
OUT=${OUT:-/tmp/stride}
mkdir -p "$OUT"
. scripts/env.sh
for r in 1 2 3; do
  for e in 64M 128M 256M; do
    mpirun -np 2 build/benchmarks/allreduce_perf -b 1M -e $e -f 2 --floor --memory symmetric -n 20 > "$OUT/r${r}_e$e.txt" 2>&1
  done
done
