#!/usr/bin/env bash
# Start a throwaway PostgreSQL server (Debian's packages) for tests and benchmarks; print its SQLAlchemy URL.
#
#   scripts/postgres-up.sh DIR [PORT [DATABASE]]   (default PORT=55432, DATABASE=tessera)
#   scripts/postgres-down.sh DIR                   (the matching stop)
#
# DIR becomes the server's data folder (initdb on first use). PostgreSQL refuses to run as root, so when
# this runs as root the cluster belongs to the `postgres` user (runuser): DIR is made theirs, which needs
# every parent of DIR to be searchable by that user (a folder straight under /tmp is; pytest's 0700 temp
# folders are not, and the script says so). It listens on 127.0.0.1:PORT only, with no Unix socket, and
# trusts local TCP connections (a throwaway server: no password to hand around on a command line).
# Idempotent: an initialised DIR is not initialised again, a running server is not started again (its URL
# is printed with the port it really listens on), an existing database is kept.
# Prints `postgresql+psycopg://USER@127.0.0.1:PORT/DATABASE` on stdout; everything else goes to stderr.
# Exit status 3: no PostgreSQL and no way to install it (no apt-get, or not root; callers may skip);
# anything else non-zero: failure, with the server's log tail on stderr.
set -euo pipefail
log() { echo "postgres-up: $*" >&2; }
source "$(dirname "$0")/apt-install.sh"

DIR=${1:?usage: postgres-up.sh DIR [PORT [DATABASE]]}
PORT=${2:-55432}
DATABASE=${3:-tessera}
case "$PORT" in ''|*[!0-9]*) log "PORT must be a number, not '$PORT'"; exit 2 ;; esac
[ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] || { log "PORT must be 1..65535, not $PORT"; exit 2; }
case "$DATABASE" in ''|*[!a-z0-9_]*) log "DATABASE must be lower-case letters, digits and _, not '$DATABASE'"; exit 2 ;; esac

find_bin() {  # the newest PostgreSQL's bin folder that has pg_ctl, or nothing
  local bin
  for bin in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$bin/pg_ctl" ] && [ -x "$bin/initdb" ]; then echo "$bin"; return; fi
  done
}

BIN=$(find_bin || true)
if [ -z "$BIN" ]; then
  apt_install PostgreSQL postgresql
  BIN=$(find_bin || true)
  [ -n "$BIN" ] || { log "postgresql was installed but no pg_ctl is under /usr/lib/postgresql/*/bin"; exit 1; }
fi

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
if [ "$(id -u)" -eq 0 ]; then
  OWNER=postgres
  id "$OWNER" >/dev/null 2>&1 || { log "running as root needs the '$OWNER' user (Debian's postgresql package makes it)"; exit 3; }
  chown "$OWNER": "$DIR"
  chmod 700 "$DIR"
  as_owner() { runuser -u "$OWNER" -- "$@"; }
  as_owner test -w "$DIR" || { log "user $OWNER cannot reach $DIR (a parent folder is not searchable by it): use a folder such as /tmp/NAME"; exit 1; }
else
  OWNER=$(id -un)
  as_owner() { "$@"; }
fi

if [ ! -s "$DIR/PG_VERSION" ]; then
  out=$(mktemp)
  as_owner "$BIN/initdb" -D "$DIR" -U "$OWNER" --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$out" 2>&1 \
    || { cat "$out" >&2; rm -f "$out"; log "initdb $DIR failed"; exit 1; }
  rm -f "$out"
fi

if as_owner "$BIN/pg_ctl" status -D "$DIR" >/dev/null 2>&1; then
  PORT=$(sed -n 4p "$DIR/postmaster.pid")   # line 4 of postmaster.pid: the port it listens on
else
  # -w: wait until it accepts connections; unix_socket_directories='': TCP on 127.0.0.1 only
  if ! as_owner "$BIN/pg_ctl" start -w -t 30 -D "$DIR" -l "$DIR/server.log" \
      -o "-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off" >/dev/null 2>&1; then
    tail -n 20 "$DIR/server.log" >&2 2>/dev/null || true
    log "PostgreSQL in $DIR did not start on 127.0.0.1:$PORT (log: $DIR/server.log)"
    exit 1
  fi
fi

exists=$(as_owner "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U "$OWNER" -d postgres -tAq \
         -c "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'" 2>&1) \
  || { echo "$exists" >&2; log "cannot connect to PostgreSQL on 127.0.0.1:$PORT"; exit 1; }
if [ "$exists" != 1 ]; then
  made=$(as_owner "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U "$OWNER" "$DATABASE" 2>&1) \
    || { echo "$made" >&2; log "createdb $DATABASE failed"; exit 1; }
fi
echo "postgresql+psycopg://$OWNER@127.0.0.1:$PORT/$DATABASE"
