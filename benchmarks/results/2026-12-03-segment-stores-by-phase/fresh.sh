#!/bin/bash
# seg_phase: g++ -std=c++20 -O2 -o /tmp/seg_phase benchmarks/results/2026-12-03-direct-reads-and-slow-phases/seg_phase.cpp
# build/benchmarks/allreduce_perf: the release build (scripts/test.sh or ninja -C build)
# N fresh processes per variant at 256 MiB, alternating variants, a seg_phase probe before each
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
N=${1:-20}
for i in $(seq $N); do
  for v in auto 0; do
    p1=$(/tmp/seg_phase 1 | awk '{print $3}')
    r=$(DPKIT_SHM_SEG_NT=$v mpirun -np 2 -x DPKIT_SHM_SEG_NT build/benchmarks/allreduce_perf -b 256M -e 256M -c 0 2>&1 | grep -E "^ +[0-9]+ " | awk '{printf "%s/%s", $6, $10}')
    echo "$(date +%T) v=$v probe $p1 | $r"
  done
done
