#!/usr/bin/env bash
# The main job, for now: a storage round trip through the `tessera` CLI against a local "bucket" folder.
# (Issue 6 turns this into the full quickstart: tokenizer, shards, training, kill + autoresume, eval.)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=demo-out
rm -rf "$OUT" && mkdir -p "$OUT/src/sub" "$OUT/bucket"
echo "== make some files"
$BIN/python - <<'PY'
import os, pathlib
root = pathlib.Path("demo-out/src")
(root / "hello.txt").write_text("hello from tessera\n")
(root / "sub" / "random.bin").write_bytes(os.urandom(24 << 20))
PY
echo "== tessera storage cp -r demo-out/src file://demo-out/bucket/data"
$BIN/tessera storage cp -r "$OUT/src" "file://$PWD/$OUT/bucket/data"
echo "== tessera storage ls"
$BIN/tessera storage ls "$OUT/bucket/data"
echo "== copy back and compare"
$BIN/tessera storage cp -r "$OUT/bucket/data" "$OUT/back"
cmp "$OUT/src/sub/random.bin" "$OUT/back/sub/random.bin"
cmp "$OUT/src/hello.txt" "$OUT/back/hello.txt"
echo "== tessera storage rm -r"
$BIN/tessera storage rm -r "$OUT/bucket/data"
echo "demo ok: round trip byte-exact"
