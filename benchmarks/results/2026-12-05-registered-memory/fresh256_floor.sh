#!/bin/bash
# 20 fresh allreduce_perf processes at 256 MiB on registered host buffers,
# np 2, each also measuring the memory floor (--floor) in the same process;
# one line per process: index, out-of-place and in-place time (us), floor (us),
# time/floor out of and in place. From the repository root.
. scripts/env.sh
for i in $(seq 1 20); do
  mpirun -np 2 build/benchmarks/allreduce_perf -b 256M -e 256M -n 10 -w 2 --floor --memory "${MEMORY:-registered}" 2>&1 |
    awk -v i="$i" '/^ +268435456/ {t = $6 " " $10} /#  floor/ {f = $5; r = $NF; o = $(NF-2)} END {print i, t, f, o, r}'
done
