#!/usr/bin/env bash
# Runs the benchmarks whose figures BENCHMARKS.md reports and writes, into one output
# directory, each run's human report (NAME.txt), JSON report (NAME.json), the logs of every
# process it started (logs/NAME/) and SVG charts per group (GROUP-*.svg). About 13 minutes on
# 2 cores after the release build (each run waits up to QUIET_MAX seconds for a quiet machine
# first, which adds to that on a busy one).
#
#   scripts/bench-all.sh [OUT_DIR]          # default: bench-results/<UTC time>
#
# Groups (BENCH_GROUPS="a b c d" by default; set a subset to run only those):
#   a  issue 14 item 4: token streams (100 chunks x 10 ms) at c=256 and c=1024, nats vs embedded;
#      zero-delay closed loop c=32; submit latency at c=1; JetStream messages per 7-event
#      execution (3-chunk zero-delay mock, c=1); then `bench targets` prints the verdict on each
#      target into OUT/a-targets.md. A_ROUNDS=N (default 1) runs the group N times, round r
#      into OUT/a-rR/, and the verdict also counts the rounds that met each target (this class
#      of machine changes speed within a session: one run is not a verdict)
#   b  issue 12 item 6: 3-node R3 cluster vs one node R1 (closed loop c=32, exec/s, submit
#      p50/p99); worker scaling 1 -> 2 -> 4 processes on the cluster
#   c  JetStream sync_interval: server default vs `always`, one node R1 and 3-node R3
#   d  issue 13: telemetry cost, embedded closed loop c=32: no trace export, export to a
#      collector that keeps up (bench otlp-sink), collector down (closed port); ROUNDS rounds,
#      alternating. BASELINE_GATEWAY=/path/to/gateway adds the same runs of another build (e.g.
#      one from before the telemetry work) for the metrics cost. Then, for the collector-down
#      target, open loop at OPEN_RATE executions/s (default 1500), export off vs collector down.
#   s  issue 31: scaling. Throughput and latency against worker processes (1 2 4 8), partitions
#      (1 4 8, MODEL_RUNTIME_PARTITIONS), gateways (1 2) and NATS nodes (1, 3 with R3), for a CPU-light workload
#      (zero-delay mock, c=256) and an I/O-bound one (3 chunks x 50 ms, 128 provider slots per
#      worker process, c=128 per worker). Each report says the machine's cores and the cores
#      each process used; `bench scaling` puts them in one table (s-scaling.md: throughput, its
#      ratio to one worker, latencies, cores) and charts throughput against each setting
#      (s-scaling-workers.svg, -partitions, -gateways, -nodes). Meant for a machine with many
#      cores: on 2 cores every row measures the same saturated CPU. S_WORKERS, S_PARTITIONS
#      override the lists.
#   t  issue 31 item 5: the runs its 16-core targets are judged by, most important first (group
#      s's headline rows, 4,096 token streams with 4 workers, the I/O-bound workers 1/2/4, a 3-node
#      R3 cluster, embedded; then, not targets, 8 workers with cores/8 runtime threads each and
#      the token streams' 4 workers with cores/4),
#      so that a run cut short by a time limit still has the first
#      (scripts/bench-device.sh); t-scaling.md tables them as group s's, and `bench targets
#      --issue 31` gives the verdict on each target into t-targets.md
#   p  issue 31 item 3: group t's zero-delay runs (8 and 1 partitions; 8 again with nats-server's
#      subscription match cache off) and its 4,096 token streams again, profiled (bench
#      --profile-dir OUT/profiles/LABEL; scripts/pack-profiling.sh makes a device pack able to)
#
# Environment: SKIP_BUILD=1 uses the binaries as they are; BIN_DIR (gateway and worker, default
# ${CARGO_TARGET_DIR:-target}/release); BENCH_BIN (default $BIN_DIR/bench); DURATION (measured seconds of most runs, default 20);
# SHORT (measured seconds of the c=1 and telemetry rounds, default 10); ROUNDS (group d,
# default 3); QUIET_MAX (seconds to wait for a quiet machine before each run, default 30; 0:
# no wait). Settings of the spawned gateways and workers pass through the environment, e.g.
# MODEL_RUNTIME_APPEND_PACE_MS=40 for a fixed pace of output appends (BENCHMARKS.md, "Fixed pace")
# or =0 for none (the workers' default, `auto`, paces only while appends are slow: "Adaptive pace").
#
# Before/after: run this script on both builds into two directories, then
#   bench plot --before OLD/a-nats-c256.json --after NEW/a-nats-c256.json ... --out DIR
# (see BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-bench-results/$(date -u +%Y%m%dT%H%M%SZ)}
GROUPS_TO_RUN=${BENCH_GROUPS:-a b c d}
S_WORKERS=${S_WORKERS:-1 2 4 8}
S_PARTITIONS=${S_PARTITIONS:-1 4 8}
DURATION=${DURATION:-20}
SHORT=${SHORT:-10}
ROUNDS=${ROUNDS:-3}
OPEN_RATE=${OPEN_RATE:-1500}
QUIET_MAX=${QUIET_MAX:-30}
A_ROUNDS=${A_ROUNDS:-1}
RUN_OUT=$OUT

# shellcheck source=scripts/lib/servers.sh
. scripts/lib/servers.sh
ensure_nats_server
ensure_redis_server

if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release -p gateway -p worker -p bench
fi
BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
BENCH=${BENCH_BIN:-$BIN_DIR/bench}
GATEWAY=$BIN_DIR/gateway
WORKER=$BIN_DIR/worker
for bin in "$BENCH" "$GATEWAY" "$WORKER"; do
  [ -x "$bin" ] || { echo "missing $bin (build it, or set BIN_DIR)" >&2; exit 1; }
done
mkdir -p "$OUT/logs"

# Busy CPU ticks and total ticks of the whole machine (first line of /proc/stat).
cpu_ticks() {
  awk '/^cpu /{busy=$2+$3+$4+$7+$8+$9; print busy, busy+$5+$6}' /proc/stat
}

# Waits (at most QUIET_MAX s) until the machine used under 0.25 cores over 5 s; logs the wait.
wait_quiet() {
  local waited=0 b0 t0 b1 t1 cores
  [ "$QUIET_MAX" -gt 0 ] || return 0
  cores=$(nproc)
  while :; do
    read -r b0 t0 < <(cpu_ticks)
    sleep 5
    read -r b1 t1 < <(cpu_ticks)
    waited=$((waited + 5))
    # busy share of all cores over the interval, times the core count: cores in use (x100).
    local used=$(( (b1 - b0) * 100 * cores / (t1 - t0 > 0 ? t1 - t0 : 1) ))
    echo "$(date -u +%T) quiet check: $used/100 cores busy" >> "$OUT/quiet.log"
    if [ "$used" -lt 25 ] || [ "$waited" -ge "$QUIET_MAX" ]; then
      return 0
    fi
  done
}

FAILED=()

# run LABEL BENCH-ARGS...: one spawned run; a failure is recorded and the series goes on.
run() {
  local label=$1
  shift
  wait_quiet
  echo "== $label: bench $*"
  mkdir -p "$RUN_OUT/logs/$label"
  if "$BENCH" --spawn --gateway-bin "$GATEWAY" --worker-bin "$WORKER" --label "$label" \
    --out "$RUN_OUT" --log-dir "$RUN_OUT/logs/$label" --quiet "$@" > "$RUN_OUT/$label.txt" 2>&1; then
    grep -E 'throughput:|terminal \(|JetStream:|added per delta|cores per process' "$RUN_OUT/$label.txt" || true
  else
    echo "   FAILED (see $RUN_OUT/$label.txt)"
    FAILED+=("$label")
  fi
}

# plot GROUP [DIR]: charts of every report of the group in DIR (default OUT), into
# DIR/GROUP-*.svg.
plot() {
  local group=$1 dir=${2:-$OUT} args=() f
  for f in "$dir/$group"-*.json; do
    [ -e "$f" ] && args+=(--run "$f")
  done
  if [ "${#args[@]}" -gt 0 ]; then
    "$BENCH" plot "${args[@]}" --out "$dir" --prefix "$group-" > /dev/null
  fi
}

# scaling GROUP: the table and charts of throughput against workers, partitions, gateways and
# NATS nodes of the group's reports in OUT (OUT/GROUP-scaling.md, OUT/GROUP-scaling-*.svg).
scaling() {
  "$BENCH" scaling "$OUT" --prefix "$1-" --out "$OUT" > /dev/null || FAILED+=("$1-scaling")
}

STREAM=(--mock-chunks 100 --mock-delay-ms 10)
T=(--duration "$DURATION")

for group in $GROUPS_TO_RUN; do
  case $group in
  a)
    a_dirs=()
    for round in $(seq "$A_ROUNDS"); do
      # One round writes into OUT; several into OUT/a-r1, OUT/a-r2, ... (one set of reports each).
      if [ "$A_ROUNDS" -gt 1 ]; then RUN_OUT=$OUT/a-r$round; else RUN_OUT=$OUT; fi
      mkdir -p "$RUN_OUT/logs"
      a_dirs+=("$RUN_OUT")
      for c in 256 1024; do
        # Every stream runs at once: provider and executing slots are sized to c. The clients'
        # starts are spread over one nominal execution (100 x 10 ms): started together, clients
        # whose executions take nearly the same time stay in step, and every cycle would begin
        # with all of them submitting at once (BENCHMARKS.md, "Clients in step").
        sized=(-c "$c" --provider-concurrency "$c" --exec-slots "$c" --warmup 3 --ramp-up 1 --timeout 60)
        run "a-embedded-c$c" --backend embedded "${sized[@]}" "${STREAM[@]}" "${T[@]}"
        run "a-nats-c$c" --backend nats "${sized[@]}" "${STREAM[@]}" "${T[@]}"
      done
      run a-nats-zero-c32 --backend nats -c 32 --warmup 2 "${T[@]}"
      run a-embedded-zero-c32 --backend embedded -c 32 --warmup 2 "${T[@]}"
      run a-nats-submit-c1 --backend nats --mode submit -c 1 --warmup 2 --duration "$SHORT" \
        --idempotency-prefix a7
      run a-nats-msgs-c1 --backend nats -c 1 --warmup 1 --duration "$SHORT"
      [ "$RUN_OUT" = "$OUT" ] || plot a "$RUN_OUT"
    done
    RUN_OUT=$OUT
    # The verdict on each target, per round (and how many rounds met it, with several).
    if ! "$BENCH" targets "${a_dirs[@]}" | tee "$OUT/a-targets.md"; then
      FAILED+=(a-targets)
    fi
    ;;
  b)
    for nodes in 1 3; do
      run "b-nats${nodes}r${nodes}-c32" --backend nats --nats-cluster "$nodes" --replicas "$nodes" \
        -c 32 --warmup 2 "${T[@]}" --idempotency-prefix "b$nodes"
    done
    for w in 1 2 4; do
      # Worker-bound: 8 executions per worker process, each 3 chunks x 50 ms (ideal 53/s each).
      run "b-scale-w$w" --backend nats --nats-cluster 3 --replicas 3 --worker-procs "$w" \
        --exec-slots 8 --mock-delay-ms 50 -c 64 --warmup 3 "${T[@]}"
    done
    ;;
  c)
    for nodes in 1 3; do
      for sync in default always; do
        sync_arg=()
        [ "$sync" = always ] && sync_arg=(--sync-interval always)
        run "c-nats${nodes}r${nodes}-sync-$sync-c32" --backend nats --nats-cluster "$nodes" \
          --replicas "$nodes" "${sync_arg[@]}" -c 32 --warmup 2 "${T[@]}" \
          --idempotency-prefix "c$nodes$sync"
      done
    done
    ;;
  d)
    "$BENCH" otlp-sink > "$OUT/otlp-sink.txt" 2>&1 &
    sink_pid=$!
    for _ in $(seq 50); do
      grep -q 'listening on' "$OUT/otlp-sink.txt" && break
      sleep 0.1
    done
    sink=$(sed -n 's/^otlp sink listening on //p' "$OUT/otlp-sink.txt")
    # A port nothing listens on: the collector is down.
    down=http://127.0.0.1:9
    for round in $(seq "$ROUNDS"); do
      run "d-off-r$round" --backend embedded -c 32 --warmup 2 --duration "$SHORT"
      OTEL_EXPORTER_OTLP_ENDPOINT=$sink run "d-export-r$round" --backend embedded -c 32 \
        --warmup 2 --duration "$SHORT"
      OTEL_EXPORTER_OTLP_ENDPOINT=$down run "d-down-r$round" --backend embedded -c 32 \
        --warmup 2 --duration "$SHORT"
      if [ -n "${BASELINE_GATEWAY:-}" ]; then
        GATEWAY_SAVED=$GATEWAY
        GATEWAY=$BASELINE_GATEWAY
        run "d-baseline-r$round" --backend embedded -c 32 --warmup 2 --duration "$SHORT"
        GATEWAY=$GATEWAY_SAVED
      fi
    done
    # The collector-down target is about submissions (p99 within 10% of no export): open loop
    # at a fixed arrival rate, so both variants do the same work and the percentiles measure the
    # path, not a saturated queue; rounds alternate.
    for round in $(seq "$ROUNDS"); do
      run "d-open-off-r$round" --backend embedded --mode open --rate "$OPEN_RATE" --warmup 2 \
        "${T[@]}"
      OTEL_EXPORTER_OTLP_ENDPOINT=$down run "d-open-down-r$round" --backend embedded --mode open \
        --rate "$OPEN_RATE" --warmup 2 "${T[@]}"
    done
    kill "$sink_pid" 2> /dev/null || true
    wait "$sink_pid" 2> /dev/null || true
    ;;
  s)
    for p in $S_PARTITIONS; do
      for w in $S_WORKERS; do
        # CPU-light: every execution is a few messages; the deployment's serial paths show.
        MODEL_RUNTIME_PARTITIONS=$p run "s-zero-p$p-w$w" --backend nats --worker-procs "$w" \
          -c 256 --provider-concurrency 256 --max-active-executions 100000 --warmup 3 \
          --ramp-up 1 "${T[@]}"
        # I/O-bound: 128 provider slots per worker process, enough clients to fill them all.
        MODEL_RUNTIME_PARTITIONS=$p run "s-io-p$p-w$w" --backend nats --worker-procs "$w" \
          -c $((128 * w)) --provider-concurrency 128 --mock-chunks 3 --mock-delay-ms 50 \
          --max-active-executions 100000 --warmup 3 --ramp-up 1 "${T[@]}"
      done
    done
    # Gateways: one against two (executions in turn), 4 workers, 8 partitions.
    for g in 1 2; do
      MODEL_RUNTIME_PARTITIONS=8 run "s-zero-g$g" --backend nats --gateways "$g" --worker-procs 4 \
        -c 256 --provider-concurrency 256 --max-active-executions 100000 --warmup 3 \
        --ramp-up 1 "${T[@]}"
    done
    # A 3-node R3 cluster with the partitions' leaders spread over the nodes, against one node.
    for nodes in 1 3; do
      MODEL_RUNTIME_PARTITIONS=8 run "s-zero-nodes$nodes" --backend nats --nats-cluster "$nodes" \
        --replicas "$nodes" --worker-procs 4 -c 256 --provider-concurrency 256 \
        --max-active-executions 100000 --warmup 3 --ramp-up 1 "${T[@]}"
    done
    plot s
    scaling s
    ;;
  t)
    zero=(-c 256 --provider-concurrency 256 --max-active-executions 100000 --warmup 3 --ramp-up 1
      "${T[@]}")
    tokens=(--worker-procs 4 -c 4096 --provider-concurrency 4096 --max-active-executions 100000
      --warmup 3 --ramp-up 1 --timeout 60 "${STREAM[@]}" "${T[@]}")
    # Each of N workers' share of the cores, in runtime threads (at least one).
    share() { local cores; cores=$(nproc); echo $(( cores >= $1 ? cores / $1 : 1 )); }
    # Zero-delay, c=256, one NATS server: >= 20,000 exec/s with 4 workers, 8 no slower than 4.
    MODEL_RUNTIME_PARTITIONS=1 run t-zero-p1-w4 --backend nats --worker-procs 4 "${zero[@]}"
    MODEL_RUNTIME_PARTITIONS=8 run t-zero-p8-w4 --backend nats --worker-procs 4 "${zero[@]}"
    MODEL_RUNTIME_PARTITIONS=8 run t-zero-p8-w8 --backend nats --worker-procs 8 "${zero[@]}"
    # 4,096 token streams (100 x 10 ms), 4 workers: 0 errors, terminal p99 <= 1.25 s,
    # first-delta p99 <= 50 ms.
    MODEL_RUNTIME_PARTITIONS=8 run t-tokens-c4096 --backend nats "${tokens[@]}"
    # I/O-bound (3 x 50 ms, 128 provider slots per worker): 1 -> 2 -> 4 workers >= 1.9x / 3.6x.
    for w in 1 2 4; do
      MODEL_RUNTIME_PARTITIONS=8 run "t-io-p8-w$w" --backend nats --worker-procs "$w" \
        -c $((128 * w)) --provider-concurrency 128 --mock-chunks 3 --mock-delay-ms 50 \
        --max-active-executions 100000 --warmup 3 --ramp-up 1 "${T[@]}"
    done
    # 3-node R3 cluster, partitions' leaders spread: at least t-zero-p8-w4, p99.9 <= 250 ms.
    MODEL_RUNTIME_PARTITIONS=8 run t-zero-r3-w4 --backend nats --nats-cluster 3 --replicas 3 \
      --worker-procs 4 "${zero[@]}"
    run t-embedded-c256 --backend embedded "${zero[@]}"
    # Not a target: t-zero-p8-w8 again with each worker's runtime held to its share of the
    # cores (TOKIO_WORKER_THREADS), against eight runtimes of a thread per core each.
    MODEL_RUNTIME_PARTITIONS=8 run t-zero-p8-w8-shared --backend nats --worker-procs 8 \
      --worker-threads "$(share 8)" "${zero[@]}"
    # Not a target either: t-tokens-c4096 with each of its 4 workers held to cores/4 threads
    # (on 2 cores, 1 thread each: fewer errors in 4 of 4 overloaded pairs; BENCHMARKS.md, Scaling).
    MODEL_RUNTIME_PARTITIONS=8 run t-tokens-c4096-shared --backend nats --worker-threads "$(share 4)" \
      "${tokens[@]}"
    scaling t
    # The verdict on each target (scripts/bench-device.sh judges again once its fairness run
    # has written OUT/fairness.json).
    if ! "$BENCH" targets --issue 31 "$OUT" | tee "$OUT/t-targets.md"; then
      FAILED+=(t-targets)
    fi
    ;;
  p)
    # Where the time goes in group t's headline runs (bench --profile-dir): nats-server's Go CPU
    # and block profiles, perf of the gateway and workers where perf runs, into
    # OUT/profiles/LABEL/. Profiling slows a run: compare its figures with group t's, not as targets.
    zero=(-c 256 --provider-concurrency 256 --max-active-executions 100000 --warmup 3 --ramp-up 1
      "${T[@]}")
    for p in 8 1; do
      MODEL_RUNTIME_PARTITIONS=$p run "p-zero-p$p-w4" --backend nats --worker-procs 4 \
        --profile-dir "$RUN_OUT/profiles/p-zero-p$p-w4" "${zero[@]}"
    done
    # The same with nats-server's subscription match cache off: the lock waits of its block
    # profile against p-zero-p8-w4's (BENCHMARKS.md, "The subscription match cache").
    MODEL_RUNTIME_PARTITIONS=8 run p-zero-p8-w4-no-sublist-cache --backend nats --worker-procs 4 \
      --nats-no-sublist-cache --profile-dir "$RUN_OUT/profiles/p-zero-p8-w4-no-sublist-cache" \
      "${zero[@]}"
    MODEL_RUNTIME_PARTITIONS=8 run p-tokens-c4096 --backend nats --worker-procs 4 -c 4096 \
      --provider-concurrency 4096 --max-active-executions 100000 --warmup 3 --ramp-up 1 \
      --timeout 60 --profile-dir "$RUN_OUT/profiles/p-tokens-c4096" "${STREAM[@]}" "${T[@]}"
    ;;
  *)
    echo "unknown group $group (a b c d p s t)" >&2
    exit 2
    ;;
  esac
  plot "$group"
done

echo "results in $OUT"
if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "failed runs: ${FAILED[*]}" >&2
  exit 1
fi
