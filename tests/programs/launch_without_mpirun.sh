#!/bin/sh
# The example programs run without mpirun (examples/launch_main.hpp): ddp_step
# as 2 processes over dpkit::gloo_transport, launched once with --rendezvous
# --rank --world-size and once with torch's env:// variables (MASTER_ADDR,
# MASTER_PORT, RANK, WORLD_SIZE), each checked against its own per-tensor
# all-reduce ("match", status 0 on both ranks). The unhappy path: a rank
# outside the world is refused naming the value; a rank whose peer never
# comes ends at DPKIT_TIMEOUT naming the missing rank; a rank that fails after
# connecting ends its peer at once (not at its deadline), each with the
# program, the rank and the message on stderr. Every process runs under
# `timeout`; no MPI launcher variables are set.
# Usage: launch_without_mpirun.sh DDP_STEP WORKDIR
set -u
ddp_step=$1
dir=$2/launch-without-mpirun
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMI_SIZE PMI_RANK PMIX_RANK MV2_COMM_WORLD_SIZE \
  DPKIT_RENDEZVOUS DPKIT_RANK DPKIT_WORLD_SIZE MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
# a small model (two linear layers), so the test takes seconds
printf '# name\tshape\tdtype\nl0.weight\t300x257\tfloat32\nl0.bias\t257\tfloat32\nl1.weight\t257x1001\tfloat32\nl1.bias\t1001\tfloat32\n' > tiny.tsv
# ports of their own for each run of this script (rank 0 serves the store)
base=$((20000 + $$ % 20000))
fail=0
say() { echo "$*"; }
bad() { say "FAIL: $*"; fail=1; }

# two_ranks NAME PORT MODE: ddp_step on 2 processes; MODE flags | env
two_ranks() {
  name=$1 port=$2 mode=$3
  for r in 0 1; do
    if [ "$mode" = flags ]; then
      timeout 60 "$ddp_step" tiny.tsv --steps 2 --rendezvous "tcp://127.0.0.1:$port" --rank $r --world-size 2 \
        > "$name.$r.out" 2> "$name.$r.err" &
    else
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 timeout 60 "$ddp_step" tiny.tsv --steps 2 \
        > "$name.$r.out" 2> "$name.$r.err" &
    fi
    eval "pid$r=\$!"
  done
  wait "$pid0"; rc0=$?
  wait "$pid1"; rc1=$?
  if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then
    bad "$name: exit statuses $rc0 $rc1 (124: still running after 60 s)"; cat "$name.0.err" "$name.1.err"
  elif ! grep -q "world size 2" "$name.0.out" || ! grep -q "^match" "$name.0.out"; then
    bad "$name: rank 0 did not report 'world size 2' and 'match':"; cat "$name.0.out"
  else
    say "ok: $name: 2 processes, $(grep '^match' "$name.0.out")"
  fi
}
two_ranks flags $base flags
two_ranks env $((base + 1)) env

# expect_error NAME PATTERN COMMAND...: fails (not by timeout) within 60 s,
# PATTERN (grep -E) on stderr
expect_error() {
  name=$1 pattern=$2
  shift 2
  timeout 60 "$@" > "$name.out" 2> "$name.err"
  rc=$?
  if [ $rc -eq 124 ]; then bad "$name: still running after 60 s"
  elif [ $rc -eq 0 ]; then bad "$name: succeeded"
  fi
  if grep -Eq "$pattern" "$name.err"; then say "ok: $name: $(head -n 1 "$name.err")"
  else bad "$name: no '$pattern' on stderr:"; cat "$name.err"
  fi
}
expect_error bad-rank "^ddp_step: launch: --rank='2' is out of range for world size 2" \
  "$ddp_step" tiny.tsv --rendezvous "tcp://127.0.0.1:$((base + 2))" --rank 2 --world-size 2
expect_error bad-env-rank "^ddp_step: launch: RANK='x' is not a non-negative integer" \
  env MASTER_ADDR=127.0.0.1 MASTER_PORT=$((base + 2)) RANK=x WORLD_SIZE=2 "$ddp_step" tiny.tsv
expect_error no-port "^ddp_step: launch: RANK='0' is given but no rendezvous: MASTER_PORT is not set" \
  env MASTER_ADDR=127.0.0.1 RANK=0 WORLD_SIZE=2 "$ddp_step" tiny.tsv
# rank 0 alone: its peer never arrives; DPKIT_TIMEOUT bounds the rendezvous
expect_error lone-rank "^ddp_step: rank 0: .*rank 1.*within the deadline" \
  env DPKIT_TIMEOUT=3 "$ddp_step" tiny.tsv --rendezvous "tcp://127.0.0.1:$((base + 3))" --rank 0 --world-size 2
# rank 1 fails after connecting (a missing model file): rank 0 ends at once
port=$((base + 4))
DPKIT_TIMEOUT=50 timeout 60 "$ddp_step" tiny.tsv --rendezvous "tcp://127.0.0.1:$port" --rank 0 --world-size 2 \
  > peer.0.out 2> peer.0.err &
pid0=$!
expect_error peer-fails "^ddp_step: rank 1: missing\.tsv" \
  env DPKIT_TIMEOUT=50 "$ddp_step" missing.tsv --rendezvous "tcp://127.0.0.1:$port" --rank 1 --world-size 2
start=$(date +%s)
wait "$pid0"; rc0=$?
if [ $rc0 -eq 0 ] || [ $rc0 -eq 124 ] || [ $(( $(date +%s) - start )) -ge 40 ]; then
  bad "peer-fails: rank 0 exited $rc0 after its peer failed (expected an error well before its deadline)"
elif grep -Eq "^ddp_step: rank 0: .*rank 1" peer.0.err; then say "ok: peer-fails: rank 0: $(head -n 1 peer.0.err)"
else bad "peer-fails: rank 0 does not name rank 1:"; cat peer.0.err
fi

cd / && rm -rf "$dir"
[ $fail -eq 0 ] && echo "OK: ddp_step runs without mpirun (flags, env://), and refuses bad launches"
exit $fail
