#!/usr/bin/env bash
# The RabbitMQ bridge beside seed 001's TTL + dead-letter ladder, same broker, same run
# (docs/PERFORMANCE.md, "Behind RabbitMQ"): a fresh release server with three bridges, and
# `redrive-bench --workload ladder` declaring the work queues, the ladder, and the consumers.
#
#   scripts/bench_bridge.sh                  # 20,000 messages
#   MESSAGES=5000 scripts/bench_bridge.sh
#
# Needs the local RabbitMQ (127.0.0.1:5672, guest/guest).
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PORT:-7079}
MESSAGES=${MESSAGES:-20000}
AMQP=${AMQP:-amqp://guest:guest@127.0.0.1:5672/%2f}

# shellcheck source=bench_server.sh
source scripts/bench_server.sh

bridge() { # name, delay
  cat <<TOML
[bridges.rabbitmq.$1]
url = "$AMQP"
intake_queue = "$1.intake"
queue = "$1"
dead_letter_exchange = "$1.dlx"
[queues.$1.retry]
backoff = "fixed"
initial_delay = "$2"
jitter = "none"
max_attempts = 5
TOML
}
{
  echo 'log = "warn"'
  bridge bench-ladder 1s
  bridge hol-slow 10s
  bridge hol-fast 100ms
} >"$WORK/bench.toml"

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"
echo "commit: $(git rev-parse --short HEAD)"
start "$WORK/data"
"$BENCH" --server "$SERVER" --workload ladder --amqp "$AMQP" --messages "$MESSAGES" "$@"
curl -s "$SERVER/v1/bridges"; echo
stop
