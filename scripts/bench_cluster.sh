#!/usr/bin/env bash
# redrive as a cluster of 1, 2 and 3 nodes on one PostgreSQL (SPEC §13), on the retry-cycle
# workload of scripts/bench_vs_pg.sh: publishers batch-publish, consumers lease up to BATCH,
# nack each first delivery (transient, zero delay), lease the retry, ack it. The load
# generator spreads its publishing and consuming connections over the nodes, one node per
# connection in turn (redrive-bench --also-server); a consumer acks on the node it leased from.
#
#   scripts/bench_cluster.sh                         # 1, 2 and 3 nodes, 16 x 100, one round
#   NODES="1 3" SHAPE=8x10 ROUNDS=2 scripts/bench_cluster.sh
#
# On one machine this shows what coordination costs, not how far redrive scales: every node,
# PostgreSQL and the load generator share the same cores. Per run it reports full retry cycles
# per second, the end-to-end latency p99 (publish → final ack), the database's commits and WAL
# bytes per cycle, and the CPU seconds each redrive node and PostgreSQL's processes used.
#
# NODES      node counts to run, in this order each round (default "1 2 3")
# SHAPE      consumers x batch (default 16x100); PUBLISHERS (default 4), PUBLISH_BATCH (100)
# MESSAGES   messages per run (default 100000)
# ROUNDS     rounds (default 1)
# PG_URL     default postgres://root@127.0.0.1:5432/test; each run uses a fresh schema,
#            dropped after
# BASE_PORT  first node's port (default 7091; node i listens on BASE_PORT + i)
set -euo pipefail
cd "$(dirname "$0")/.."

NODES=${NODES:-"1 2 3"}
SHAPE=${SHAPE:-16x100}
PUBLISHERS=${PUBLISHERS:-4}
PUBLISH_BATCH=${PUBLISH_BATCH:-100}
MESSAGES=${MESSAGES:-100000}
ROUNDS=${ROUNDS:-1}
PG_URL=${PG_URL:-postgres://root@127.0.0.1:5432/test}
BASE_PORT=${BASE_PORT:-7091}
[[ $SHAPE =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || {
  echo "bad SHAPE $SHAPE: expected CONSUMERSxBATCH, e.g. 16x100" >&2
  exit 2
}
CONSUMERS=${SHAPE%x*}
BATCH=${SHAPE#*x}

PORT=$BASE_PORT
# shellcheck source=bench_server.sh
source scripts/bench_server.sh
PIDS=()
cleanup_nodes() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup_nodes EXIT
pg() { PGOPTIONS="-c client_min_messages=warning" psql "$PG_URL" -XAtqc "$1"; }
TCK=$(getconf CLK_TCK)

# CPU seconds (user + system) a process used so far.
cpu_s() { awk -v t="$TCK" '{printf "%.2f", ($14 + $15) / t}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# CPU seconds of every PostgreSQL process now (backends that ended are not counted: the
# nodes' pools keep theirs for the whole run).
pg_cpu_s() {
  local total=0 p
  for p in $(pgrep -x postgres || true); do total=$(awk -v a="$total" -v b="$(cpu_s "$p")" 'BEGIN {print a + b}'); done
  echo "$total"
}
# "wal_lsn commits" now.
pg_counters() {
  pg "SELECT pg_current_wal_lsn(), (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())" | tr '|' ' '
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (figures are indicative when the machine is shared)"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with local changes)')"
echo "PostgreSQL: $(pg 'SELECT version()')"
echo "shape: $CONSUMERS consumers x batch $BATCH, $PUBLISHERS publishers x $PUBLISH_BATCH, $MESSAGES messages per run"
echo

for round in $(seq 1 "$ROUNDS"); do
  for n in $NODES; do
    schema="redrive_cluster_bench_${n}_$round"
    pg "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
    PIDS=()
    servers=()
    for i in $(seq 0 $((n - 1))); do
      port=$((BASE_PORT + i))
      REDRIVE_STORAGE_SCHEMA=$schema "$BIN" serve --config "$WORK/bench.toml" \
        --listen "127.0.0.1:$port" --data-dir "$WORK/unused-$i" --storage-url "$PG_URL" \
        >>"$WORK/node-$i.log" 2>&1 &
      PIDS+=($!)
      servers+=("http://127.0.0.1:$port")
      for _ in $(seq 1 3000); do
        curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
        sleep 0.01
      done
      curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || {
        echo "node $i did not become ready:" >&2
        tail -20 "$WORK/node-$i.log" >&2
        exit 1
      }
    done
    also=()
    for s in "${servers[@]:1}"; do also+=(--also-server "$s"); done
    pg CHECKPOINT >/dev/null
    sleep 1.2 # the nodes' first heartbeats settle; the open's statistics reach the view
    before=$(pg_counters)
    pg_before=$(pg_cpu_s)
    node_before=()
    for p in "${PIDS[@]}"; do node_before+=("$(cpu_s "$p")"); done
    out="$WORK/run-$n-$round.json"
    "$BENCH" --server "${servers[0]}" "${also[@]}" --workload retry-cycle \
      --connections $((CONSUMERS + PUBLISHERS)) --publishers "$PUBLISHERS" --batch "$BATCH" \
      --publish-batch "$PUBLISH_BATCH" --messages "$MESSAGES" --json >"$out" 2>"$out.err" || true
    node_cpu=""
    for j in "${!PIDS[@]}"; do
      node_cpu+="$(awk -v a="${node_before[$j]}" -v b="$(cpu_s "${PIDS[$j]}")" 'BEGIN {printf "%.1f", b - a}') "
    done
    pg_used=$(awk -v a="$pg_before" -v b="$(pg_cpu_s)" 'BEGIN {printf "%.1f", b - a}')
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
    sleep 1.2
    read -r b_lsn b_commits <<<"$before"
    read -r a_lsn a_commits <<<"$(pg_counters)"
    per=$(pg "SELECT round(($a_commits - $b_commits)::numeric / $MESSAGES, 2), round(pg_wal_lsn_diff('$a_lsn', '$b_lsn') / $MESSAGES)" | tr '|' ' ')
    pg "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
    if ! jq -e '.complete == true' "$out" >/dev/null 2>&1; then
      echo "nodes=$n round $round FAILED: $( (jq -r '.incomplete_reason // empty' "$out" 2>/dev/null; tail -3 "$out.err") | tr '\n' ' ')"
      continue
    fi
    read -r rate p99 elapsed errors <<<"$(jq -r '[(.messages_per_s | round), (.end_to_end_latency.p99_ms * 10 | round / 10),
      (.elapsed_s * 10 | round / 10), (.errors | to_entries | map(.value.count) | add // 0)] | @tsv' "$out")"
    read -r commits wal <<<"$per"
    printf 'nodes=%d round %d  %7s cycles/s  e2e p99 %7s ms  %6s s  per cycle: commits %s, WAL %s B  CPU s: redrive [ %s] PostgreSQL %s  errors %s\n' \
      "$n" "$round" "$rate" "$p99" "$elapsed" "$commits" "$wal" "$node_cpu" "$pg_used" "$errors"
  done
done
