#!/usr/bin/env bash
# Elastic training across the emulated cluster (docs/elastic.md): 3 nodes x
# 2 processes of `torch_lm --elastic redis://...` meet through a Redis server
# on the cluster's bridge (the host side, 10.77.0.254, reachable from every
# node like an external store). At step KILL_AT every process of node 2 is
# killed (SIGKILL: a node lost); at step RESTART_AT node 2 is started again
# with two new ids and rejoins. Then every log is checked
# (scripts/torch_elastic_check.py --check-only: identical parameters after
# every heal, no half-applied step, every sample id of the epoch exactly
# once) and the master's steps are summarized (step, generation, world size,
# loss, wall time).
#
#   scripts/elastic_cluster_demo.sh [WORKDIR]        (root with CAP_NET_ADMIN; exits 77 otherwise)
#   KILL_AT=20 RESTART_AT=40 scripts/elastic_cluster_demo.sh /tmp/elastic-demo
#   MODE=partition scripts/elastic_cluster_demo.sh /tmp/elastic-partition   # cut node 2 off instead
#   KILL_NODE=0 scripts/elastic_cluster_demo.sh /tmp/elastic-node0   # node 0 instead (ids 0, 1: the master)
#   PYTHON=build-python/venv/bin/python scripts/elastic_cluster_demo.sh /tmp/elastic-py
#       # the members are examples/python/train_elastic.py (dpkit.elastic) instead of torch_lm
#
# One epoch of the corpus's first 1500 lines (the check counts ids 0..1499).
#
# Needs build/examples/torch_lm built with the gloo feature, redis-server,
# and no cluster up (it brings one up and down).
set -euo pipefail
cd "$(dirname "$0")/.."
WD=$(realpath -m "${1:-/tmp/dpkit-elastic-demo}")
KILL_AT=${KILL_AT:-20}
RESTART_AT=${RESTART_AT:-40}
PORT=${PORT:-6399}
MODE=${MODE:-kill}   # kill: node 2's processes are killed; partition: node 2 is cut off the network
KILL_NODE=${KILL_NODE:-2}
PYTHON=${PYTHON:-}
[ -z "$PYTHON" ] || PYTHON=$(realpath -s "$PYTHON") # -s: a venv's python is a symbolic link
LM=$PWD/build/examples/torch_lm
CORPUS=$PWD/build/data/debian-descriptions.jsonl
SPM=$PWD/data/debian-bpe-8k.model
[ -n "$PYTHON" ] || [ -x "$LM" ] || { echo "elastic_cluster_demo: build $LM first (scripts/test.sh)" >&2; exit 1; }
[ -f "$CORPUS" ] || CORPUS=$PWD/data/debian-descriptions.jsonl
[ -f "$CORPUS" ] || { echo "elastic_cluster_demo: decompress the corpus first (xz -dk data/debian-descriptions.jsonl.xz)" >&2; exit 1; }
PATTERN="torch_lm --elastic"
[ -z "$PYTHON" ] || PATTERN="train_elastic.py --store"
command -v redis-server >/dev/null || { echo "elastic_cluster_demo: redis-server missing" >&2; exit 77; }
rm -rf "$WD"
mkdir -p "$WD/logs" "$WD/control" "$WD/out"
scripts/cluster.sh up 3 || exit $?
redis_pid=
cleanup() {
  for n in 0 1 2; do ip netns pids "dpk-node$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
  scripts/cluster.sh down >/dev/null 2>&1 || true
}
trap cleanup EXIT
redis-server --bind 10.77.0.254 --port "$PORT" --protected-mode no --save '' --appendonly no --daemonize no > "$WD/out/redis.txt" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do redis-cli -h 10.77.0.254 -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
URL=redis://10.77.0.254:$PORT/demo

start() { # start NODE ID
  local node=$1 id=$2
  # GLOO_SOCKET_IFNAME: Gloo listens on the node's eth0 (its host name does not resolve)
  if [ -n "$PYTHON" ]; then
    scripts/cluster.sh exec "$node" env GLOO_SOCKET_IFNAME=eth0 DPKIT_GLOO_HOSTNAME= "$PYTHON" "$PWD/examples/python/train_elastic.py" \
      --store "$URL" --id "$id" --first-size 6 --data "$CORPUS" --limit-samples 1500 --epochs 1 --threads 1 \
      --heartbeat 0.2 --dead-after 2 --sample-log "$WD/logs" --log-every 1 > "$WD/out/id$id.txt" 2>&1 &
    return
  fi
  scripts/cluster.sh exec "$node" env GLOO_SOCKET_IFNAME=eth0 "$LM" --elastic "$URL" --id "$id" --first-size 6 \
    --corpus "$CORPUS" --spm "$SPM" --layers 1 --d-model 64 --heads 2 --max-len 64 --max-tokens 128 \
    --limit-samples 1500 --epochs 1 --steps 100000 --threads 1 --heartbeat-ms 200 --dead-after-ms 2000 \
    --sample-log "$WD/logs" --control "$WD/control" --log-every 1 > "$WD/out/id$id.txt" 2>&1 &
}
master_step() { # the highest step the master printed
  grep -h "^step " "$WD"/out/id*.txt 2>/dev/null | awk '{print $2}' | sort -n | tail -1
}
wait_step() { # wait_step N TIMEOUT_S
  local t0=$SECONDS
  while [ "$(master_step || echo 0)" -lt "$1" ] 2>/dev/null || [ -z "$(master_step)" ]; do
    [ $(( SECONDS - t0 )) -lt "$2" ] || { echo "elastic_cluster_demo: step $1 not reached in $2 s" >&2; exit 1; }
    pgrep -f "$PATTERN" >/dev/null || { echo "elastic_cluster_demo: every member exited:" >&2; tail -n 3 "$WD"/out/id*.txt >&2; exit 1; }
    sleep 0.2
  done
}
t_start=$(date +%s.%N)
for node in 0 1 2; do start "$node" $(( 2 * node )); start "$node" $(( 2 * node + 1 )); done
wait_step "$KILL_AT" 600
t_kill=$(date +%s.%N)
if [ "$MODE" = partition ]; then
  echo "step $(master_step): cutting node 2 (ids 4, 5) off the network (scripts/cluster.sh partition 2)"
  scripts/cluster.sh partition 2
else
  echo "step $(master_step): killing every process of node $KILL_NODE (ids $(( 2 * KILL_NODE )), $(( 2 * KILL_NODE + 1 )))"
  ip netns pids "dpk-node$KILL_NODE" | xargs -r kill -9
fi
wait_step "$RESTART_AT" 600
t_restart=$(date +%s.%N)
if [ "$MODE" = partition ]; then
  # the minority side (2 of 6) must not have trained on its own: ids 4 and 5
  # applied no step after generation 0
  echo "step $(master_step): node 2's processes while cut off:"
  for id in 4 5; do
    alive=no; pgrep -f -- "--id $id " >/dev/null && alive=yes
    echo "  id $id: running=$alive; steps it applied after generation 0: $(awk '$2 == "A" && $3 != "0"' "$WD/logs/id$id.log" 2>/dev/null | wc -l); last output: $(tail -n 1 "$WD/out/id$id.txt")"
  done
  scripts/cluster.sh heal
  ip netns pids dpk-node2 | xargs -r kill -9 # what is left of them; node 2 starts again below
fi
RESTARTED=2
[ "$MODE" = partition ] || RESTARTED=$KILL_NODE
echo "step $(master_step): starting node $RESTARTED again (ids 6, 7)"
start "$RESTARTED" 6
start "$RESTARTED" 7
ok=1
for id in $(seq 0 5 | grep -vx "$(( 2 * RESTARTED ))" | grep -vx "$(( 2 * RESTARTED + 1 ))") 6 7; do
  # the survivors and the rejoined finish the run
  for _ in $(seq 3000); do grep -q "done: step" "$WD/out/id$id.txt" 2>/dev/null && break; sleep 0.2; done
  grep -q "done: step" "$WD/out/id$id.txt" || { echo "id $id did not finish" >&2; ok=0; }
done
t_end=$(date +%s.%N)
echo "== the master's steps (step, generation, world, loss, checksum) =="
grep -h "^step \|joined generation\|done:" "$WD"/out/id*.txt | sort -k2 -n | uniq > "$WD/steps.txt" || true
grep -h "^step " "$WD"/out/id*.txt | sort -k2 -n -u
echo "== heals (every member's checksum after each formation) =="
grep -h "joined generation" "$WD"/out/id*.txt
echo "== times (from the sample logs' wall times) =="
python3 - "$WD/logs" "$t_start" "$t_kill" "$t_restart" <<'PYEOF'
import os, statistics, sys
logs, t0, tk, tr = sys.argv[1], *(float(x) for x in sys.argv[2:])
A, J = [], []
for name in os.listdir(logs):
    for line in open(os.path.join(logs, name)):
        r = line.split()
        if len(r) > 2 and r[1] == "A":
            A.append((float(r[0]), int(r[2]), int(r[3])))      # time, generation, step
        elif len(r) > 3 and r[1] == "J":
            J.append((float(r[0]), int(r[2]), int(r[3])))      # time, generation, id
steps = {}
for t, g, s in A:                                           # a step's time: its last member's
    steps[s] = max(steps.get(s, 0.0), t)
order = sorted(steps.items())
before = [t for s, t in order if t < tk]
gaps = [b - a for a, b in zip(before, before[1:])]
step_s = statistics.median(gaps[len(gaps) // 2:]) if gaps else float("nan")
first = min(t for s, t in order)
last_before = max(before)
# the first step applied in a generation formed after the event (a step in
# flight that completed on some members right after it does not count)
later = {g for t, g, i in J if t > tk and g > 0}
after = min(t for t, g, s in A if g in later)
rejoin = min(t for t, g, i in J if i in (6, 7))
print(f"startup (launch of 6 processes -> first applied step): {first - t0:.2f} s")
print(f"median step before the kill (6 ranks): {step_s * 1000:.0f} ms")
print(f"kill -> first step applied without the killed node: {after - tk:.2f} s "
      f"(last step before the kill at -{tk - last_before:.2f} s; lost beyond one step: {after - last_before - step_s:.2f} s)")
print(f"restart of the node -> its processes healed into a generation: {rejoin - tr:.2f} s")
print(f"a restart of all processes from a checkpoint would cost the startup ({first - t0:.2f} s) plus the steps since "
      f"the checkpoint (half the interval on average: {25 * step_s:.2f} s for a checkpoint every 50 steps), plus the time to notice")
PYEOF
python3 scripts/torch_elastic_check.py --torch-lm "$LM" --corpus "$CORPUS" --spm "$SPM" --workdir "$WD" --check-only --external-failures
[ "$ok" = 1 ]
