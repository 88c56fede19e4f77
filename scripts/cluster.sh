#!/usr/bin/env bash
# An emulated cluster on one machine (docs/cluster.md): N "nodes", each a
# Linux network namespace with its own hostname (a UTS namespace) and a veth
# on one bridge, the links shaped by tc (netem delay and rate where the kernel
# has sch_netem, else tbf for the rate alone). Open MPI launches across them
# through a plm_rsh_agent that enters a node's namespaces, so it sees N hosts:
# tcp between nodes, vader and dpkit's shared memory within one.
#
#   scripts/cluster.sh up N [--delay 10us] [--rate 2gbit] [--slots S]
#   scripts/cluster.sh run [mpirun arguments...]     e.g. run -np 4 build/benchmarks/allreduce_perf -A all
#   scripts/cluster.sh exec NODE command...          a command inside node NODE (0..N-1)
#   scripts/cluster.sh launch [-n PER_NODE] [--port P] command...
#                                                    without MPI, as torchrun on every node:
#                                                    PER_NODE processes per node (default: the
#                                                    slots) with torch's env:// variables, the
#                                                    store on node 0 (MASTER_ADDR:P, default 29500)
#   scripts/cluster.sh status                        nodes, addresses, qdiscs, measured round trip
#   scripts/cluster.sh partition NODE... / heal      cut nodes off the bridge / reconnect them
#   scripts/cluster.sh down                          removes everything `up` made
#
# Needs root with CAP_NET_ADMIN (ip netns, ip link, tc); without it, it says
# so and exits 77 (the tests that use it then skip). It only ever touches what
# it made: namespaces, links and mounts named dpk-* (the prefix below),
# recorded in its state
# directory ($DPKIT_CLUSTER_DIR, default /run/dpkit-cluster), which `up`
# refuses to reuse while another cluster is up.
set -euo pipefail

# Names and addresses (a test runs its own cluster beside a user's by setting
# all three): DPKIT_CLUSTER_DIR, DPKIT_CLUSTER_PREFIX (dpk: namespaces
# dpk-node0.., links dpk-br0, dpk-v0..), DPKIT_CLUSTER_NET (10.77.0: a /24).
STATE=${DPKIT_CLUSTER_DIR:-/run/dpkit-cluster}
PFX=${DPKIT_CLUSTER_PREFIX:-dpk}
NET=${DPKIT_CLUSTER_NET:-10.77.0}
[[ "$PFX" =~ ^[a-z][a-z0-9]{0,5}$ ]] || { echo "cluster.sh: DPKIT_CLUSTER_PREFIX '$PFX': 1-6 lower-case letters or digits" >&2; exit 2; }
[[ "$NET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { echo "cluster.sh: DPKIT_CLUSTER_NET '$NET': expected three octets (10.77.0)" >&2; exit 2; }
BR=$PFX-br0
HOST_IP=$NET.254
SUBNET=$NET.0/24

die() { echo "cluster.sh: $*" >&2; exit 1; }
skip() { echo "cluster.sh: $*" >&2; exit 77; }
usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

node_name() { echo "$PFX-node$1"; }
node_ip() { echo "$NET.$(( $1 + 1 ))"; }
nodes() { cat "$STATE/nodes" 2>/dev/null || echo 0; }

can_netadmin() {
  [ "$(id -u)" -eq 0 ] || return 1
  command -v ip >/dev/null && command -v tc >/dev/null && command -v nsenter >/dev/null && command -v unshare >/dev/null || return 1
  ip netns add "$PFX-probe" 2>/dev/null || return 1
  ip netns del "$PFX-probe"
}

# Shaping of one link end: netem (delay and rate) when the kernel has it,
# else tbf (rate only; the delay is the stack's own, which status measures).
shape() { # shape <netns or ""> <dev> <delay> <rate>
  local ns=$1 dev=$2 delay=$3 rate=$4
  local run=()
  [ -n "$ns" ] && run=(ip netns exec "$ns")
  if "${run[@]}" tc qdisc replace dev "$dev" root netem delay "$delay" rate "$rate" limit 100000 2>/dev/null; then
    echo netem
    return
  fi
  # burst: at least one 64 KiB GSO segment plus 1 ms at the rate
  local bps bytes burst
  bps=$(rate_bytes_per_s "$rate")
  bytes=$(( bps / 1000 ))
  burst=$(( bytes > 131072 ? bytes : 131072 ))
  "${run[@]}" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
  echo tbf
}

rate_bytes_per_s() { # 2gbit, 500mbit, 10gbit -> bytes per second
  local r=${1,,}
  case "$r" in
  *gbit) echo $(( ${r%gbit} * 1000000000 / 8 )) ;;
  *mbit) echo $(( ${r%mbit} * 1000000 / 8 )) ;;
  *kbit) echo $(( ${r%kbit} * 1000 / 8 )) ;;
  *) die "rate '$1': expected a number followed by kbit, mbit or gbit" ;;
  esac
}

write_agent() {
  # Open MPI's rsh launcher runs: <agent> <host> <command words...>, as it
  # would run ssh; the agent enters that node's namespaces and runs the
  # command words in a shell, as sshd would.
  cat >"$STATE/agent" <<EOF
#!/usr/bin/env bash
# plm_rsh_agent of the emulated cluster (scripts/cluster.sh): runs a command
# on node \$1 by entering its network and UTS namespaces.
set -euo pipefail
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done   # ssh-style options, if any
host=\$1; shift
[ -e "/run/netns/\$host" ] && [ -e "$STATE/uts/\$host" ] || { echo "cluster agent: no node \$host" >&2; exit 255; }
exec nsenter --net="/run/netns/\$host" --uts="$STATE/uts/\$host" -- /bin/sh -c "\$*"
EOF
  chmod +x "$STATE/agent"
}

cmd_up() {
  local n=${1:-}
  shift || true
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up: expected a node count 1-200, got '${n}'"
  local delay=10us rate=2gbit slots=2
  while [ $# -gt 0 ]; do
    case "$1" in
    --delay) delay=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    *) die "up: unknown option '$1'" ;;
    esac
  done
  rate_bytes_per_s "$rate" >/dev/null
  can_netadmin || skip "needs root with CAP_NET_ADMIN (ip netns add failed): the emulated cluster cannot run here"
  if [ -e "$STATE/nodes" ]; then die "a cluster is up ($STATE); run 'scripts/cluster.sh down' first"; fi
  if [ -e "$STATE" ] && [ -n "$(ls -A "$STATE" 2>/dev/null)" ]; then
    die "$STATE exists and is not a cluster's state directory: refusing to use it (set DPKIT_CLUSTER_DIR)"
  fi
  for k in $(seq 0 $((n - 1))); do
    if [ -e "/run/netns/$(node_name "$k")" ]; then die "namespace $(node_name "$k") exists and is not ours"; fi
  done
  if ip link show "$BR" >/dev/null 2>&1; then die "link $BR exists and is not ours"; fi
  mkdir -p "$STATE/uts"
  : >"$STATE/made"   # what to undo, one line each, in order
  echo "$n" >"$STATE/nodes.pending"
  trap 'echo "cluster.sh: up failed; undoing" >&2; cmd_down >/dev/null 2>&1 || true' ERR
  ip link add "$BR" type bridge
  echo "link $BR" >>"$STATE/made"
  ip addr add "$HOST_IP/24" dev "$BR"
  ip link set "$BR" up
  local kind=""
  : >"$STATE/hostfile"
  for k in $(seq 0 $((n - 1))); do
    local name ip host_end
    name=$(node_name "$k")
    ip=$(node_ip "$k")
    host_end="$PFX-v$k"
    ip netns add "$name"
    echo "netns $name" >>"$STATE/made"
    touch "$STATE/uts/$name"
    unshare --uts="$STATE/uts/$name" hostname "$name"
    echo "uts $STATE/uts/$name" >>"$STATE/made"
    ip link add "$host_end" type veth peer name eth0 netns "$name"
    echo "link $host_end" >>"$STATE/made"
    ip link set "$host_end" master "$BR"
    ip link set "$host_end" up
    ip netns exec "$name" ip addr add "$ip/24" dev eth0
    ip netns exec "$name" ip link set eth0 up
    ip netns exec "$name" ip link set lo up
    # both directions shaped: the node's egress (eth0) and its ingress (the bridge port)
    kind=$(shape "$name" eth0 "$delay" "$rate")
    shape "" "$host_end" "$delay" "$rate" >/dev/null
    echo "$name slots=$slots" >>"$STATE/hostfile"
  done
  write_agent
  trap - ERR
  {
    echo "nodes=$n"
    echo "slots=$slots"
    echo "delay=$delay"
    echo "rate=$rate"
    echo "qdisc=$kind"
  } >"$STATE/config"
  mv "$STATE/nodes.pending" "$STATE/nodes"
  echo "cluster.sh: $n nodes up ($(node_name 0)..$(node_name $((n - 1))), $NET.1-$NET.$n, $slots slots each), links $rate each way,"
  if [ "$kind" = netem ]; then
    echo "cluster.sh: netem delay $delay per direction"
  else
    echo "cluster.sh: this kernel has no sch_netem: rate by tbf, delay is the veth stack's own (measured below; --delay ignored)"
  fi
  rtt_line
}

rtt_line() {
  local n
  n=$(nodes)
  [ "$n" -ge 2 ] || return 0
  if command -v ping >/dev/null; then
    local out
    out=$(ip netns exec "$(node_name 0)" ping -q -c 20 -i 0.01 "$(node_ip 1)" 2>&1 | tail -1 || true)
    echo "cluster.sh: round trip node0 -> node1: $out"
  fi
}

cmd_down() {
  [ -e "$STATE/made" ] || { echo "cluster.sh: no cluster is up"; return 0; }
  # undo in reverse order, only what `up` recorded
  tac "$STATE/made" | while read -r kind what; do
    case "$kind" in
    netns) ip netns del "$what" 2>/dev/null || true ;;
    uts) umount "$what" 2>/dev/null || true; rm -f "$what" ;;
    link) ip link del "$what" 2>/dev/null || true ;;
    esac
  done
  rm -f "$STATE/made" "$STATE/nodes" "$STATE/nodes.pending" "$STATE/hostfile" "$STATE/agent" "$STATE/config" \
        "$STATE/partitioned"
  rmdir "$STATE/uts" 2>/dev/null || true
  rmdir "$STATE" 2>/dev/null || true
  echo "cluster.sh: down"
}

need_up() { [ -e "$STATE/nodes" ] || die "no cluster is up (scripts/cluster.sh up N)"; }

cmd_run() {
  need_up
  local here
  here=$(cd "$(dirname "$0")/.." && pwd)
  # Open MPI as root, tcp between nodes (on the cluster's subnet only), vader
  # and dpkit's shared memory within one; the agent launches the daemons.
  # Every node's ranks share this machine's cores, which Open MPI cannot see
  # (each host has its own slots): waiting ranks yield the core
  # (mpi_yield_when_idle), or a spinning rank keeps the one it waits for off
  # the CPU for a scheduler tick (~1 ms per message instead of ~30 us).
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  unset OMPI_MCA_btl
  local fwd=()
  for v in $(env | sed -n 's/^\(DPKIT_[A-Z_0-9]*\)=.*/\1/p'); do fwd+=(-x "$v"); done
  exec mpirun --hostfile "$STATE/hostfile" \
    --mca plm_rsh_agent "$STATE/agent" \
    --mca btl self,vader,tcp --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET" \
    --mca pml ob1 --mca mpi_yield_when_idle 1 \
    -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "${fwd[@]}" \
    --wdir "$PWD" "$@"
}

cmd_exec() {
  need_up
  local k=${1:-}
  shift || true
  [[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -lt "$(nodes)" ] || die "exec: expected a node 0-$(( $(nodes) - 1 )), got '$k'"
  [ $# -gt 0 ] || die "exec: no command"
  exec nsenter --net="/run/netns/$(node_name "$k")" --uts="$STATE/uts/$(node_name "$k")" -- "$@"
}

# Launches a job without MPI, as `torchrun --nnodes N --nproc-per-node K`
# would on every node: K processes inside each node's namespaces with
# MASTER_ADDR (node 0's address: the store rank 0 serves), MASTER_PORT,
# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GLOO_SOCKET_IFNAME=eth0
# (Gloo's pairs on the cluster's link) and OMPI_MCA_mpi_yield_when_idle=1
# (the nodes share the machine's cores, as for run); the rest of the environment is
# passed as it is. Waits for every process; exits with the first non-zero
# status (0 when all succeeded).
cmd_launch() {
  need_up
  local per
  per=$(sed -n 's/^slots=//p' "$STATE/config")
  local port=29500
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) per=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [[ "$per" =~ ^[1-9][0-9]*$ ]] || die "launch: -n expects a process count >= 1, got '$per'"
  [[ "$port" =~ ^[1-9][0-9]*$ ]] && [ "$port" -le 65535 ] || die "launch: --port expects 1-65535, got '$port'"
  [ $# -gt 0 ] || die "launch: no command"
  local n world pids=() k l rc=0
  n=$(nodes)
  world=$((n * per))
  # The nodes share this machine's cores: tell the ranks, as run tells
  # mpirun (dpkit's shared-memory waits and ring sizes read the same
  # setting, whatever the launcher); a value already set is kept.
  local yield=${OMPI_MCA_mpi_yield_when_idle:-1}
  for k in $(seq 0 $((n - 1))); do
    for l in $(seq 0 $((per - 1))); do
      MASTER_ADDR=$(node_ip 0) MASTER_PORT=$port RANK=$((k * per + l)) WORLD_SIZE=$world LOCAL_RANK=$l \
        LOCAL_WORLD_SIZE=$per GLOO_SOCKET_IFNAME=eth0 OMPI_MCA_mpi_yield_when_idle=$yield \
        nsenter --net="/run/netns/$(node_name "$k")" --uts="$STATE/uts/$(node_name "$k")" -- "$@" &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do
    wait "$p" || { local s=$?; [ "$rc" = 0 ] && rc=$s; }
  done
  return "$rc"
}

cmd_status() {
  need_up
  cat "$STATE/config"
  for k in $(seq 0 $(( $(nodes) - 1 ))); do
    local name
    name=$(node_name "$k")
    echo "$name $(node_ip "$k") $(nsenter --uts="$STATE/uts/$name" hostname) qdisc: $(ip netns exec "$name" tc qdisc show dev eth0 | head -1)"
  done
  [ -e "$STATE/partitioned" ] && echo "partitioned: $(cat "$STATE/partitioned")"
  rtt_line
}

# Cuts nodes off the bridge (their link goes down; the rest stay connected),
# as a switch port or a cable failing would; heal brings them back.
cmd_partition() {
  need_up
  [ $# -gt 0 ] || die "partition: name the nodes to cut off"
  for k in "$@"; do
    [[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -lt "$(nodes)" ] || die "partition: no node '$k'"
    ip link set "$PFX-v$k" down
    echo "$k" >>"$STATE/partitioned"
  done
  echo "cluster.sh: cut off node(s) $*"
}
cmd_heal() {
  need_up
  [ -e "$STATE/partitioned" ] || { echo "cluster.sh: nothing is cut off"; return 0; }
  while read -r k; do ip link set "$PFX-v$k" up; done <"$STATE/partitioned"
  rm -f "$STATE/partitioned"
  echo "cluster.sh: healed"
}

case "${1:-}" in
up) shift; cmd_up "$@" ;;
down) shift; cmd_down ;;
run) shift; cmd_run "$@" ;;
exec) shift; cmd_exec "$@" ;;
launch) shift; cmd_launch "$@" ;;
status) shift; cmd_status ;;
partition) shift; cmd_partition "$@" ;;
heal) shift; cmd_heal ;;
-h|--help|help) usage 0 ;;
*) usage ;;
esac
