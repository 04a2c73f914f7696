#!/usr/bin/env bash
# Stop the PostgreSQL server that scripts/postgres-up.sh started in DIR (fast shutdown: open sessions are
# ended). Leaves DIR in place (delete it yourself for a fresh start). Quiet; nothing to stop is not an error.
#
#   scripts/postgres-down.sh DIR
set -uo pipefail
log() { echo "postgres-down: $*" >&2; }

DIR=$(cd "${1:?usage: postgres-down.sh DIR}" 2>/dev/null && pwd) || exit 0
[ -s "$DIR/postmaster.pid" ] || exit 0
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r | head -n 1)
[ -n "$BIN" ] && [ -x "$BIN/pg_ctl" ] || { log "no pg_ctl under /usr/lib/postgresql/*/bin"; exit 1; }
if [ "$(id -u)" -eq 0 ]; then
  runuser -u "$(stat -c %U "$DIR")" -- "$BIN/pg_ctl" stop -D "$DIR" -m fast -w -t 30 >/dev/null 2>&1
else
  "$BIN/pg_ctl" stop -D "$DIR" -m fast -w -t 30 >/dev/null 2>&1
fi
status=$?
# pg_ctl stop fails when the server was already gone (a stale pid file): that is stopped, too
if [ $status -ne 0 ] && [ -s "$DIR/postmaster.pid" ] && kill -0 "$(head -n 1 "$DIR/postmaster.pid")" 2>/dev/null; then
  log "PostgreSQL in $DIR did not stop (pid $(head -n 1 "$DIR/postmaster.pid"))"
  exit 1
fi
exit 0
