#!/usr/bin/env bash
# Bulk tasks (SPEC §12, docs/PERFORMANCE.md "Bulk tasks"): how fast a task with no rate works
# through dead letters. A fresh release server; MESSAGES dead letters made through the API
# (batch publish, lease, batch nack: max_attempts = 1); then, timed by the CLI's own
# `tasks create --wait`, a redrive of them all, and a delete of them all.
#
#   scripts/bench_tasks.sh                  # 100,000 dead letters
#   MESSAGES=20000 scripts/bench_tasks.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PORT:-7078}
MESSAGES=${MESSAGES:-100000}

# shellcheck source=bench_server.sh
source scripts/bench_server.sh
cat >>"$WORK/bench.toml" <<'TOML'
[queues.bulk.retry]
max_attempts = 1
TOML
start "$WORK/data"

echo "== making $MESSAGES dead letters"
python3 - "$SERVER" "$MESSAGES" <<'PY'
import json, sys, urllib.request
server, n = sys.argv[1], int(sys.argv[2])
def post(path, body):
    req = urllib.request.Request(server + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req))
made = 0
while made < n:
    k = min(1000, n - made)
    post("/v1/queues/bulk/messages", {"messages": [{"payload": {"n": made + i}} for i in range(k)]})
    left = k
    while left:
        leased = post("/v1/queues/bulk/leases", {"max": left})["messages"]
        post("/v1/messages/nack", {"items": [
            {"id": m["id"], "lease": m["lease"], "error": {"class": "permanent", "message": "bench"}}
            for m in leased]})
        left -= len(leased)
    made += k
PY
"$BIN" --server "$SERVER" queues bulk

run() { # action, selection flags …
  local action=$1
  shift
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" --server "$SERVER" tasks create --action "$action" "$@" --wait >"$WORK/task.json" 2>/dev/null
  t1=$(date +%s.%N)
  python3 - "$WORK/task.json" "$t0" "$t1" "$action" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
secs = float(sys.argv[3]) - float(sys.argv[2])
print(f"{sys.argv[4]:8} total={t['total']} done={t['done']} failed={t['failed']} state={t['state']} "
      f"seconds={secs:.1f} messages_per_second={t['done'] / secs:,.0f}")
PY
}
echo "== tasks with no rate"
run redrive --queue bulk --state dead
run delete --queue bulk --state ready
