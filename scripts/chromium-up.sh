#!/usr/bin/env bash
# Make sure Debian's `chromium` is installed; print the browser binary's path on stdout.
#
#   scripts/chromium-up.sh    (installs the `chromium` package with apt-get if needed; root)
#
# Used by the web console's browser test (tests/server/test_console.py), which drives this browser with
# Playwright's `executable_path`: Playwright's own browser download is never used, so nothing but
# Debian's package archive is fetched. Idempotent and quiet: an installed chromium is only looked up.
# Exit status 3: no chromium and no way to install it (no apt-get, or not root; callers skip);
# other non-zero: the installation failed.
set -euo pipefail
log() { echo "chromium-up: $*" >&2; }

find_chromium() {  # the first browser binary on PATH, or nothing
  local name
  for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null; then command -v "$name"; return; fi
  done
}

path=$(find_chromium || true)
if [ -z "$path" ]; then
  command -v apt-get >/dev/null || { log "chromium is not installed and there is no apt-get to install it"; exit 3; }
  [ "$(id -u)" -eq 0 ] || { log "chromium is not installed and installing it needs root (apt-get install chromium)"; exit 3; }
  export DEBIAN_FRONTEND=noninteractive
  out=$(mktemp)
  trap 'rm -f "$out"' EXIT
  quiet_apt_get() {  # apt-get quietly; its output is shown only when it fails
    apt-get "$@" >"$out" 2>&1 || { cat "$out" >&2; log "apt-get $* failed"; exit 1; }
  }
  log "installing chromium (apt-get update, then apt-get install chromium)"
  quiet_apt_get update -qq
  quiet_apt_get install -y -qq --no-install-recommends chromium
  path=$(find_chromium || true)
  [ -n "$path" ] || { log "chromium was installed but no chromium binary is on PATH"; exit 1; }
fi
echo "$path"
