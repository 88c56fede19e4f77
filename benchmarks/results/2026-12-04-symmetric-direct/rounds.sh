#!/bin/bash
# The rounds of 2026-12-04-symmetric-direct.md, from the repository root after
# `ninja -C build benchmarks/allreduce_perf`: per round, allreduce_perf --floor
# at np 2 on private buffers (host, the two-shot), on symmetric memory with the
# default stores (direct; non-temporal out of place from 8 MiB), and on
# symmetric memory with ordinary stores only (DPKIT_SHM_NT_BYTES=0).
# Output: OUT/r<round>_<variant>.txt; tables: parse.py.
set -u
OUT=${OUT:-/tmp/symmetric-rounds}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
. scripts/env.sh
for i in $(seq 1 "$ROUNDS"); do
  for v in host sym symord; do
    case $v in
      host) env=""; mem=host ;;
      sym) env=""; mem=symmetric ;;
      symord) env="-x DPKIT_SHM_NT_BYTES=0"; mem=symmetric ;;
    esac
    timeout 600 mpirun -np 2 $env build/benchmarks/allreduce_perf -b 1M -e 256M -f 2 --floor --memory $mem -n 20 \
      > "$OUT/r${i}_${v}.txt" 2>&1
  done
done
