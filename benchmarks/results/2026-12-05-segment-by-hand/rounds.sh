#!/bin/bash
# ROUNDS rounds of: the hand-written all-reduces (segment_mimic oneshot, twoshot, direct, directw) and
# dpkit's allreduce_perf on host and registered buffers, at 1, 4, 16 and 64 MiB, np 2. From the repository root,
# with segment_mimic built at $MIMIC (g++ -O3 -std=c++20 -o /tmp/segment_mimic segment_mimic.cpp).
. scripts/env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
for r in $(seq 1 "${ROUNDS:-5}"); do
  echo "# round $r $(date -u +%H:%M:%S)"
  for s in 1 4 16 64; do
    reps=$(( s >= 16 ? 41 : 201 ))
    for a in oneshot twoshot direct directw; do timeout 120 "$MIMIC" "$s" "$a" "$reps"; done
  done
  for m in host registered; do
    echo "# allreduce_perf --memory $m"
    timeout 300 mpirun -np 2 build/benchmarks/allreduce_perf -b 1M -e 64M -f 4 -n 40 -w 5 --memory "$m" 2>&1 | grep -v '^#'
  done
done
