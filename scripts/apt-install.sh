# Sourced by the scripts that set up what tests need (chromium-up.sh, postgres-up.sh, slurm-up.sh,
# java-up.sh); needs their `log`.
#
#   apt_install WHAT PACKAGE...   installs Debian packages quietly (apt-get update first); apt's output
#                                 is shown only when it fails.
# Exit status 3 when it cannot try (no apt-get, or not root: callers skip); 1 when the install failed.
#   apt_locked COMMAND...         runs COMMAND holding $APT_LOCK: the test suite's workers (pytest -n 2) set
#                                 up what they need at once, and two apt-gets at a time fail on dpkg's lock.
APT_LOCK=${APT_LOCK:-/tmp/tessera-apt.lock}
apt_locked() { flock "$APT_LOCK" "$@"; }

apt_install() {
  local what=$1 out
  shift
  command -v apt-get >/dev/null || { log "$what is not installed and there is no apt-get to install it"; exit 3; }
  [ "$(id -u)" -eq 0 ] || { log "$what is not installed and installing it needs root (apt-get install $*)"; exit 3; }
  out=$(mktemp)
  log "installing $* (apt-get update, then apt-get install)"
  if ! { DEBIAN_FRONTEND=noninteractive apt_locked apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive apt_locked apt-get install -y -qq --no-install-recommends "$@"; } >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    log "apt-get install $* failed"
    exit 1
  fi
  rm -f "$out"
}
