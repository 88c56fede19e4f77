#!/usr/bin/env bash
# The main job: builds dpkit (release) in build/ and runs the nccl-tests-style
# all-reduce comparison of dpkit's ring, tree and auto against native
# MPI_Allreduce under mpirun with 2 ranks. Extra arguments replace the default
# flags. scripts/bench_native.sh adds native under coll/sm and prints one table.
#   scripts/bench.sh                       # -b 8 -e 256M -f 2 -A all -c 1
#   scripts/bench.sh -b 1M -e 64M -f 4 -A ring
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
. scripts/env.sh
[ -d build/meson-info ] || meson setup build --buildtype=release
ninja -C build benchmarks/allreduce_perf
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-b 8 -e 256M -f 2 -A all -c 1)
mpirun -np "${NP:-2}" build/benchmarks/allreduce_perf "${args[@]}"
