#!/bin/bash
# usage: deb.sh DIR ROUNDS [args]: Debian torch 1.13, env:// by hand (bound) against mpirun
cd "$(git rev-parse --show-toplevel)"
D=$1; R=$2; shift 2; mkdir -p $D/ranks
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
PY=build-python/venv/bin/python
for r in $(seq 1 $R); do
  P=$((29700 + r))
  for k in 1 0; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$P RANK=$k WORLD_SIZE=2 LOCAL_RANK=$k LOCAL_WORLD_SIZE=2 OMP_NUM_THREADS=1 \
      taskset -c $k $PY benchmarks/python/dist_allreduce_perf.py "$@" > $D/ranks/env$r.$k.txt 2>$D/ranks/env$r.$k.err &
  done
  wait; cp $D/ranks/env$r.0.txt $D/env$r.txt
  mpirun -np 2 -x OMP_NUM_THREADS=1 $PY benchmarks/python/dist_allreduce_perf.py "$@" > $D/mpirun$r.txt 2>$D/mpirun$r.err
done
