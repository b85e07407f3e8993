#!/usr/bin/env bash
# How long `redrive backup` takes on a large store, with no server and under load, and how
# far the write-ahead log grows meanwhile (docs/OPERATIONS.md, "Backup and restore").
#
#   scripts/bench_backup.sh                 # 2,000,000 scheduled messages (~530 MiB)
#   N=10000000 scripts/bench_backup.sh
#
# Builds the store as scripts/restart_scheduled.sh does (one message published through the
# API, copied N - 1 times with SQLite), backs it up with no server running, then starts a
# server on it, runs `redrive-bench --workload publish-batch` for 25 s and backs it up again
# 8 s in, sampling the WAL file's size every 100 ms.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000000}
PORT=${PORT:-7087}
# shellcheck source=bench_server.sh
source scripts/bench_server.sh

start "$WORK/data"
curl -sf --json '{"payload": {"n": 1, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}, "delay": "1d"}' \
  "$SERVER/v1/queues/scheduled/messages" >/dev/null
stop
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
PY
echo "store: $N messages, $(du -sh "$WORK/data" | cut -f1)"
sync
echo "== backup, no server running"
/usr/bin/time -f "total %e s, RSS %M KiB" "$BIN" backup --data-dir "$WORK/data" --to "$WORK/idle"

start "$WORK/data"
"$BENCH" --server "$SERVER" --workload publish-batch --connections 8 --duration 25s \
  >"$WORK/bench.out" 2>&1 &
load=$!
sleep 8
echo "== backup under publish-batch load (8 connections)"
(for _ in $(seq 300); do stat -c %s "$WORK/data/redrive.db-wal" 2>/dev/null || echo 0; sleep 0.1; done) \
  >"$WORK/wal.txt" &
sampler=$!
/usr/bin/time -f "total %e s, RSS %M KiB" "$BIN" backup --data-dir "$WORK/data" --to "$WORK/loaded"
kill "$sampler" 2>/dev/null || true
echo "WAL while the backup ran: max $(sort -n "$WORK/wal.txt" | tail -1) bytes"
wait "$load" || true
echo "== the load (the whole 25 s, backup included)"
tail -8 "$WORK/bench.out"
stop
