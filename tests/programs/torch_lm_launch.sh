#!/bin/sh
# torch_lm trains the same without mpirun: 5 steps on 2 ranks under mpirun
# (dpkit::mpi), then as 2 processes launched with --rendezvous --rank
# --world-size and with torch's env:// variables (dpkit::gloo_transport);
# the three loss logs ("step loss" lines, %.9g) must be byte for byte equal:
# same seed, same batches, and a sum of 2 floats is the same in any order.
# A rank that fails after connecting ends its peer at once. Every process
# runs under `timeout`.
# Usage: torch_lm_launch.sh MPIEXEC TORCH_LM CORPUS SPM WORKDIR
set -u
mpiexec=$1 torch_lm=$2 corpus=$3 spm=$4
dir=$5/torch-lm-launch
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
unset DPKIT_RENDEZVOUS DPKIT_RANK DPKIT_WORLD_SIZE MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
common="--spm $spm --seed 1234 --lr 0.001 --clip 1.0 --heads 4 --steps 5 --log-every 0"
base=$((20000 + $$ % 20000))
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# shellcheck disable=SC2086
timeout 300 "$mpiexec" -np 2 "$torch_lm" $common --corpus "$corpus" --loss-log mpi.txt > mpi.out 2>&1 || { bad "mpirun: exit $?"; cat mpi.out; }

# two_ranks NAME MODE PORT: torch_lm as 2 processes; MODE flags | env
two_ranks() {
  name=$1 mode=$2 port=$3
  for r in 0 1; do
    if [ "$mode" = flags ]; then
      # shellcheck disable=SC2086
      timeout 300 "$torch_lm" $common --corpus "$corpus" --loss-log "$name.$r.txt" --rendezvous "tcp://127.0.0.1:$port" --rank $r \
        --world-size 2 > "$name.$r.out" 2>&1 &
    else
      # shellcheck disable=SC2086
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 timeout 300 "$torch_lm" $common \
        --corpus "$corpus" --loss-log "$name.$r.txt" > "$name.$r.out" 2>&1 &
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

# rank 1 fails after connecting (its --corpus is missing): rank 1 names the
# file, rank 0 ends at once naming rank 1 (not at its deadline), both non-zero
port=$((base + 2))
for r in 0 1; do
  c=$corpus
  [ $r -eq 1 ] && c=missing.jsonl
  # shellcheck disable=SC2086
  DPKIT_TIMEOUT=200 timeout 60 "$torch_lm" $common --corpus "$c" --rendezvous "tcp://127.0.0.1:$port" --rank $r \
    --world-size 2 > "fail.$r.out" 2> "fail.$r.err" &
  eval "pid$r=\$!"
done
wait "$pid0"; rc0=$?
wait "$pid1"; rc1=$?
if [ $rc0 -eq 0 ] || [ $rc0 -eq 124 ] || [ $rc1 -eq 0 ] || [ $rc1 -eq 124 ]; then
  bad "rank-fails: exit statuses $rc0 $rc1 (expected errors, not 0 or 124: a timeout)"; cat fail.0.err fail.1.err
elif ! grep -Eq "^torch_lm: rank 1: .*missing\.jsonl" fail.1.err; then
  bad "rank-fails: rank 1 does not name its corpus:"; cat fail.1.err
elif ! grep -Eq "^torch_lm: rank 0: .*rank 1" fail.0.err; then
  bad "rank-fails: rank 0 does not name rank 1:"; cat fail.0.err
else
  echo "ok: rank-fails: $(head -n 1 fail.1.err)"
  echo "ok: rank-fails: $(head -n 1 fail.0.err)"
fi

cd / && rm -rf "$dir"
[ $fail -eq 0 ] && echo "OK: torch_lm without mpirun gives mpirun's losses"
exit $fail
