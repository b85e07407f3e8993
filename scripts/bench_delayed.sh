#!/usr/bin/env bash
# Delayed delivery lateness at a steady due rate, redrive on its embedded store and on
# PostgreSQL (a fresh schema per run), and RabbitMQ's TTL queues as the peer (`rabbitmq`:
# the same due times, short and long delays in two TTL queues each published in due order,
# dead-lettered into a work queue; see crates/redrive-bench/src/delayed_ttl.rs), interleaved
# rounds: `redrive-bench --workload delayed`
# publishes MESSAGES messages due over SPREAD (plus a 10 % tail of long delays), all before the
# first is due, and consumers long-poll and ack; lateness = received − due, first deliveries.
#
#   scripts/bench_delayed.sh                          # 1,000 due/s: 10,000 over 10 s, 3 rounds
#   MESSAGES=20000 SPREAD=10s scripts/bench_delayed.sh
#
# SYSTEMS  default "redrive redrive-pg rabbitmq"; AMQP_URL default amqp://guest:guest@127.0.0.1:5672/%2f; PG_URL default postgres://root@127.0.0.1:5432/test;
# CONNECTIONS (default 8, PUBLISHERS of them publish, default 2); ROUNDS default 3; PORT 7079.
# BASELINE_BIN=path/to/an/older/redrive adds the system `baseline` to SYSTEMS' choices: that
# binary on its embedded store, interleaved with the others (before and after in one window).
set -euo pipefail
cd "$(dirname "$0")/.."

MESSAGES=${MESSAGES:-10000}
SPREAD=${SPREAD:-10s}
SYSTEMS=${SYSTEMS:-"redrive redrive-pg rabbitmq"}
AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
PG_URL=${PG_URL:-postgres://root@127.0.0.1:5432/test}
CONNECTIONS=${CONNECTIONS:-8}
PUBLISHERS=${PUBLISHERS:-2}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-7079}

# shellcheck source=bench_server.sh
source scripts/bench_server.sh
pg() { PGOPTIONS="--client-min-messages=warning" psql "$PG_URL" -XAtqc "$1"; }

# The server's own view of the same lateness, taken by the store when it hands out the lease
# (redrive_delivery_lateness_seconds on /metrics; every lease of the run): what part of it is
# at most 1, 2, 5 and 10 ms late. The load generator's figure adds the lease's HTTP answer and
# the client's reading of it, on the same cores.
server_lateness() {
  curl -s "$SERVER/metrics" | awk '
    /^redrive_delivery_lateness_seconds_bucket/ {
      match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5); n[le] += $2
    }
    END {
      t = n["+Inf"]; if (t == 0) { print "server-side: no leases counted"; exit }
      printf "server-side at the lease: <= 1 ms %.2f %%, <= 2 ms %.2f %%, <= 5 ms %.2f %%, <= 10 ms %.2f %% of %d leases\n",
        100 * n["0.001"] / t, 100 * n["0.002"] / t, 100 * n["0.005"] / t, 100 * n["0.01"] / t, t
    }'
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with local changes)')"
echo "$MESSAGES messages due over $SPREAD (+10 % long delays), $CONNECTIONS connections ($PUBLISHERS publishing)"
echo
for round in $(seq 1 "$ROUNDS"); do
  for system in $SYSTEMS; do
    out="$WORK/$system-$round.json"
    schema="redrive_bench_delayed_$round"
    peer=()
    if [ "$system" = rabbitmq ]; then
      peer=(--ttl-queue --amqp "$AMQP_URL")
    elif [ "$system" = redrive-pg ]; then
      pg "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
      start "$WORK/data-unused" "$PG_URL" "$schema"
    elif [ "$system" = baseline ]; then
      start_baseline "$WORK/data-$round"
    else
      start "$WORK/data-$round"
    fi
    "$BENCH" --server "$SERVER" --workload delayed --messages "$MESSAGES" --spread "$SPREAD" \
      --connections "$CONNECTIONS" --publishers "$PUBLISHERS" "${peer[@]}" --json >"$out" 2>"$out.err" || true
    server_side=""
    if [ "$system" != rabbitmq ]; then
      server_side=$(server_lateness || true)
      stop
    fi
    if [ "$system" = redrive-pg ]; then pg "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null; fi
    rm -rf "$WORK/data-$round"
    if ! jq -e '.complete == true' "$out" >/dev/null 2>&1; then
      echo "round $round $system FAILED: $(tail -3 "$out.err" | tr '\n' ' ')"
      continue
    fi
    jq -r --arg s "$system" --arg r "$round" \
      '"round \($r) \($s | .+"          " | .[0:10]) lateness p50 \(.lateness.p50_ms) ms, p99 \(.lateness.p99_ms) ms, max \(.lateness.max_ms) ms (short delays p99 \(.lateness_short.p99_ms) ms); early \(.early)"' \
      "$out"
    if [ -n "$server_side" ]; then echo "        $server_side"; fi
    # Where it went (redrive only: the answer carries the lease's expiry): due → the server's
    # lease (the time the lease request reached the store), and from there to the consumer
    # (the lease's wait for the writer, and its answer's way back).
    jq -r 'select(.due_to_lease != null) | "        split: due → lease p50 \(.due_to_lease.p50_ms) ms, p99 \(.due_to_lease.p99_ms) ms; lease → received p50 \(.lease_to_receipt.p50_ms) ms, p99 \(.lease_to_receipt.p99_ms) ms"' "$out"
  done
done
