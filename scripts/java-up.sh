#!/usr/bin/env bash
# Make sure a Java runtime Spark can use (17 or newer) is installed; print its JAVA_HOME on stdout.
#
#   scripts/java-up.sh        (installs Debian's openjdk-17-jre-headless with apt-get if needed; root)
#
# Used by the Spark tests (tests/shards/test_spark_to_mds.py) before they start a local Spark session.
# Exit status 3: no suitable Java and no apt-get to install one (callers skip); other non-zero: failure.
set -euo pipefail
log() { echo "java-up: $*" >&2; }
source "$(dirname "$0")/apt-install.sh"

major() {  # the major version of the java on PATH, 0 if none
  command -v java >/dev/null || { echo 0; return; }
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1
}

if [ "$(major)" -lt 17 ]; then
  command -v apt-get >/dev/null || { log "no Java 17+ and no apt-get to install one"; exit 3; }
  export DEBIAN_FRONTEND=noninteractive
  pkg=$(apt-cache pkgnames openjdk- 2>/dev/null | grep -E '^openjdk-(17|21|25)-jre-headless$' | sort -V | head -1 || true)
  if [ -z "$pkg" ]; then
    log "updating the package lists"
    apt_locked apt-get update -qq >&2
    pkg=$(apt-cache pkgnames openjdk- | grep -E '^openjdk-(17|21|25)-jre-headless$' | sort -V | head -1 || true)
  fi
  [ -n "$pkg" ] || { log "no openjdk 17+ headless JRE package found"; exit 3; }
  log "installing $pkg (apt-get)"
  apt_locked apt-get install -y -qq "$pkg" >&2
fi
[ "$(major)" -ge 17 ] || { log "java on PATH is still older than 17"; exit 1; }
dirname "$(dirname "$(readlink -f "$(command -v java)")")"
