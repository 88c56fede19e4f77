#!/bin/bash
# 20 fresh allreduce_perf processes at 256 MiB, np 2, from the repository
# root, alternating host buffers registered with dpkit::register_memory and
# the same host buffers unregistered (MEMORY=registered or host alone with
# ONLY=1); one line per process: memory, index, out-of-place and in-place time (us).
. scripts/env.sh
for i in $(seq 1 20); do
  for m in ${MEMORY:-registered host}; do
    mpirun -np 2 build/benchmarks/allreduce_perf -b 256M -e 256M -n 10 -w 2 --memory "$m" 2>&1 |
      awk -v i="$i" -v m="$m" '/^ +268435456/ {print m, i, $6, $10}'
  done
done
