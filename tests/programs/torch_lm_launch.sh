#!/bin/sh
# torch_lm trains the same without mpirun: 5 steps on 2 ranks under mpirun
# (dpkit::mpi), then as 2 processes launched with --rendezvous --rank
# --world-size and with torch's env:// variables (dpkit::gloo_transport);
# the three loss logs ("step loss" lines, %.9g) must be byte for byte equal:
# same seed, same batches, and a sum of 2 floats is the same in any order.
# Every process runs under `timeout`.
# Usage: torch_lm_launch.sh MPIEXEC TORCH_LM CORPUS SPM WORKDIR
set -u
mpiexec=$1 torch_lm=$2 corpus=$3 spm=$4
dir=$5/torch-lm-launch
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
unset DPKIT_RENDEZVOUS DPKIT_RANK DPKIT_WORLD_SIZE MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
common="--corpus $corpus --spm $spm --seed 1234 --lr 0.001 --clip 1.0 --heads 4 --steps 5 --log-every 0"
base=$((20000 + $$ % 20000))
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# shellcheck disable=SC2086
timeout 300 "$mpiexec" -np 2 "$torch_lm" $common --loss-log mpi.txt > mpi.out 2>&1 || { bad "mpirun: exit $?"; cat mpi.out; }

# two_ranks NAME MODE PORT: torch_lm as 2 processes; MODE flags | env
two_ranks() {
  name=$1 mode=$2 port=$3
  for r in 0 1; do
    if [ "$mode" = flags ]; then
      # shellcheck disable=SC2086
      timeout 300 "$torch_lm" $common --loss-log "$name.$r.txt" --rendezvous "tcp://127.0.0.1:$port" --rank $r \
        --world-size 2 > "$name.$r.out" 2>&1 &
    else
      # shellcheck disable=SC2086
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 timeout 300 "$torch_lm" $common \
        --loss-log "$name.$r.txt" > "$name.$r.out" 2>&1 &
    fi
    eval "pid$r=\$!"
  done
  wait "$pid0"; rc0=$?
  wait "$pid1"; rc1=$?
  if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then
    bad "$name: exit statuses $rc0 $rc1 (124: still running after 300 s)"; cat "$name.0.out" "$name.1.out"
  elif ! grep -q "2 ranks, ddp=dpkit" "$name.0.out"; then
    bad "$name: rank 0 did not train on 2 ranks:"; cat "$name.0.out"
  elif cmp -s mpi.txt "$name.0.txt" && [ "$(wc -l < mpi.txt)" -eq 5 ]; then
    echo "ok: $name: the 5 losses equal mpirun's bit for bit"
  else
    bad "$name: losses differ from mpirun's (mpirun | $name):"; paste mpi.txt "$name.0.txt"
  fi
}
two_ranks flags flags $base
two_ranks env env $((base + 1))

cd / && rm -rf "$dir"
[ $fail -eq 0 ] && echo "OK: torch_lm without mpirun gives mpirun's losses"
exit $fail
