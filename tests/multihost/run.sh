#!/usr/bin/env bash
# tilegrad's torch.distributed paths across real hosts: each host is a network
# namespace with its own address, joined to the others by a veth pair on one
# bridge, so gloo's traffic crosses a network stack (and, with tc's tbf, a
# link of a given bandwidth) instead of loopback. One rank per host, started
# by torchrun with static rendezvous on the first host's address (rank =
# node rank, so a rank's host is known; c10d rendezvous numbers nodes by
# arrival). All traffic stays inside the namespaces.
#
#   bash tests/multihost/run.sh          the checks (CI; docs/RING.md, "Across hosts")
#   bash tests/multihost/run.sh bench --rates "none 1gbit 100mbit" --out DIR [--shape B,H,H_kv,S,D]
#                                        [--reps R]   (bench/multihost_ring_bench.py drives it)
#
# Exit 0: every check passed; 77: skipped, with "SKIP: <reason>" (not root,
# or namespaces / bridges / veths cannot be made here); anything else: a
# failure. Everything it made (namespaces, bridge, veths, processes, its
# temporary folder) goes on every exit path. Environment: PYTHON (default the
# repo's build-torch-venv), TORCHRUN (next to PYTHON), TILEGRAD_LIB (default
# build/libtilegrad.so), TG_MH_HOSTS (4), TG_MH_KEEP=1 keeps the folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
py=${PYTHON:-$repo/build-torch-venv/bin/python}
torchrun=${TORCHRUN:-$(dirname "$py")/torchrun}
export TILEGRAD_LIB=${TILEGRAD_LIB:-$repo/build/libtilegrad.so}
hosts=${TG_MH_HOSTS:-4}
mode=${1:-test}
[ $# -gt 0 ] && shift

skip() { echo "SKIP: tests/multihost: $*"; exit 77; }
fail() { echo "FAIL: tests/multihost: $*" >&2; exit 1; }

# Names carry this shell's pid and a per-set counter: two runs at once (or
# two sets of hosts in one run) never share a namespace, bridge or veth. The
# addresses may repeat between runs: a namespace sees only its own bridge.
id=$$ set_no=0
nses=() bridges=() veths=() pids=() work=""

cleanup() {
  local rc=$? ns p
  trap - EXIT INT TERM
  for ns in "${nses[@]}"; do      # every process left in our namespaces (ours)
    p=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$p" ] || kill -9 $p 2>/dev/null || true
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # a namespace outlives its name while its orphaned sockets retransmit to
  # a host whose link went down (minutes): its veths go by hand, now
  for p in "${veths[@]}"; do ip link del "$p" 2>/dev/null || true; done
  for ns in "${nses[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  for p in "${bridges[@]}"; do ip link del "$p" 2>/dev/null || true; done
  if [ -n "$work" ]; then
    if [ "${TG_MH_KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- can this machine make hosts? (a skip, never a silent pass)
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || skip "iproute2's ip is not installed"
probe=tgmh-$id-probe
if ! err=$(ip netns add "$probe" 2>&1); then skip "ip netns add failed: $err"; fi
nses+=("$probe")
if ! err=$(ip link add "tp${id}" type veth peer name eth0 netns "$probe" 2>&1); then
  skip "veth pairs cannot be made: $err"
fi
if ! err=$(ip link add "tpb${id}" type bridge 2>&1); then skip "bridges cannot be made: $err"; fi
ip link del "tpb${id}"; ip netns del "$probe"; nses=()
# what the ranks need is a failure, not a skip, when missing
[ -x "$py" ] || fail "no python at $py (PYTHON=)"
[ -x "$torchrun" ] || fail "no torchrun at $torchrun (TORCHRUN=)"
[ -f "$TILEGRAD_LIB" ] || fail "no library at $TILEGRAD_LIB (build it, or TILEGRAD_LIB=)"
work=$(mktemp -d "${TMPDIR:-/tmp}/tgmh.XXXXXX")
chmod 755 "$work"

# make_hosts RATE: a fresh set of $hosts namespaces on a new bridge; RATE
# "none" or a tc rate (100mbit, 1gbit) for every host's link (tbf on the
# egress of its veth: the bandwidth of what the host sends). Sets ns[], addr[].
make_hosts() {
  local rate=$1 i n
  set_no=$((set_no + 1))
  local br="tgb${id}x${set_no}"
  ip link add "$br" type bridge
  bridges+=("$br")
  ip link set "$br" up
  ns=() addr=()
  for ((i = 0; i < hosts; i++)); do
    n="tgmh-$id-$set_no-h$((i + 1))"
    ip netns add "$n"
    nses+=("$n")
    ip link add "tm${id}x${set_no}h$i" type veth peer name eth0 netns "$n"
    veths+=("tm${id}x${set_no}h$i")
    ip link set "tm${id}x${set_no}h$i" master "$br" up
    ip -n "$n" addr add "10.77.$set_no.$((i + 1))/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$n" link set lo up
    if [ "$rate" != none ]; then
      # burst: the issue's 32kbit at 100mbit; at 1gbit a 4 ms timer tick's
      # worth (4mbit): 512kbit held the link to 46 of its 125 MB/s here
      local burst=32kbit
      [ "$rate" = 1gbit ] && burst=4mbit
      ip netns exec "$n" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 400ms
    fi
    ns+=("$n") addr+=("10.77.$set_no.$((i + 1))")
  done
}

# launch NAME DEADLINE_S SUBCOMMAND [ARGS...]: one torchrun per host running
# worker.py SUBCOMMAND; waits for all (killing what is left at the deadline:
# rc 124) and sets rcs[] and took (seconds). Logs: $work/NAME.hI.log.
launch() {
  local name=$1 deadline=$2 i t0=$SECONDS left p
  shift 2
  local my=()
  for ((i = 0; i < hosts; i++)); do
    ip netns exec "${ns[i]}" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
      OMP_WAIT_POLICY=passive TG_MH_ADDRS="$(IFS=,; echo "${addr[*]}")" TG_MH_OUT="$work" \
      PYTHONUNBUFFERED=1 "$torchrun" --nnodes "$hosts" --nproc-per-node 1 --node-rank "$i" \
      --master-addr "${addr[0]}" --master-port 29400 --max-restarts 0 \
      tests/multihost/worker.py "$@" >"$work/$name.h$i.log" 2>&1 &
    my+=($!) pids+=($!)
  done
  while :; do
    left=0
    for p in "${my[@]}"; do kill -0 "$p" 2>/dev/null && left=$((left + 1)); done
    [ "$left" = 0 ] && break
    if [ $((SECONDS - t0)) -ge "$deadline" ]; then
      echo "$name: still running after $deadline s; killing it" >&2
      for i in "${ns[@]}"; do p=$(ip netns pids "$i"); [ -z "$p" ] || kill -9 $p 2>/dev/null || true; done
    fi
    sleep 0.2
  done
  rcs=()
  for ((i = 0; i < hosts; i++)); do
    if wait "${my[i]}"; then rcs+=(0); else rcs+=($?); fi
  done
  took=$((SECONDS - t0))
}

show_logs() {
  local f
  for f in "$work/$1".h*.log; do echo "---- $f (last 40 lines)"; tail -n 40 "$f"; done
}

# expect_ok NAME: every host's torchrun exited 0
expect_ok() {
  local r
  for r in "${rcs[@]}"; do
    [ "$r" = 0 ] || { show_logs "$1"; fail "$1: torchrun exit codes ${rcs[*]}"; }
  done
  echo "ok   $1 (${took} s): $(cat "$work/$1.result" 2>/dev/null || echo done)"
}

# expect_fault NAME KIND [ARGS...]: the fault's checks (worker.py
# check-fault), fed the exit codes
expect_fault() {
  local name=$1 kind=$2
  shift 2
  if ! TG_MH_ADDRS="$(IFS=,; echo "${addr[*]}")" "$py" tests/multihost/worker.py check-fault --name "$name" --kind "$kind" --out "$work" \
       --rcs "${rcs[*]}" "$@" >"$work/$name.check" 2>&1; then
    show_logs "$name"; cat "$work/$name.check"; fail "$name: the fault's checks failed"
  fi
  echo "ok   $name (${took} s): $(tail -n 1 "$work/$name.check")"
}

case "$mode" in
test)
  echo "tests/multihost: $hosts hosts (network namespaces on a bridge), one rank each; $py"
  make_hosts none
  launch ring 150 ring
  expect_ok ring
  launch ddp 150 ddp --steps 4 --ckpt-step 2
  expect_ok ddp
  make_hosts 100mbit                        # a fresh set of hosts, behind 100 Mbit/s links
  launch resume 150 resume --steps 4
  expect_ok resume
  make_hosts none
  launch kill 150 fault --kind kill
  expect_fault kill kill
  make_hosts none
  # DDP's all-reduce is gloo's, not tilegrad's: the process group's timeout
  # (worker.py's init_process_group reads this, as ring_attention does)
  export TILEGRAD_COLLECTIVE_TIMEOUT=10
  launch ddpkill 150 fault --kind ddpkill
  expect_fault ddpkill ddpkill --timeout "$TILEGRAD_COLLECTIVE_TIMEOUT"
  unset TILEGRAD_COLLECTIVE_TIMEOUT
  make_hosts none
  TG_LINKDOWN_TIMEOUT=5
  launch linkdown 150 fault --kind linkdown --timeout "$TG_LINKDOWN_TIMEOUT"
  expect_fault linkdown linkdown
  echo "tests/multihost: all passed"
  ;;
bench)
  rates="none 1gbit 100mbit" out="" extra=()
  while [ $# -gt 0 ]; do
    case "$1" in
    --rates) rates=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) extra+=("$1" "$2"); shift 2 ;;
    esac
  done
  [ -n "$out" ] || fail "bench needs --out DIR"
  mkdir -p "$out"
  for rate in $rates; do
    make_hosts "$rate"
    launch "bench-$rate" 590 bench --rate "$rate" "${extra[@]}"
    expect_ok "bench-$rate"
    cp "$work/bench-$rate.json" "$out/"
  done
  ;;
*) fail "unknown mode $mode (test or bench)" ;;
esac
