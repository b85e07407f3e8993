#!/usr/bin/env bash
# redrive against its usual peer, a PostgreSQL job table consumed with FOR UPDATE SKIP LOCKED
# (River / pgmq / Oban style), on the retry-cycle workload: publishers batch-publish, consumers
# lease up to BATCH, nack each first delivery (transient, zero delay), lease the retry, ack it.
# Both systems are driven by the same load generator (`redrive-bench`, with `--pg URL` for the
# peer: see `redrive-bench --help`), with the same shapes, on this machine.
#
#   scripts/bench_vs_pg.sh                            # 3 interleaved rounds of each shape
#   ROUNDS=1 MESSAGES=5000 scripts/bench_vs_pg.sh     # a quick check
#   SHAPES="16x100" PUBLISHERS=8 scripts/bench_vs_pg.sh
#   SYSTEMS="redrive-pg pg" scripts/bench_vs_pg.sh    # redrive on PostgreSQL against the peer
#   SYSTEMS="redrive-mysql mysql" scripts/bench_vs_pg.sh   # redrive on MariaDB against its peer
#
# SYSTEMS    what runs, in this order each round (default "redrive redrive-pg pg"): redrive on its
#            embedded store, redrive on PostgreSQL (--storage-url PG_URL, a fresh schema per run,
#            dropped after), the bare SKIP LOCKED peer; also redrive-mysql (redrive on MySQL /
#            MariaDB, --storage-url MYSQL_URL's server, a fresh database per run, dropped after)
#            and mysql (the bare MySQL SKIP LOCKED peer, READ COMMITTED, `redrive-bench --mysql`),
#            each with its deadlock (1213) retries per 10,000 messages (redrive's from
#            redrive_mysql_deadlock_retries_total). For the two on PostgreSQL each run also
#            reports, per retry cycle (one message published, leased, nacked, leased again and
#            acked): the database's commits (pg_stat_database.xact_commit), the cluster's WAL
#            bytes (pg_current_wal_lsn), and the dead tuples the run made (n_tup_upd + n_tup_del
#            of the run's tables: every update or delete leaves one for vacuum).
#            With BASELINE_BIN=path/to/an/older/redrive, also `baseline`: that binary on its
#            embedded store (before and after a change side by side in one window).
# SHAPES     consumers x batch, space-separated (default "16x100 8x10 64x1"). batch 1 means one
#            message per lease and one ack / nack request per message (redrive's single-message
#            endpoints; for PostgreSQL, one claim of 1 row and one UPDATE / DELETE per job).
# PUBLISHERS publishing connections, on both sides (default 4); --connections is
#            consumers + PUBLISHERS, so "16x100" really is 16 consumers.
# PUBLISH_BATCH messages per publish request, on both sides (default 100, whatever the
#            consumers' batch: "64x1" measures one-message consumers, not single publishes).
# MESSAGES   messages per run (default 200000 for batch >= 10, 50000 below).
# ROUNDS     rounds (default 3); each round runs redrive (a fresh release server in a fresh data
#            dir, the zero-delay bench-retry policy of scripts/bench.sh) and then PostgreSQL
#            (a TRUNCATEd table, after a CHECKPOINT), so slow drifts of a shared machine hit both.
# PG_URL     default postgres://root@127.0.0.1:5432/test
# MYSQL_URL  default mysql://root@127.0.0.1:3306/test (the peer's table is made there; redrive's
#            databases on the same server)
# PORT       redrive's port (default 7079)
#
# Output: one line per run, then per shape: redrive median [min–max], PostgreSQL median
# [min–max] (full retry cycles per second), and the ratio of the medians. Each run also prints
# its CPU per retry cycle: the whole machine's (every process, the kernel's too), the load
# generator's, and the embedded store's writer thread's (a single thread: at 1e6 / rate µs per
# cycle it is using a whole core, and the rate can only grow by cutting its cost). Figures from
# a machine that other work shares are indicative only.
set -euo pipefail
cd "$(dirname "$0")/.."

SHAPES=${SHAPES:-"16x100 8x10 64x1"}
SYSTEMS=${SYSTEMS:-"redrive redrive-pg pg"}
PUBLISHERS=${PUBLISHERS:-4}
PUBLISH_BATCH=${PUBLISH_BATCH:-100}
ROUNDS=${ROUNDS:-3}
PG_URL=${PG_URL:-postgres://root@127.0.0.1:5432/test}
MYSQL_URL=${MYSQL_URL:-mysql://root@127.0.0.1:3306/test}
MYSQL_SERVER=${MYSQL_URL%/*}
PORT=${PORT:-7079}

for shape in $SHAPES; do
  [[ $shape =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || {
    echo "bad shape $shape: expected CONSUMERSxBATCH, e.g. 16x100" >&2
    exit 2
  }
done

# shellcheck source=bench_server.sh
source scripts/bench_server.sh
pg() { psql "$PG_URL" -XAtqc "$1"; }
uses_mysql() { [[ " $SYSTEMS " == *" mysql "* || " $SYSTEMS " == *" redrive-mysql "* ]]; }
# The mysql client on MYSQL_URL's server (mysql://user[:pw]@host[:port]/db).
my() {
  local rest=${MYSQL_URL#mysql://} auth host port
  rest=${rest%%/*}
  if [[ $rest == *@* ]]; then auth=${rest%@*}; rest=${rest##*@}; else auth=root; fi
  host=${rest%%:*}; port=3306; [[ $rest == *:* ]] && port=${rest##*:}
  local user=${auth%%:*} pw=""; [[ $auth == *:* ]] && pw=${auth#*:}
  mysql -h "$host" -P "$port" -u "$user" ${pw:+-p"$pw"} -N -B -e "$1"
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (the machine may be shared: figures are indicative)"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with local changes)')"
FSYNC_TEST=$(ls /usr/lib/postgresql/*/bin/pg_test_fsync 2>/dev/null | tail -1 || true)
if [ -n "$FSYNC_TEST" ]; then
  echo "fsync latency (pg_test_fsync, one 8 kB write + sync, in $WORK's file system):"
  (cd "$WORK" && "$FSYNC_TEST" -s 2 -f "$WORK/fsync.test" 2>/dev/null |
    grep -E "fdatasync|fsync " | head -3) || true
fi
echo "PostgreSQL: $(pg 'SELECT version()')"
echo "PostgreSQL settings: $(pg "SELECT string_agg(name || ' = ' || setting || coalesce(unit, ''), ', ' ORDER BY name)
  FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes',
  'commit_delay', 'shared_buffers', 'max_wal_size', 'checkpoint_timeout')")"
echo "  (the bench sets synchronous_commit = on on each of its connections)"
echo "data: redrive in $WORK ($(df --output=source,fstype "$WORK" | tail -1 | tr -s ' ')), PostgreSQL in \
$(pg 'SHOW data_directory' 2>/dev/null || echo '?') ($(df --output=source,fstype "$(pg 'SHOW data_directory' 2>/dev/null || echo /)" 2>/dev/null | tail -1 | tr -s ' '))"
if uses_mysql; then
  echo "MySQL: $(my 'SELECT VERSION()'), $(my "SELECT CONCAT('innodb_flush_log_at_trx_commit = ', @@innodb_flush_log_at_trx_commit, ', sync_binlog = ', @@sync_binlog, ', log_bin = ', @@log_bin, ', innodb_buffer_pool_size = ', @@innodb_buffer_pool_size)")"
fi
echo "publishers: $PUBLISHERS on both sides, $PUBLISH_BATCH messages per publish request; rounds: $ROUNDS; payload: the bench's default (64 bytes)"
echo

# PostgreSQL's counters now: "wal_lsn commits updates_and_deletes" (the last of the tables
# matched by the WHERE condition $1 on pg_stat_user_tables). The statistics of a backend reach
# the view when it ends, or within a second: call after the run's connections closed.
pg_counters() {
  pg "SELECT pg_current_wal_lsn(), (SELECT xact_commit FROM pg_stat_database
      WHERE datname = current_database()), (SELECT coalesce(sum(n_tup_upd + n_tup_del), 0)
      FROM pg_stat_user_tables WHERE $1)" | tr '|' ' '
}

# CPU time, in clock ticks (CLK_TCK, 100 per second here), for the CPU figures of each run:
# - machine_ticks: "busy total" of every core since boot (/proc/stat; busy leaves out idle,
#   iowait and the time the hypervisor stole);
# - children_ticks: user + system time of this shell's reaped children (the load generator is
#   one, run in the foreground; the server is reaped only at its stop), into TICKS;
# - thread_ticks PID NAME: user + system time of PID's threads named NAME (0 when none).
machine_ticks() {
  awk '/^cpu / {busy = $2 + $3 + $4 + $7 + $8; print busy, busy + $5 + $6 + $9}' /proc/stat
}
children_ticks() { # sets TICKS
  # `times` here, not in a $( ) subshell, which would count only its own children. Its line 2
  # is "XmY.YYYs XmY.YYYs": the children's user and system time.
  times >"$WORK/times"
  TICKS=$(tail -1 "$WORK/times" | awk -v hz="$(getconf CLK_TCK)" '{ s = 0
    for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%d\n", s * hz + 0.5 }')
}
thread_ticks() { # pid name (read with the shell's builtins: no process per thread)
  local t s=0 comm stat f
  for t in /proc/"$1"/task/*; do
    read -r comm <"$t/comm" 2>/dev/null || continue
    [ "$comm" = "$2" ] || continue
    read -r stat <"$t/stat" 2>/dev/null || continue
    read -ra f <<<"${stat##*) }" # the fields after "pid (comm) ": utime and stime are 12th, 13th
    s=$((s + f[11] + f[12]))
  done
  echo "$s"
}
# Microseconds of CPU per message between two tick readings.
us_per() { awk -v a="$1" -v b="$2" -v n="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.0f", (b - a) * 1e6 / hz / n }'; }

# Per retry cycle between two pg_counters readings: "commits wal_bytes dead_tuples".
per_cycle() { # before after messages
  local b=($1) a=($2)
  pg "SELECT round(($((a[1] - b[1])))::numeric / $3, 2), round(pg_wal_lsn_diff('${a[0]}', '${b[0]}') / $3),
      round(($((a[2] - b[2])))::numeric / $3, 2)" | tr '|' ' '
}

# Run the load generator ("$@") for MESSAGES messages, in the foreground, and set CPU to its
# run's CPU per retry cycle: "machine load_generator writer" in µs (writer: the server PID's
# redrive-writer thread, "-" for the peers, which have none).
bench_timed() { # messages server_pid_or_empty command...
  local n=$1 spid=$2 m0 m1 c0 c1 w0=0 w1=0
  shift 2
  # The writer's ticks outside the others' window: their readings' own work stays out of
  # the machine's and the children's figures.
  [ -n "$spid" ] && w0=$(thread_ticks "$spid" redrive-writer)
  read -r m0 _ < <(machine_ticks)
  children_ticks
  c0=$TICKS
  "$@" || true
  children_ticks
  c1=$TICKS
  read -r m1 _ < <(machine_ticks)
  [ -n "$spid" ] && w1=$(thread_ticks "$spid" redrive-writer)
  CPU="$(us_per "$m0" "$m1" "$n") $(us_per "$c0" "$c1" "$n") $([ -n "$spid" ] && us_per "$w0" "$w1" "$n" || echo -)"
}

# One run: system shape round consumers batch messages; appends "shape system rate" to results.
run() {
  local system=$1 shape=$2 round=$3 consumers=$4 batch=$5 messages=$6
  local out="$WORK/$system-$shape-$round.json" target tables="" before=""
  local common=(--workload retry-cycle --connections $((consumers + PUBLISHERS))
    --publishers "$PUBLISHERS" --batch "$batch" --publish-batch "$PUBLISH_BATCH"
    --messages "$messages" --json)
  case $system in
  redrive | baseline)
    local data="$WORK/data-$shape-$round"
    if [ "$system" = baseline ]; then start_baseline "$data"; else start "$data"; fi
    bench_timed "$messages" "$PID" "$BENCH" --server "$SERVER" "${common[@]}" >"$out" 2>"$out.err"
    stop
    rm -rf "$data"
    target=$system
    ;;
  redrive-pg)
    local schema="redrive_bench_${shape}_$round"
    pg "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
    start "$WORK/data-unused" "$PG_URL" "$schema"
    pg CHECKPOINT >/dev/null
    tables="schemaname = '$schema'"
    sleep 1.2 # the open's own statistics reach the view
    before=$(pg_counters "$tables")
    bench_timed "$messages" "" "$BENCH" --server "$SERVER" "${common[@]}" >"$out" 2>"$out.err"
    stop
    target=redrive-pg
    ;;
  redrive-mysql)
    local db="redrive_bench_${shape}_$round"
    my "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db" >/dev/null
    start "$WORK/data-unused" "$MYSQL_SERVER/$db"
    bench_timed "$messages" "" "$BENCH" --server "$SERVER" "${common[@]}" >"$out" 2>"$out.err"
    local deadlocks
    deadlocks=$(curl -s "$SERVER/metrics" | awk '/^redrive_mysql_deadlock_retries_total/ {print $2}')
    echo "$shape $system ${deadlocks:-0} $messages" >>"$WORK/deadlocks.txt"
    stop
    my "DROP DATABASE IF EXISTS $db" >/dev/null
    target=redrive-mysql
    ;;
  mysql)
    bench_timed "$messages" "" "$BENCH" --mysql "$MYSQL_URL" "${common[@]}" >"$out" 2>"$out.err"
    echo "$shape $system $(jq -r '.deadlock_retries // 0' "$out" 2>/dev/null || echo 0) $messages" >>"$WORK/deadlocks.txt"
    target=MySQL
    ;;
  pg)
    pg CHECKPOINT >/dev/null
    tables="relname = 'redrive_bench_jobs'"
    before=$(pg_counters "$tables")
    bench_timed "$messages" "" "$BENCH" --pg "$PG_URL" "${common[@]}" >"$out" 2>"$out.err"
    target=PostgreSQL
    ;;
  esac
  local cost=""
  if [ -n "$tables" ]; then
    sleep 1.2
    local costs
    costs=$(per_cycle "$before" "$(pg_counters "$tables")" "$messages")
    cost=$(awk '{printf "  per cycle: commits %s, WAL %s B, dead tuples %s", $1, $2, $3}' <<<"$costs")
    echo "$shape $system $costs" >>"$WORK/costs.txt"
  fi
  [ "$system" = redrive-pg ] && pg "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
  if ! jq -e '.complete == true' "$out" >/dev/null 2>&1; then
    printf '%-7s round %d  %-10s  FAILED: %s\n' "$shape" "$round" "$target" \
      "$( (jq -r '.incomplete_reason // empty' "$out" 2>/dev/null; tail -3 "$out.err") | tr '\n' ' ')"
    return
  fi
  local line
  line=$(jq -r 'def r1: if . == null then "n/a" else (. * 10 | round / 10) end;
      [(.messages_per_s | round), (.end_to_end_latency.p50_ms | r1), (.end_to_end_latency.p99_ms | r1),
       (.elapsed_s | r1), (.errors | to_entries | map(.value.count) | add // 0),
       ((.commits.commits_per_second // .pg_wal_syncs_per_s // .mysql_fsyncs_per_s) | if . == null then "n/a" else round end)]
      | @tsv' "$out")
  local rate p50 p99 elapsed errors syncs
  IFS=$'\t' read -r rate p50 p99 elapsed errors syncs <<<"$line"
  printf '%-7s round %d  %-10s  %7s cycles/s  p50 %6s ms  p99 %6s ms  %6s s  fsyncs/s %5s  errors %s%s\n' \
    "$shape" "$round" "$target" "$rate" "$p50" "$p99" "$elapsed" "$syncs" "$errors" "$cost"
  local cpu=($CPU)
  printf '%-7s          %-10s  CPU per cycle: machine %s µs, load generator %s µs, writer thread %s µs\n' \
    "" "" "${cpu[0]}" "${cpu[1]}" "${cpu[2]}"
  jq -r --arg shape "$shape" --arg system "$system" --arg cpu "${cpu[*]}" \
    '[$shape, $system, .messages_per_s, ($cpu | split(" "))[]] | @tsv' "$out" >>"$WORK/results.tsv"
}

: >"$WORK/results.tsv"
for shape in $SHAPES; do
  consumers=${shape%x*}
  batch=${shape#*x}
  if [ -n "${MESSAGES:-}" ]; then
    messages=$MESSAGES
  elif [ "$batch" -ge 10 ]; then
    messages=200000
  else
    messages=50000
  fi
  echo "== $shape: $consumers consumers, $PUBLISHERS publishers, batch $batch, $messages messages"
  for round in $(seq 1 "$ROUNDS"); do
    for system in $SYSTEMS; do
      run "$system" "$shape" "$round" "$consumers" "$batch" "$messages"
    done
  done
done

echo
echo "full retry cycles per second (median [min–max] of the complete runs):"
python3 - "$WORK/results.tsv" "$SHAPES" "$SYSTEMS" <<'PY'
import sys
from statistics import median

rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
shapes = sys.argv[2].split()
systems = sys.argv[3].split()
names = {"redrive": "redrive", "baseline": "redrive (BASELINE_BIN)", "redrive-pg": "redrive on PostgreSQL", "pg": "PostgreSQL SKIP LOCKED",
         "redrive-mysql": "redrive on MySQL", "mysql": "MySQL SKIP LOCKED"}

def fig(values):
    if not values:
        return "n/a", None
    m = median(values)
    return f"{m:,.0f} [{min(values):,.0f}–{max(values):,.0f}] (n={len(values)})", m

def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"

# Each redrive against the peer of its database (the embedded one against both peers).
pairs = [(r, p) for r, p in (("redrive", "pg"), ("redrive-pg", "pg"), ("redrive", "mysql"),
                             ("redrive-mysql", "mysql"), ("redrive", "baseline"), ("baseline", "pg"))
         if r in systems and p in systems]
print(f"{'shape':<8} " + " ".join(f"{names[s]:<30}" for s in systems) + " " +
      " ".join(f"{r}/{p:<6}" for r, p in pairs))
for shape in shapes:
    figs = {s: fig([float(r[2]) for r in rows if r[0] == shape and r[1] == s]) for s in systems}
    print(f"{shape:<8} " + " ".join(f"{figs[s][0]:<30}" for s in systems) + " " +
          " ".join(f"{ratio(figs[r][1], figs[p][1]):<{len(r) + len(p) + 7}}" for r, p in pairs))

# CPU per cycle: what the two systems cost the machine, the load generator's share of it, and
# (embedded store) the writer thread's, which can use one core at most.
print()
print("CPU per retry cycle, µs (median of the complete runs): machine / load generator / writer thread")
for shape in shapes:
    parts = []
    for s in systems:
        sel = [r for r in rows if r[0] == shape and r[1] == s and len(r) >= 6]
        col = lambda i: (f"{median(float(r[i]) for r in sel):.0f}"
                         if sel and all(r[i] != "-" for r in sel) else "-")
        parts.append(f"{names[s]}: {col(3)} / {col(4)} / {col(5)}" if sel else f"{names[s]}: n/a")
    print(f"{shape:<8} " + "; ".join(parts))
PY
if [ -s "$WORK/deadlocks.txt" ]; then
  echo
  echo "deadlock (1213) retries per 10,000 messages (median of the rounds):"
  python3 - "$WORK/deadlocks.txt" <<'PY'
import sys
from statistics import median
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for key in dict.fromkeys((r[0], r[1]) for r in rows):
    sel = [float(r[2]) * 10_000 / float(r[3]) for r in rows if (r[0], r[1]) == key]
    name = {"redrive-mysql": "redrive on MySQL", "mysql": "MySQL SKIP LOCKED"}[key[1]]
    print(f"{key[0]:<8} {name:<20} {median(sel):8.2f}  (runs: {', '.join(f'{x:.2f}' for x in sel)})")
PY
fi
if [ -s "$WORK/costs.txt" ]; then
  echo
  echo "PostgreSQL's work per retry cycle (median of the rounds): commits, WAL bytes, dead tuples"
  python3 - "$WORK/costs.txt" <<'PY'
import sys
from statistics import median
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for key in dict.fromkeys((r[0], r[1]) for r in rows):
    sel = [r for r in rows if (r[0], r[1]) == key]
    name = {"redrive-pg": "redrive on PostgreSQL", "pg": "PostgreSQL SKIP LOCKED"}[key[1]]
    c, w, d = (median(float(r[i]) for r in sel) for i in (2, 3, 4))
    print(f"{key[0]:<8} {name:<24} commits {c:6.2f}  WAL {w:8,.0f} B  dead tuples {d:5.2f}")
PY
fi
