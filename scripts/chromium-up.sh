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
source "$(dirname "$0")/apt-install.sh"

find_chromium() {  # the first browser binary on PATH, or nothing
  local name
  for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null; then command -v "$name"; return; fi
  done
}

path=$(find_chromium || true)
if [ -z "$path" ]; then
  apt_install chromium chromium
  path=$(find_chromium || true)
  [ -n "$path" ] || { log "chromium was installed but no chromium binary is on PATH"; exit 1; }
fi
echo "$path"
