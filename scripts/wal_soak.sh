#!/usr/bin/env bash
# The WAL bound under the heaviest steady load (issue 5, defect 1): run the `cycle` workload
# (publish → lease → batch ack, 1 KiB payloads) for MINUTES minutes against a fresh release
# server, sample the WAL file every second, then stay idle for a minute and sample again.
#
#   scripts/wal_soak.sh                   # 10 minutes, default max_wal_bytes (64 MiB)
#   MINUTES=2 MAX_WAL_BYTES=8388608 scripts/wal_soak.sh
#
# Prints: the bench's own figures (throughput, latency), the WAL's max / p99 / last size
# under load, its size after the idle minute, and the server's rewind count from /metrics.
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES=${MINUTES:-10}
MAX_WAL_BYTES=${MAX_WAL_BYTES:-67108864}
PORT=${PORT:-7078}
SERVER="http://127.0.0.1:$PORT"

cargo build --release -p redrive -p redrive-bench --quiet
BIN=$PWD/target/release/redrive
BENCH=$PWD/target/release/redrive-bench
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
printf 'log = "warn"\nmax_wal_bytes = %s\n' "$MAX_WAL_BYTES" >"$WORK/soak.toml"

"$BIN" serve --config "$WORK/soak.toml" --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" &
PID=$!
for _ in $(seq 1 500); do curl -sf "$SERVER/readyz" >/dev/null 2>&1 && break; sleep 0.01; done

echo "machine: $(nproc) cores, $(uname -sr); commit $(git rev-parse --short HEAD)"
echo "max_wal_bytes = $MAX_WAL_BYTES; cycle workload for $MINUTES min, 1 KiB payloads"
WAL="$WORK/data/redrive.db-wal"
(while kill -0 $PID 2>/dev/null; do stat -c %s "$WAL" 2>/dev/null || echo 0; sleep 1; done) >"$WORK/wal.samples" &
SAMPLER=$!
secs=$((MINUTES * 60))
"$BENCH" --server "$SERVER" --workload cycle --connections 64 --payload-bytes 1024 \
  --messages 1000000000 --timeout "${secs}s" || true   # "incomplete" after the timeout is the plan
kill $SAMPLER 2>/dev/null || true
sort -n "$WORK/wal.samples" | awk '{a[NR]=$1} END {
  p99 = a[int(NR*0.99) > 0 ? int(NR*0.99) : 1];
  printf "WAL under load: %d samples, max %.1f MiB, p99 %.1f MiB\n", NR, a[NR]/1048576, p99/1048576 }'
echo "WAL at the end of the load: $(( $(tail -1 "$WORK/wal.samples") / 1048576 )) MiB"
sleep 60
echo "WAL after 60 s idle: $(stat -c %s "$WAL" 2>/dev/null || echo 0) bytes"
curl -s "$SERVER/metrics" | grep -E '^redrive_wal_|^redrive_commit_seconds_(sum|count)' || true
kill -TERM $PID; wait $PID || true
