#!/bin/bash
# libtorch DDP (examples/torch_lm, 2 ranks under mpirun, unbound as the
# torch_ddp_reference bench runs them) with the buckets in symmetric memory
# (ddp_options::symmetric_buckets, the default) and in private memory
# (--private-buckets), alternated, ROUNDS rounds. A model whose buckets reach
# the 25 MiB cap: 4 layers, d_model 512 (20 835 840 parameters, 79.5 MiB of
# float32 gradients: 3 buckets), batches of 256 tokens per rank (MAX_TOKENS).
# One JSON summary per run in $OUT.
#   OUT=/tmp/ddp ROUNDS=3 benchmarks/results/2026-12-04-direct-fused-nontemporal/ddp_rounds.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
. scripts/env.sh
OUT=${OUT:-/tmp/ddp_rounds}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for mem in symmetric private; do
    extra=()
    [ "$mem" = private ] && extra=(--private-buckets)
    mpirun -np 2 --bind-to none build/examples/torch_lm --corpus build/data/debian-descriptions.jsonl \
      --layers 4 --d-model 512 --heads 8 --max-tokens "${MAX_TOKENS:-256}" --steps "$STEPS" --warmup 2 --log-every 0 \
      --json "$OUT/$mem.$r.json" "${extra[@]}" > "$OUT/$mem.$r.log" 2>&1
    echo "round $r $mem: $(cat "$OUT/$mem.$r.json")"
  done
done
