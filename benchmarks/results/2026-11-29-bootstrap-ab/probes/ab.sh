#!/bin/bash
# usage: ab.sh DIR ROUNDS [args]: per round, one mpirun job with --backends dpkit,dpkit_store
# (MPI communicator against the store bootstrap, batch by batch in one run), then one env://
# job by hand with the same backends (both the store bootstrap: the in-process A/A).
# Debian torch 1.13 from build-python/venv (scripts/python_test.sh makes it).
cd "$(git rev-parse --show-toplevel)"
D=$1; R=$2; shift 2; mkdir -p $D/ranks
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
PY=build-python/venv/bin/python
B=benchmarks/python/dist_allreduce_perf.py
for r in $(seq 1 $R); do
  mpirun -np 2 -x OMP_NUM_THREADS=1 $PY $B --backends dpkit,dpkit_store "$@" > $D/mpirun$r.txt 2>$D/mpirun$r.err
  P=$((29800 + r))
  for k in 1 0; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$P RANK=$k WORLD_SIZE=2 LOCAL_RANK=$k LOCAL_WORLD_SIZE=2 OMP_NUM_THREADS=1 \
      taskset -c $k $PY $B --backends dpkit,dpkit_store "$@" > $D/ranks/env$r.$k.txt 2>$D/ranks/env$r.$k.err &
  done
  wait; cp $D/ranks/env$r.0.txt $D/env$r.txt
done
