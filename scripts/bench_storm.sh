#!/usr/bin/env bash
# The retry-storm benchmark of push delivery (docs/PERFORMANCE.md, "Retry storm"): a fresh
# release server per case pushes two queues to two mock endpoints run by `redrive-bench
# --workload storm` (capacity 250 requests/s each; down for a while: connections refused,
# then 503): storm-on with the default protection, storm-off with breaker = false and
# retry_budget = 0 (plain exponential backoff with full jitter). Same run, same machine, side
# by side.
#
# The cases (CASES, default "60 30 15": the outage in seconds):
#   60  the design note's storm: 200 msg/s for 300 s, down after 30 s for 60 s (20 s refused)
#   30  issue 15's: 100 msg/s for 120 s, down after 30 s for 30 s (10 s refused)
#   15  100 msg/s for 100 s, down after 30 s for 15 s (5 s refused)
#
#   scripts/bench_storm.sh                       # the three cases, ~10 minutes
#   CASES=30 scripts/bench_storm.sh              # one of them
#   OUTAGE=45s REFUSED=15s RATE=150 ARRIVALS=150s scripts/bench_storm.sh   # a shape of your own
#   NODES=3 CASES=30 scripts/bench_storm.sh      # on a cluster of 3 nodes on PostgreSQL
#
# LOGS=DIR keeps each case's server logs in DIR/<outage>-<rate>/.
# STORE=postgres runs one node on PostgreSQL (a fresh schema per case) instead of the
# embedded store.
# NODES (default 1): with more than one, the cases run on that many nodes of one cluster on
# PostgreSQL (PG_URL, default postgres://root@127.0.0.1:5432/test; a fresh schema per case,
# dropped after), nodes on $PORT … $PORT+NODES-1: every node pushes, each within its share of
# the endpoint's limits, with one shared breaker; messages are published to the first node.
#
# Both queues retry as the design note's simulation does: 8 attempts, exponential from 1 s
# ×2 capped at 60 s, full jitter, max_age 15 m.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PORT:-7078}
ON=${ON:-127.0.0.1:18181}
OFF=${OFF:-127.0.0.1:18182}
CAPACITY=${CAPACITY:-250}
BEFORE=${BEFORE:-30s}
CASES=${CASES:-60 30 15}
NODES=${NODES:-1}
PG_URL=${PG_URL:-postgres://root@127.0.0.1:5432/test}
[[ $NODES =~ ^[1-9][0-9]*$ ]] || { echo "bad NODES $NODES: expected a node count" >&2; exit 2; }

# shellcheck source=bench_server.sh
source scripts/bench_server.sh

policy() {
  cat <<TOML
max_attempts = 8
backoff = "exponential"
initial_delay = "1s"
multiplier = 2.0
max_delay = "60s"
jitter = "full"
max_age = "15m"
TOML
}
cat >"$WORK/bench.toml" <<TOML
log = "warn"
[push]
allow_cidrs = ["127.0.0.1/32"]
[queues.storm-on]
delivery = "push"
[queues.storm-on.push]
url = "http://$ON/hook"
[queues.storm-on.retry]
$(policy)
[queues.storm-off]
delivery = "push"
[queues.storm-off.push]
url = "http://$OFF/hook"
breaker = false
retry_budget = 0
[queues.storm-off.retry]
$(policy)
TOML

# One case: rate, arrivals, outage, refused, then any extra bench flags.
run_case() {
  local rate=$1 arrivals=$2 outage=$3 refused=$4
  shift 4
  echo
  echo "== outage $outage ($refused refused), $rate msg/s for $arrivals =="
  if [ "$NODES" -gt 1 ] || [ "${STORE:-}" = postgres ]; then
    local schema="redrive_storm_bench_${outage%s}_$rate"
    PGOPTIONS="-c client_min_messages=warning" psql "$PG_URL" -XAtqc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
    EXTRA_NODES=$((NODES - 1)) start "$WORK/data-$outage-$rate" "$PG_URL" "$schema"
  else
    start "$WORK/data-$outage-$rate"
  fi
  local also=()
  for i in $(seq 1 $((NODES - 1))); do also+=(--also-server "http://127.0.0.1:$((PORT + i))"); done
  "$BENCH" --server "$SERVER" "${also[@]}" --workload storm --storm-on "$ON" --storm-off "$OFF" \
    --storm-rate "$rate" --storm-capacity "$CAPACITY" --storm-before "$BEFORE" \
    --storm-outage "$outage" --storm-refused "$refused" --storm-arrivals "$arrivals" \
    --timeout 20m "$@"
  stop
  if [ -n "${LOGS:-}" ]; then
    mkdir -p "$LOGS/$outage-$rate"
    cp "$WORK"/*.log "$LOGS/$outage-$rate/"
  fi
  if [ "$NODES" -gt 1 ] || [ "${STORE:-}" = postgres ]; then
    PGOPTIONS="-c client_min_messages=warning" psql "$PG_URL" -XAtqc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
  fi
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (+ uncommitted changes)')"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$NODES" -gt 1 ] || [ "${STORE:-}" = postgres ]; then echo "nodes: $NODES on $PG_URL"; else echo "nodes: 1, embedded store"; fi
if [ -n "${OUTAGE:-}" ]; then
  run_case "${RATE:-200}" "${ARRIVALS:-300s}" "$OUTAGE" "${REFUSED:-0s}" "$@"
else
  for c in $CASES; do
    case "$c" in
      60) run_case 200 300s 60s 20s "$@" ;;
      30) run_case 100 120s 30s 10s "$@" ;;
      15) run_case 100 100s 15s 5s "$@" ;;
      *) echo "unknown case $c (60, 30 or 15; or set OUTAGE, REFUSED, RATE, ARRIVALS)" >&2; exit 2 ;;
    esac
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  done
fi
