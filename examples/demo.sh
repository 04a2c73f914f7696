#!/usr/bin/env bash
# `make demo`: the quickstart (examples/quickstart.py), then a storage round trip through the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python examples/quickstart.py
