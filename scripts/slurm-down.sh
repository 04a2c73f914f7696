#!/usr/bin/env bash
# Stop the virtual cluster that scripts/slurm-up.sh started in DIR, and nothing of any other cluster on
# this host: cancel its jobs, stop its daemons by their pid files, kill the job processes a dead node of
# its own left behind (in the cgroups named after its nodes), and stop its own munged.
#
#   scripts/slurm-down.sh DIR
set -uo pipefail

DIR=$(cd "${1:?usage: slurm-down.sh DIR}" 2>/dev/null && pwd) || exit 0
export SLURM_CONF=$DIR/etc/slurm.conf
log() { echo "slurm-down: $*" >&2; }

stop_pid_files() {   # SIGTERM to all at once, wait up to 3 s, then SIGKILL (slurmctld -c starts clean anyway)
  local pids=() f pid
  for f in "$@"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  for _ in $(seq 30); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  return 0
}

if [ -f "$SLURM_CONF" ] && [ -s "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; then
  scancel --user="$(id -un)" >/dev/null 2>&1 || true   # this cluster's jobs: SLURM_CONF names it
  sleep 0.5
fi
stop_pid_files "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid"

# A node whose slurmd died leaves its job processes running: kill what is left in this cluster's
# nodes' cgroups (slurm_NODE in each v1 hierarchy), then remove those cgroups.
if [ -s "$DIR/etc/nodes" ]; then
  while read -r node; do
    [ -n "$node" ] || continue
    for top in /sys/fs/cgroup/*/slurm_"$node"; do
      [ -d "$top" ] || continue
      find "$top" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
        kill -KILL "$pid" 2>/dev/null
      done
      find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
  done <"$DIR/etc/nodes"
fi

# This cluster's own munged (slurm.conf's AuthInfo names its socket; the pid file is beside it).
socket=$(sed -n 's/^AuthInfo=socket=//p' "$SLURM_CONF" 2>/dev/null)
case "$socket" in
  /run/tessera-slurm/*/munge/munge.socket)     # only a munged that slurm-up.sh started for this cluster
    stop_pid_files "$(dirname "$socket")/munged.pid"
    rm -rf "$(dirname "$(dirname "$socket")")" ;;  # /run/tessera-slurm/NAME: key, socket, seed, log
esac
log "stopped"
