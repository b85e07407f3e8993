# Sourced by the benchmark scripts (bench.sh, bench_vs_pg.sh, restart_scheduled.sh): build the
# release binaries (the server, redrive, and the load generator, redrive-bench), make a work
# directory, and start / stop one fresh server at a time on 127.0.0.1:$PORT. Sets BIN (redrive),
# BENCH (redrive-bench), WORK, SERVER and PID; the caller sets PORT first.
#
#   start DATA_DIR [POSTGRES_URL SCHEMA]
#                    start a server on DATA_DIR with $WORK/bench.toml and wait for /readyz
#                    (its log goes to $WORK/server.log, whose tail is printed if it fails);
#                    with a URL and a schema, its store is that PostgreSQL schema instead
#   stop             SIGTERM it (and the extra nodes) and wait
#
# START_BIN, when set, is the server binary `start` runs instead of BIN; `start_baseline DIR`
# is `start` with BASELINE_BIN (an older build, to measure before and after side by side in
# one window: the system `baseline` of bench_delayed.sh and bench_vs_pg.sh).
#
# With a URL and a schema, EXTRA_NODES=n (default 0) starts n more nodes of the same cluster
# on $PORT+1 … $PORT+n (same config, same schema; logs $WORK/node-<i>.log); SERVER stays the
# first node.

cargo build --release -p redrive -p redrive-bench --quiet
BIN=$PWD/target/release/redrive
BENCH=$PWD/target/release/redrive-bench
WORK=$(mktemp -d)
SERVER="http://127.0.0.1:$PORT"
PID=
cleanup() {
  if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null || true; fi
  for p in "${EXTRA_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# The bench-retry queue retries at once (the retry-cycle workload checks it); bench-push is
# pushed to the endpoint the push workload hosts.
cat >"$WORK/bench.toml" <<'TOML'
log = "warn"
[push]
allow_cidrs = ["127.0.0.1/32"]
[queues."bench-retry".retry]
backoff = "fixed"
initial_delay = "0s"
jitter = "none"
[queues."bench-push"]
delivery = "push"
[queues."bench-push".push]
url = "http://127.0.0.1:18183/hook"
concurrency = 64
TOML

EXTRA_PIDS=()

# Wait up to 60 s for the server on $1 (pid $2, log $3) to answer /readyz (opening a store of
# millions of messages takes seconds).
wait_ready() {
  for _ in $(seq 1 6000); do
    curl -sf "$1/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.01
  done
  echo "server $1 did not become ready:" >&2
  tail -20 "$3" >&2
  exit 1
}

start() { # data dir [postgres url, schema]
  local store=() i port
  if [ -n "${2:-}" ]; then store=(--storage-url "$2"); fi
  REDRIVE_STORAGE_SCHEMA=${3:-redrive} "${START_BIN:-$BIN}" serve --config "$WORK/bench.toml" \
    --listen "127.0.0.1:$PORT" --data-dir "$1" "${store[@]}" >>"$WORK/server.log" 2>&1 &
  PID=$!
  wait_ready "$SERVER" "$PID" "$WORK/server.log"
  if [ -n "${2:-}" ]; then
    for i in $(seq 1 "${EXTRA_NODES:-0}"); do
      port=$((PORT + i))
      REDRIVE_STORAGE_SCHEMA=$3 "$BIN" serve --config "$WORK/bench.toml" \
        --listen "127.0.0.1:$port" --data-dir "$1-node$i" "${store[@]}" >>"$WORK/node-$i.log" 2>&1 &
      EXTRA_PIDS+=($!)
      wait_ready "http://127.0.0.1:$port" "$!" "$WORK/node-$i.log"
    done
  fi
}

start_baseline() { # data dir
  START_BIN=${BASELINE_BIN:?the system baseline needs BASELINE_BIN} start "$1"
}

stop() {
  local p
  for p in "$PID" "${EXTRA_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$PID" "${EXTRA_PIDS[@]}"; do wait "$p" || true; done
  PID=
  EXTRA_PIDS=()
}
