#!/bin/bash
# issue 53 part 3 after the segment-store tuner: dist.all_reduce vs C++ (25/256 MiB),
# and the libtorch DDP step with the old (9b4c5b9, before issue 53's path work) and the
# new torch_lm alternated.
set -u
cd /work/main; . scripts/env.sh
OUT=/tmp/part3/out; mkdir -p $OUT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
date -u > $OUT/date.txt
for R in 1 2; do for S in 25M 256M; do
  PYTHONPATH=/tmp/dpk /work/venv/bin/torchrun --nproc-per-node 2 benchmarks/python/dist_collectives_perf.py -b $S -e $S --ops all_reduce --bind > $OUT/big_py_${S}_$R.txt 2>&1
  for k in 0 1; do taskset -c $k build/benchmarks/allreduce_perf --rendezvous tcp://127.0.0.1:29611 --rank $k --world-size 2 -b $S -e $S -n 20 -w 3 > $OUT/big_cpp_${S}_${R}_r$k.txt 2>&1 & done; wait
done; done
for R in 1 2; do for V in old new; do
  tl=build/examples/torch_lm; [ $V = old ] && tl=/tmp/old9b/build/examples/torch_lm
  /usr/bin/python3 scripts/torch_ddp_reference.py bench --torch-lm $tl --steps 10 --warmup 2 --repeat 1 > $OUT/ddp_${V}_$R.txt 2>&1
done; done
date -u >> $OUT/date.txt
