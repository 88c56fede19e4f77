#!/bin/bash
# 20 fresh allreduce_perf processes at 256 MiB on symmetric memory, np 2, from
# the repository root; one line per process: out-of-place and in-place time (us).
. scripts/env.sh
for i in $(seq 1 20); do
  mpirun -np 2 build/benchmarks/allreduce_perf -b 256M -e 256M -n 10 -w 2 --memory symmetric 2>&1 |
    awk -v i="$i" '/^ +268435456/ {print i, $6, $10}'
done
