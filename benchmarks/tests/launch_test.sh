#!/usr/bin/env bash
# allreduce_perf launched without mpirun: two processes meeting through a
# tcp:// store that rank 0 serves, once with --rendezvous/--rank/--world-size
# and once with torch's env:// variables (MASTER_ADDR, MASTER_PORT, RANK,
# WORLD_SIZE). Both ranks exit 0; rank 0 prints, for every algorithm of
# -A all, nine rows (8 B .. 512 KiB by 4) with #wrong 0 in both halves and
# the footer "Out of bounds values : 0 OK". Then the unhappy paths: -A native
# is a usage error naming MPI, a bad RANK an error naming it, and the flags
# under an MPI launcher's environment are refused. Each process runs under
# `timeout 60`.
#   launch_test.sh ALLREDUCE_PERF
set -uo pipefail
perf=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "launch_test: $*" >&2; exit 1; }
# No MPI launcher's variables, no launch variables of the caller's.
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_RANK MV2_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMI_RANK MV2_COMM_WORLD_RANK
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT LOCAL_RANK LOCAL_WORLD_SIZE DPKIT_RENDEZVOUS DPKIT_RANK DPKIT_WORLD_SIZE
sizes=(-b 8 -e 1M -f 4 -n 2 -w 1 -A all)

# check NAME: both ranks' exit codes and rank 0's tables
check() {
  local name=$1 rc0 rc1
  rc0=$(cat "$work/$name.rc0") rc1=$(cat "$work/$name.rc1")
  if [ "$rc0" != 0 ] || [ "$rc1" != 0 ]; then
    echo "--- rank 0:"; cat "$work/$name.0"; echo "--- rank 1:"; cat "$work/$name.1"
    fail "$name: exit codes $rc0 $rc1, expected 0 0"
  fi
  local out=$work/$name.0 algos oks rows bad
  algos=$(grep -c '^# Algorithm: ' "$out")
  oks=$(grep -c '^# Out of bounds values : 0 OK' "$out")
  [ "$algos" -ge 2 ] || { cat "$out"; fail "$name: $algos algorithm tables, expected ring, tree, ..."; }
  [ "$oks" = "$algos" ] || { cat "$out"; fail "$name: $oks of $algos tables end with 'Out of bounds values : 0 OK'"; }
  grep -q '^# Algorithm: native' "$out" && { cat "$out"; fail "$name: native measured without MPI"; }
  rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +float +sum ' "$out")
  [ "$rows" = $((9 * algos)) ] || { cat "$out"; fail "$name: $rows rows, expected $((9 * algos))"; }
  # #wrong: the 9th and 13th fields of a row (size count type redop root time algbw busbw #wrong, x2)
  bad=$(grep -E '^ +[0-9]+ +[0-9]+ +float +sum ' "$out" | awk '$9 != 0 || $13 != 0' | wc -l)
  [ "$bad" = 0 ] || { cat "$out"; fail "$name: $bad rows with #wrong != 0"; }
  grep -q 'over gloo' "$out" || { cat "$out"; fail "$name: the header does not say the gloo transport"; }
}

# run2 NAME CMD0 -- CMD1: both ranks at once, rank 1 first (it waits for rank 0's server)
run2() {
  local name=$1
  shift
  local -a c0=() c1=()
  while [ "$1" != -- ]; do c0+=("$1"); shift; done
  shift
  c1=("$@")
  (timeout 60 "${c1[@]}" >"$work/$name.1" 2>&1; echo $? >"$work/$name.rc1") &
  local p1=$!
  timeout 60 "${c0[@]}" >"$work/$name.0" 2>&1
  echo $? >"$work/$name.rc0"
  wait "$p1"
}

port=$((20000 + RANDOM % 20000))
url=tcp://127.0.0.1:$port
run2 flags "$perf" "${sizes[@]}" --rendezvous "$url" --rank 0 --world-size 2 -- \
  "$perf" "${sizes[@]}" --rendezvous "$url" --rank 1 --world-size 2
check flags

port=$((port + 1))
run2 env env MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 WORLD_SIZE=2 "$perf" "${sizes[@]}" -- \
  env MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=1 WORLD_SIZE=2 "$perf" "${sizes[@]}"
check env

# -A native: a usage error naming why (no MPI without mpirun), at once: rank 0
# alone, before it would wait for rank 1
port=$((port + 1))
url=tcp://127.0.0.1:$port
out=$(timeout 60 "$perf" -b 8 -e 8 -A native --rendezvous "$url" --rank 0 --world-size 2 -T 30 2>&1) &&
  fail "-A native without mpirun succeeded"
echo "$out" | grep -q 'native collectives: MPI.s need mpirun' || { echo "$out"; fail "-A native: no usage error naming mpirun"; }

# a bad RANK: an error naming the variable and its value, at once
out=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=two WORLD_SIZE=2 timeout 60 "$perf" -b 8 -e 8 2>&1) &&
  fail "RANK=two succeeded"
echo "$out" | grep -q "RANK='two'" || { echo "$out"; fail "RANK=two: the error does not name it"; }
# --rank out of range
out=$(timeout 60 "$perf" -b 8 -e 8 --rendezvous "$url" --rank 2 --world-size 2 2>&1) && fail "--rank 2 of 2 succeeded"
echo "$out" | grep -q "\-\-rank='2' is out of range" || { echo "$out"; fail "--rank 2: the error does not say it is out of range"; }
# the flags under an MPI launcher: refused
out=$(OMPI_COMM_WORLD_SIZE=2 timeout 60 "$perf" -b 8 -e 8 --rendezvous "$url" --rank 0 --world-size 2 2>&1) &&
  fail "the flags under mpirun's environment were accepted"
echo "$out" | grep -q "under mpirun" || { echo "$out"; fail "the flags under mpirun: the error does not say so"; }
echo "launch_test: ok"
