#!/usr/bin/env bash
# The retry-storm benchmark of push delivery (docs/PERFORMANCE.md, "Retry storm"): a fresh
# release server pushes two queues to two mock endpoints run by `redrive bench --workload
# storm` (capacity 250 requests/s each, down for 60 s: connections refused, then 503):
# storm-on with the default protection, storm-off with breaker = false and retry_budget = 0
# (plain exponential backoff with full jitter). Same run, same machine, side by side.
#
#   scripts/bench_storm.sh
#   ARRIVALS=120s OUTAGE=30s scripts/bench_storm.sh      # a shorter run
#
# Both queues retry as the design note's simulation does: 8 attempts, exponential from 1 s
# ×2 capped at 60 s, full jitter, max_age 15 m.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PORT:-7078}
ON=${ON:-127.0.0.1:18181}
OFF=${OFF:-127.0.0.1:18182}
RATE=${RATE:-200}
CAPACITY=${CAPACITY:-250}
BEFORE=${BEFORE:-30s}
OUTAGE=${OUTAGE:-60s}
REFUSED=${REFUSED:-20s}
ARRIVALS=${ARRIVALS:-300s}

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

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"
echo "commit: $(git rev-parse --short HEAD)"
start "$WORK/data"
"$BIN" bench --server "$SERVER" --workload storm --storm-on "$ON" --storm-off "$OFF" \
  --storm-rate "$RATE" --storm-capacity "$CAPACITY" --storm-before "$BEFORE" \
  --storm-outage "$OUTAGE" --storm-refused "$REFUSED" --storm-arrivals "$ARRIVALS" \
  --timeout 20m "$@"
stop
