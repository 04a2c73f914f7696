#!/usr/bin/env bash
# Stop the virtual cluster that scripts/slurm-up.sh started in DIR: cancel jobs, stop the daemons by
# their pid files, kill job processes a dead node left behind, and stop munged if slurm-up.sh started it.
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
  scancel --user="$(id -un)" >/dev/null 2>&1 || true
  sleep 0.5
fi
stop_pid_files "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid"

# A node whose slurmd died leaves its job processes running: kill what is left in slurm's cgroups.
for tasks in $(find /sys/fs/cgroup/freezer /sys/fs/cgroup/unified /sys/fs/cgroup -path '*slurm*' -name cgroup.procs 2>/dev/null); do
  while read -r pid; do [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; done <"$tasks"
done
for root in /sys/fs/cgroup/*/; do
  find "$root" -depth -mindepth 1 -type d -path '*slurm*' -exec rmdir {} \; 2>/dev/null
done

if [ -e "$DIR/run/munged.ours" ]; then
  stop_pid_files /run/munge/munged.pid
  rm -f "$DIR/run/munged.ours"
fi
log "stopped"
