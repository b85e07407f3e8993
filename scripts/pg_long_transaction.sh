#!/usr/bin/env bash
# What a long-running transaction elsewhere on the database does to redrive's tables on
# PostgreSQL: the same retry-cycle load twice on a fresh schema, first alone, then while another
# session holds a snapshot open (BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT …; then idle, as a
# forgotten psql or a long report does). Printed after each: the dead tuples of `messages` that
# vacuum could not remove (n_dead_tup after a VACUUM), the size of `messages` and its indexes,
# and the throughput. The held snapshot is released before the next step.
#
#   scripts/pg_long_transaction.sh                    # 100,000 messages per run
#   MESSAGES=20000 scripts/pg_long_transaction.sh
#
# PG_URL default postgres://root@127.0.0.1:5432/test; PORT 7079.
set -euo pipefail
cd "$(dirname "$0")/.."

MESSAGES=${MESSAGES:-100000}
PG_URL=${PG_URL:-postgres://root@127.0.0.1:5432/test}
PORT=${PORT:-7079}
SCHEMA=redrive_bench_longtx

# shellcheck source=bench_server.sh
source scripts/bench_server.sh
pg() { psql "$PG_URL" -XAtqc "$1"; }

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; $(pg 'SELECT version()' | cut -d' ' -f1-2)"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with local changes)')"
echo "$MESSAGES messages per run: retry-cycle, 16 consumers x 100, 4 publishers"
pg "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null
start "$WORK/data-unused" "$PG_URL" "$SCHEMA"

report() { # label
  pg "VACUUM $SCHEMA.messages" >/dev/null
  sleep 1
  pg "SELECT '$1: messages rows ' || n_live_tup || ', dead tuples vacuum could not remove ' || n_dead_tup
        || ', table ' || pg_size_pretty(pg_relation_size('$SCHEMA.messages'))
        || ', indexes ' || pg_size_pretty(pg_indexes_size('$SCHEMA.messages'))
      FROM pg_stat_user_tables WHERE schemaname = '$SCHEMA' AND relname = 'messages'"
}

load() { # label
  local out="$WORK/$1.json"
  "$BENCH" --server "$SERVER" --workload retry-cycle --connections 20 --publishers 4 --batch 100 \
    --publish-batch 100 --messages "$MESSAGES" --json >"$out" 2>"$out.err" || true
  echo "$1: $(jq -r '"\(.messages_per_s | round) cycles/s, p99 \(.end_to_end_latency.p99_ms) ms, complete \(.complete)"' "$out")"
}

load "alone"
report "alone"

# Another session holds a snapshot for the whole next run.
psql "$PG_URL" -Xq >/dev/null <<'SQL' &
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM pg_class;
SELECT pg_sleep(3600);
SQL
HOLDER=$!
sleep 1
load "with a transaction held open"
echo "the held snapshot's age after the run: $(pg "SELECT max(age(backend_xmin)) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(3600)%'") transactions"
report "with a transaction held open"
kill "$HOLDER" 2>/dev/null || true
pg "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(3600)%'" >/dev/null
wait "$HOLDER" 2>/dev/null || true
report "after it ended"
stop
pg "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null
