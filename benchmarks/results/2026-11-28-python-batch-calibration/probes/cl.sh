#!/bin/bash
# cl.sh DIR ROUNDS args: launch vs mpirun on the up cluster, nstat deltas per node
cd "$(git rev-parse --show-toplevel)"
D=$1; R=$2; shift 2; mkdir -p $D
ns() { for n in 0 1; do ip netns exec dpk-node$n nstat -a 2>/dev/null | awk -v n=$n '{print n":"$1, $2}'; done; }
for r in $(seq 1 $R); do
  ns > $D/ns.before; scripts/cluster.sh launch -n 2 bash -c 'exec taskset -c $LOCAL_RANK "$@"' _ build/benchmarks/allreduce_perf "$@" > $D/launch$r.txt 2>&1; ns > $D/ns.after
  join <(sort $D/ns.before) <(sort $D/ns.after) | awk '$3-$2>0{print $1, $3-$2}' > $D/launch$r.nstat
  ns > $D/ns.before; scripts/cluster.sh run -np 4 build/benchmarks/allreduce_perf "$@" > $D/mpirun$r.txt 2>&1; ns > $D/ns.after
  join <(sort $D/ns.before) <(sort $D/ns.after) | awk '$3-$2>0{print $1, $3-$2}' > $D/mpirun$r.nstat
done
