#!/usr/bin/env bash
# torch_ddp_perf: dpkit DDP vs PyTorch DDP (gloo) vs the per-parameter
# MPI_Allreduce of the official libtorch example vs one rank alone, in one
# run, with the same model, initial weights and per-rank batches.
# Needs a build with the torch feature (build/examples/torch_lm) and
# python3-torch at /usr/bin/python3. Extra arguments go to the driver, e.g.
#   benchmarks/torch_ddp_perf.sh --steps 40 --repeat 3 --bucket-cap-mb 1 --bucket-view
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
exec /usr/bin/python3 scripts/torch_ddp_reference.py bench "$@"
