#!/bin/bash
# 20 fresh 2-rank processes per THP mode at 256 MiB, modes alternated
cd /work/main
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
out=/tmp/thp; rm -rf $out; mkdir -p $out
for i in $(seq 1 20); do
  for mode in madvise always; do
    echo $mode > /sys/kernel/mm/transparent_hugepage/enabled
    timeout 120 mpirun -np 2 build/benchmarks/allreduce_perf -b 256M -e 256M -n 20 -w 3 > $out/${mode}_$i.txt 2>&1
  done
done
echo madvise > /sys/kernel/mm/transparent_hugepage/enabled
