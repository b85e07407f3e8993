#!/usr/bin/env bash
# The Debian package, as a user gets it: build it with `cargo deb`, install it with `dpkg -i`,
# check what it installed (binary, unit, conffile, the redrive user and its data directory),
# start the installed binary the way its systemd unit does, probe /healthz, publish, lease and
# ack, take a backup while it runs, stop it with SIGTERM, then remove and purge the package.
#
# There is no systemd as PID 1 here (CI runs in a container): the server is started as the
# unit's ExecStart, as the unit's User/Group, with an empty environment (systemd's), from /;
# the unit file itself is checked with `systemd-analyze verify` where that exists.
#
# Usage: sudo scripts/deb_install_test.sh
# Env:   DEB_NO_BUILD=1  package the target/release/redrive already built (cargo deb --no-build)
# Runs as root (dpkg). Refuses to run where a redrive package is already installed; removes
# everything it installed or created (the package, /var/lib/redrive, the redrive user).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "deb install test: needs root (dpkg -i)" >&2
  exit 1
fi
if dpkg-query -W -f='${Status}' redrive 2>/dev/null | grep -q ' installed$'; then
  echo "deb install test: a redrive package is already installed here; refusing to replace it" >&2
  exit 1
fi
if [ -e /var/lib/redrive ] || getent passwd redrive >/dev/null; then
  echo "deb install test: /var/lib/redrive or the user redrive exists already (not made by this test); refusing" >&2
  exit 1
fi

if ! cargo deb --version >/dev/null 2>&1; then
  echo "== installing cargo-deb (cargo install cargo-deb --locked)"
  cargo install cargo-deb --locked --quiet
fi
echo "== cargo deb ($(cargo deb --version))"
work=$(mktemp -d)
server=""
fail() {
  echo "deb install test FAILED: $*" >&2
  [ -f "$work/server.log" ] && { echo "--- server log"; cat "$work/server.log"; } >&2
  exit 1
}
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
    kill -KILL "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  if dpkg-query -W redrive >/dev/null 2>&1; then dpkg --purge redrive >/dev/null 2>&1 || true; fi
  rm -rf /var/lib/redrive "$work"
  if getent passwd redrive >/dev/null; then userdel redrive 2>/dev/null || true; fi
  if getent group redrive >/dev/null; then groupdel redrive 2>/dev/null || true; fi
}
trap cleanup EXIT

cargo deb -p redrive ${DEB_NO_BUILD:+--no-build} --output "$work/" >"$work/cargo-deb.out" \
  || { cat "$work/cargo-deb.out"; fail "cargo deb"; }
deb=$(ls "$work"/redrive_*.deb)
echo "built $(basename "$deb") ($(du -h "$deb" | cut -f1)); debug symbols: $(cd "$work" && ls ./*.ddeb 2>/dev/null | xargs -r basename)"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'

echo "== dpkg -i"
dpkg -i "$deb" || fail "dpkg -i"
test -x /usr/bin/redrive || fail "no /usr/bin/redrive"
/usr/bin/redrive --version
dpkg-query -W -f='${Conffiles}\n' redrive | grep -q '/etc/redrive/redrive.toml' \
  || fail "/etc/redrive/redrive.toml is not a conffile"
unit=$(dpkg -L redrive | grep '/systemd/system/redrive.service$') || fail "no systemd unit installed"
echo "unit: $unit"
grep -qx 'ExecStart=/usr/bin/redrive serve --config /etc/redrive/redrive.toml' "$unit" \
  || fail "the unit does not run the installed config"
grep -qx 'User=redrive' "$unit" || fail "the unit does not run as redrive"
wants=/etc/systemd/system/multi-user.target.wants/redrive.service
[ -L "$wants" ] || fail "the unit was not enabled ($wants)"
home=$(getent passwd redrive | cut -d: -f6)
[ "$home" = /var/lib/redrive ] || fail "user redrive missing or its home is '$home'"
[ "$(stat -c '%U:%G %a' /var/lib/redrive)" = "redrive:redrive 750" ] \
  || fail "/var/lib/redrive is $(stat -c '%U:%G %a' /var/lib/redrive)"
[ "$(stat -c '%U:%G %a' /etc/redrive/redrive.toml)" = "root:redrive 640" ] \
  || fail "/etc/redrive/redrive.toml is $(stat -c '%U:%G %a' /etc/redrive/redrive.toml)"
if command -v systemd-analyze >/dev/null 2>&1; then
  # Offline check of the unit's syntax, directives and ExecStart binary; no systemd needed.
  systemd-analyze verify "$unit" || fail "systemd-analyze verify $unit"
  echo "systemd-analyze verify: ok"
else
  echo "systemd-analyze not found: unit not verified"
fi

echo "== start as the unit would"
port=7070
if (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
  # Something else has the config's port on this machine: same config, another port.
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  echo "127.0.0.1:7070 is taken here: REDRIVE_LISTEN=127.0.0.1:$port"
fi
# The unit's User/Group, an empty environment (plus the listen override), from /. Run in the
# background (a subshell), it execs, so $! is the server's own PID.
as_unit() {
  local env=()
  [ "$port" = 7070 ] || env=("REDRIVE_LISTEN=127.0.0.1:$port")
  cd / && exec setpriv --reuid=redrive --regid=redrive --init-groups --reset-env \
    env "${env[@]}" "$@"
}
as_unit /usr/bin/redrive serve --config /etc/redrive/redrive.toml >"$work/server.log" 2>&1 &
server=$!
base="http://127.0.0.1:$port"
for _ in $(seq 150); do
  curl -sf "$base/readyz" >/dev/null && break
  kill -0 "$server" 2>/dev/null || fail "the server exited at start"
  sleep 0.2
done
curl -sf "$base/readyz" >/dev/null || fail "not ready after 30 s"
healthz=$(curl -s -o /dev/null -w '%{http_code}' "$base/healthz")
[ "$healthz" = 200 ] || fail "/healthz answered $healthz"
grep -q 'redrive listening.*store=sqlite at=/var/lib/redrive' "$work/server.log" \
  || fail "no start-up line naming the store and /var/lib/redrive"
if grep -q $'\x1b\[' "$work/server.log"; then fail "colour escapes in the log"; fi
json() { python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"; }
published=$(curl -sf "$base/v1/queues/deb-test/messages" -H 'content-type: application/json' \
  -d '{"payload": {"from": "the Debian package"}}') || fail "publish"
id=$(echo "$published" | json 'd["id"]')
leased=$(curl -sf "$base/v1/queues/deb-test/leases" -H 'content-type: application/json' \
  -d '{"max": 1, "lease": "30s"}') || fail "lease"
[ "$(echo "$leased" | json 'd["messages"][0]["id"]')" = "$id" ] || fail "leased $leased, published $id"
lease=$(echo "$leased" | json 'd["messages"][0]["lease"]')
acked=$(curl -sf "$base/v1/messages/$id/ack" -H 'content-type: application/json' \
  -d "{\"lease\": \"$lease\"}" | json 'd["state"]') || fail "ack"
[ "$acked" = done ] || fail "ack left it $acked"
[ "$(stat -c '%U' /var/lib/redrive/redrive.db)" = redrive ] || fail "the store is not redrive's"

# One server per data directory: a second start of the same config is refused with exit 2.
second=0
second_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd / && setpriv --reuid=redrive --regid=redrive --init-groups --reset-env \
  env "REDRIVE_LISTEN=127.0.0.1:$second_port" \
  /usr/bin/redrive serve --config /etc/redrive/redrive.toml) >"$work/second.log" 2>&1 || second=$?
[ "$second" = 2 ] || { cat "$work/second.log"; fail "a second server on /var/lib/redrive exited $second, not 2"; }
grep -q "/var/lib/redrive/redrive.lock is locked by PID $server" "$work/second.log" \
  || { cat "$work/second.log"; fail "the refusal does not name the lock and PID $server"; }

# A backup while it runs, as root (the operator's cron job): the live files stay redrive's.
/usr/bin/redrive backup --data-dir /var/lib/redrive --to "$work/backup" || fail "redrive backup"
owners=$(stat -c '%U' /var/lib/redrive/* | sort -u | tr '\n' ' ')
[ "$owners" = "redrive " ] || fail "files in /var/lib/redrive owned by: $owners"

echo "== stop (SIGTERM, as systemctl stop)"
kill -TERM "$server"
status=0
wait "$server" || status=$?
server=""
[ "$status" = 0 ] || fail "exit $status after SIGTERM"

echo "== dpkg -r, then purge"
dpkg -r redrive
[ ! -e /usr/bin/redrive ] || fail "/usr/bin/redrive left after dpkg -r"
[ -f /etc/redrive/redrive.toml ] || fail "dpkg -r removed the conffile"
[ -f /var/lib/redrive/redrive.db ] || fail "dpkg -r removed the data"
dpkg --purge redrive
[ ! -e /etc/redrive/redrive.toml ] || fail "purge left /etc/redrive/redrive.toml"
[ -f /var/lib/redrive/redrive.db ] || fail "purge removed the store (it must keep messages)"
[ ! -e "$wants" ] && [ ! -L "$wants" ] || fail "purge left the unit enabled ($wants)"

echo "deb install test: package=$(basename "$deb") healthz=$healthz published=$id acked=$acked" \
  "second_server_exit=$second sigterm_exit=$status removed=yes purged=yes store_kept=yes"
