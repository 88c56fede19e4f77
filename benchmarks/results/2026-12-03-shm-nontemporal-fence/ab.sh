#!/usr/bin/env bash
# The A/B of 2026-12-03-shm-nontemporal-fence.md, as run. Two builds of
# build/benchmarks/allreduce_perf (release, GCC 12), copied to /tmp/nt:
#   old_perf: commit 8af45f9 (non-temporal output fenced after every 16 KiB block)
#   new_perf: 8af45f9 plus the change (one fence per chunk), default still "never"
# Variants: ord = new_perf with DPKIT_SHM_NT_BYTES=0 (ordinary stores),
#           old = old_perf with DPKIT_SHM_NT_BYTES=1, new = new_perf with =1.
# Runs a, b, c, d: ROUNDS=3; VARIANTS="ord new" ROUNDS=6 B=16M E=256M;
# VARIANTS="ord new" ROUNDS=8 B=16M E=256M; VARIANTS="ord new" ROUNDS=6 B=2M E=16M F=2.
# Tables: python3 parse.py DIR ord,new (time / floor per run, the floor
# measured in the same process by --floor).
set -u
out=${OUTDIR:-/tmp/nt/ab}; mkdir -p $out
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
for r in $(seq 1 ${ROUNDS:-4}); do
  for v in ${VARIANTS:-ord old new}; do
    case $v in
      ord) bin=/tmp/nt/new_perf; nt=0;;
      old) bin=/tmp/nt/old_perf; nt=1;;
      new) bin=/tmp/nt/new_perf; nt=1;;
    esac
    mpirun -np 2 -x DPKIT_SHM_NT_BYTES=$nt $bin -b ${B:-1M} -e ${E:-256M} -f ${F:-4} --floor > $out/${v}_$r.txt 2>&1
    echo "round $r $v rc=$?"
  done
done
