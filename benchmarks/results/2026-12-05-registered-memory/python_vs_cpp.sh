#!/bin/bash
# dist.all_reduce over "dpkit" (mpirun, 2 ranks, Debian torch 1.13 in
# build-python/venv) on unregistered and registered tensors (backends
# dpkit and dpkit_registered, alternated batch by batch) against the C++
# allreduce_perf in place on host and registered buffers, at 25 MiB and
# 256 MiB, alternated for ROUNDS rounds. From the repository root, after
# scripts/python_test.sh --install-only. Output: OUT/r<round>_<py|cpp>_<size>.txt
set -u
OUT=${OUT:-/tmp/pycpp}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
. scripts/env.sh
for i in $(seq 1 "$ROUNDS"); do
  for s in 26214400 268435456; do
    timeout 600 mpirun -np 2 build-python/venv/bin/python benchmarks/python/dist_collectives_perf.py -b "$s" -e "$s" \
      --ops all_reduce --backends dpkit,dpkit_registered --batches 9 > "$OUT/r${i}_py_$s.txt" 2>&1
    for m in host registered; do
      timeout 600 mpirun -np 2 build/benchmarks/allreduce_perf -b "$s" -e "$s" -n 20 -w 3 --memory "$m" \
        > "$OUT/r${i}_cpp_${m}_$s.txt" 2>&1
    done
  done
done
