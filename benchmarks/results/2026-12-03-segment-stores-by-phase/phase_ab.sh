#!/bin/bash
# seg_phase: g++ -std=c++20 -O2 -o /tmp/seg_phase benchmarks/results/2026-12-03-direct-reads-and-slow-phases/seg_phase.cpp
# build/benchmarks/allreduce_perf: the release build (scripts/test.sh or ninja -C build)
# A/B of DPKIT_SHM_SEG_NT=0/1, with seg_phase probes around each, N rounds
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
N=${1:-10}; shift; EXTRA="$@"
for i in $(seq $N); do
  for v in ${VARIANTS:-0 1}; do
    p1=$(/tmp/seg_phase 1 | awk '{print $3}')
    r=$(DPKIT_SHM_SEG_NT=$v mpirun -np 2 -x DPKIT_SHM_SEG_NT -x DPKIT_SHM_SEG_TUNE $EXTRA build/benchmarks/allreduce_perf -b 16M -e 256M -f 4 -c 0 -n 10 2>&1 | grep -E "^ +[0-9]+ " | awk '{printf "%s %s/%s ", $1/1048576"M", $6, $10}')
    p2=$(/tmp/seg_phase 1 | awk '{print $3}')
    echo "$(date +%T) v=$v probes $p1 $p2 | $r"
  done
done
