#!/usr/bin/env bash
# Issue 31's many-core measurements in one call on a borrowed machine that has no Rust, NATS,
# Redis or package registry (the `device` tool's 16-core machine): pack here, run there.
#
#   ../shared/tools/pack-release.sh .pack && scripts/pack-profiling.sh .pack   # here; "/.pack/"
#                                                           # in .git/info/exclude
#   eval "$(bash .pack/unpack.sh)"; scripts/bench-device.sh "$OUT"      # there, carrying .pack
#
# Writes OUT/machine.txt (cores, CPU, memory), then runs scripts/bench-all.sh group t (the runs
# the targets are judged by, most important first), group p (the headline runs again, profiled
# into OUT/profiles/: read nats-server's with `go tool pprof -top FILE` here), the tenants'
# fairness run when python3 is there, then group s (the whole scaling matrix, partitions
# S_PARTITIONS, default "1 8") while time is left. Nothing starts after BUDGET seconds (default
# 500; one device call may run 600): the group under way is stopped and what it finished
# stays. OUT/summary.txt has each run's stack, throughput, latencies, cores per process and
# subscription-list lock takes, then the verdict on each target (`bench targets --issue 31`,
# t-targets.md) and group t's and group s's tables (`bench scaling`).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

OUT=${1:?usage: scripts/bench-device.sh OUT_DIR}
BUDGET=${BUDGET:-500}
PACK=${PACK:-.pack}
mkdir -p "$OUT"
started=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - started))); }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "cores: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo || true
  grep MemTotal /proc/meminfo || true
  uname -r
  "${MRT_NATS_SERVER:-nats-server}" --version 2>&1 || true
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

export SKIP_BUILD=1 BIN_DIR=${BIN_DIR:-$PACK/bin} QUIET_MAX=${QUIET_MAX:-0}
export DURATION=${DURATION:-10} S_PARTITIONS=${S_PARTITIONS:-1 8}

# group G: scripts/bench-all.sh group G into OUT, stopped when the budget runs out.
group() {
  local budget
  budget=$(left)
  if [ "$budget" -lt 30 ]; then
    echo "group $1 not started: $budget s left" >> "$OUT/summary.txt"
    return
  fi
  BENCH_GROUPS=$1 timeout --signal=INT --kill-after=10 "$budget" \
    scripts/bench-all.sh "$OUT" > "$OUT/group-$1.log" 2>&1
  echo "group $1: exit $? after $(($(date +%s) - started)) s" >> "$OUT/summary.txt"
}

# fairness: the tenants' fairness run (item 7's target) into OUT/fairness.json, about 40 s.
fairness() {
  if ! command -v python3 > /dev/null; then
    echo "fairness not run: no python3" >> "$OUT/summary.txt"
  elif [ "$(left)" -lt 60 ]; then
    echo "fairness not started: $(left) s left" >> "$OUT/summary.txt"
  else
    DURATION=20 timeout --kill-after=10 "$(left)" python3 scripts/bench-fairness.py nats \
      "$BIN_DIR/gateway" "$BIN_DIR/worker" > "$OUT/fairness.json" 2> "$OUT/fairness.log"
    echo "fairness: exit $? after $(($(date +%s) - started)) s" >> "$OUT/summary.txt"
  fi
}

# The targets first, then their profiles and the fairness target, then the matrix with what
# is left of the budget.
group t
group p
fairness
group s

for report in "$OUT"/[tps]-*.txt; do
  [ -e "$report" ] || continue
  echo "== $(basename "$report" .txt)"
  grep -E 'stack:|throughput:|ok .*failed|first delta|terminal \(|cores per process|subscription lists|bench: profile' "$report"
done >> "$OUT/summary.txt"
# The verdict on each target, the fairness run's included, first in the summary's tables.
bench=${BENCH_BIN:-$BIN_DIR/bench}
if [ -x "$bench" ]; then
  "$bench" targets --issue 31 "$OUT" > "$OUT/t-targets.md" 2>&1
fi
for table in "$OUT"/t-targets.md "$OUT"/[ts]-scaling.md; do
  [ -e "$table" ] && { echo "== $(basename "$table")"; cat "$table"; }
done >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
