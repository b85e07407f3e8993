#!/usr/bin/env bash
# The API document is the contract: run schemathesis (all checks, a bounded number of examples)
# against a live redrive server and fail on any mismatch between /openapi.json and the server.
#
# Usage: scripts/schemathesis.sh [path/to/redrive]   (default: target/debug/redrive, built here)
# Env:   SCHEMATHESIS_MAX_EXAMPLES (default 20), SCHEMATHESIS_VENV (default ~/.cache/redrive-ci/
#        schemathesis-venv; created with `pip install schemathesis==4.*` when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-target/debug/redrive}
if [ -z "${1:-}" ]; then cargo build -p redrive --quiet; fi
venv=${SCHEMATHESIS_VENV:-$HOME/.cache/redrive-ci/schemathesis-venv}
if [ ! -x "$venv/bin/schemathesis" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "schemathesis==4.*"
fi
"$venv/bin/schemathesis" --version

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# A short max_wait: schemathesis gives up on a request after 10 s, and the document's `wait`
# pattern follows the configuration, so long polls stay within it.
printf 'max_wait = "1s"\n' > "$dir/redrive.toml"
"$bin" serve --config "$dir/redrive.toml" --listen "127.0.0.1:$port" --data-dir "$dir/data" \
  > "$dir/server.log" 2>&1 &
server=$!
stop() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$dir/server.log"; exit 1; }

status=0
"$venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" \
  --checks all --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-20}" || status=$?
if [ "$status" -ne 0 ]; then
  echo "== server log"
  tail -50 "$dir/server.log"
fi
exit "$status"
