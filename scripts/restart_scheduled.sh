#!/usr/bin/env bash
# Restart time and memory of a server that opens a store holding many scheduled messages,
# without publishing them over HTTP first (10,000,000 through the API take ~5 minutes here:
# `SCHEDULED=10000000 WORKLOADS=scheduled scripts/bench.sh` does that, end to end).
#
#   scripts/restart_scheduled.sh              # 10,000,000 messages
#   N=1000000 scripts/restart_scheduled.sh
#
# Publishes one message due in a day through the API (so the row is what redrive writes), stops
# the server, copies that row N - 1 times with SQLite (python3's sqlite3 module), then starts the
# server twice on the store and prints the time to /readyz and the RSS after it.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10000000}
PORT=${PORT:-7078}
# shellcheck source=bench_server.sh
source scripts/bench_server.sh

start "$WORK/data"
curl -sf --json '{"payload": {"n": 1, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}, "delay": "1d"}' \
  "$SERVER/v1/queues/scheduled/messages" >/dev/null
stop
echo "building a store of $N scheduled messages with SQLite…"
python3 - "$WORK/data/redrive.db" "$N" <<'PY'
import sqlite3, sys
db, n = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db)
c.execute("PRAGMA synchronous = OFF")
row = c.execute("SELECT queue, state, priority, due_at, payload, created_at, updated_at, history FROM messages").fetchone()
c.execute("""WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?)
INSERT INTO messages (id, queue, state, priority, due_at, payload, created_at, updated_at, history)
SELECT printf('00000000-0000-7000-8000-%012d', i), ?, ?, ?, ? + i % 3600000, ?, ?, ?, ? FROM k""", (n - 1, *row))
c.commit()
c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
print("messages:", c.execute("SELECT count(*) FROM messages").fetchone()[0])
PY
echo "data dir: $(du -sh "$WORK/data" | cut -f1)"
for run in 1 2; do
  sync
  t0=$(date +%s%N)
  start "$WORK/data"
  t1=$(date +%s%N)
  echo "restart $run: ready in $(((t1 - t0) / 1000000)) ms, RSS $(awk '/VmRSS/ {print int($2 / 1024)}' /proc/$PID/status) MiB (peak $(awk '/VmHWM/ {print int($2 / 1024)}' /proc/$PID/status) MiB)"
  stop
done
