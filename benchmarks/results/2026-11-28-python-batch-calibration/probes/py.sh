#!/bin/bash
# usage: py.sh DIR ROUNDS [extra args]
cd "$(git rev-parse --show-toplevel)"
D=$1; R=$2; shift 2; mkdir -p $D
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
V=/tmp/t2/venv/bin
for r in $(seq 1 $R); do
  OMP_NUM_THREADS=1 $V/torchrun --nproc-per-node 2 benchmarks/python/dist_allreduce_perf.py --bind "$@" > $D/torchrun$r.txt 2>$D/torchrun$r.err
  mpirun -np 2 -x OMP_NUM_THREADS=1 $V/python benchmarks/python/dist_allreduce_perf.py "$@" > $D/mpirun$r.txt 2>$D/mpirun$r.err
done
