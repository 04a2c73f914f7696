"""MosaicML Streaming's own behaviour tests, run against Tessera: how many pass, file by file.

The tests are those of mosaicml-streaming 0.13.0 (the version the anchors pin), taken from its source
distribution on PyPI (`pip download --no-binary`); the helpers they import from `tests/common` are not in it,
so they are kept here (streaming_compat/tests_common, from the same release). `import streaming` resolves to
streaming_compat/streaming, which maps each name to Tessera's (see its docstring). Whatever differs from
MosaicML is then a failed test: a deliberate difference (docs/streaming.md, "Differences from MosaicML
Streaming") or a gap.

    .venv/bin/python benchmarks/streaming_own_tests.py                 # the six files, ~5-10 min on 2 cores
    .venv/bin/python benchmarks/streaming_own_tests.py --files mixing --failures
    .venv/bin/python benchmarks/streaming_own_tests.py --work /tmp/st  # keep the download for reruns

Prints a table per file, with `--failures` each failed test and the last line of its error, then one JSON
line with the counts (the last line of stdout).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

VERSION = "0.13.0"
FILES = ["streaming", "reader", "mixing", "eviction", "local", "laziness"]
HERE = Path(__file__).resolve().parent
SHIM = HERE / "streaming_compat"
CONFTEST = """from tests.common.utils import compressed_local_remote_dir, local_remote_dir  # noqa: F401
"""
PYTEST_INI = """[pytest]
markers =
    world_size(val): MosaicML's distributed tests
    daily: MosaicML's daily regression
    remote: reads from a remote source
"""


def fetch_tests(work: Path) -> Path:
    """The release's tests/ folder under `work`, downloaded once, with the helpers and a conftest that
    needs no moto (the six files use only its two folder fixtures)."""
    tests = work / f"streaming-{VERSION}" / "tests"
    if (tests / "test_streaming.py").exists():
        return tests
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    f"mosaicml-streaming=={VERSION}", "-d", str(work)], check=True)
    archive = work / f"mosaicml_streaming-{VERSION}.tar.gz"
    root = f"mosaicml_streaming-{VERSION}/tests/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(root) and m.isfile()]
        for m in members:
            m.name = m.name[len(root):]
        tar.extractall(tests, members=members, filter="data")
    common = tests / "common"
    common.mkdir(exist_ok=True)
    for name in ("__init__.py", "utils.py", "datasets.py"):
        shutil.copy(SHIM / "tests_common" / name, common / name)
    for test in tests.glob("test_*.py"):  # pytest 9 refuses a mark on a fixture (it never had an effect)
        text = test.read_text()
        test.write_text(re.sub(r"@pytest\.mark\.usefixtures\([^)]*\)\n(@pytest\.fixture)", r"\1", text))
    (tests / "__init__.py").write_text("")
    (tests / "conftest.py").write_text(CONFTEST)
    (tests.parent / "pytest.ini").write_text(PYTEST_INI)
    return tests


def run(tests: Path, files: list[str], junit: Path, timeout: int) -> int:
    """pytest on the files, with `streaming` resolved to the shim; its exit code."""
    env = {**_env(), "PYTHONPATH": f"{SHIM}:{tests.parent}"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           f"--timeout={timeout}", "-W", "ignore::DeprecationWarning",
           *[f"tests/test_{f}.py" for f in files]]
    return subprocess.run(cmd, cwd=tests.parent, env=env, stdout=subprocess.DEVNULL).returncode


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def counts(junit: Path) -> tuple[dict[str, dict[str, int]], list[tuple[str, str]]]:
    """Per test file: passed, failed (errors included), skipped; and each failure with its last line."""
    table: dict[str, dict[str, int]] = {}
    failures = []
    for case in ET.parse(junit).iter("testcase"):
        file = case.get("classname", "").split(".")[1]
        row = table.setdefault(file, {"passed": 0, "failed": 0, "skipped": 0})
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            row["failed"] += 1
            last = (bad.get("message") or "").strip().splitlines()
            failures.append((f"{file}::{case.get('name')}", last[0][:160] if last else ""))
        elif case.find("skipped") is not None:
            row["skipped"] += 1
        else:
            row["passed"] += 1
    return table, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default=",".join(FILES), help="test files (names after test_), comma-separated")
    parser.add_argument("--work", type=Path, help="keep the download here (default: a temp folder)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument("--failures", action="store_true", help="list each failed test")
    args = parser.parse_args()
    files = [f.strip() for f in args.files.split(",") if f.strip()]
    work = args.work or Path(tempfile.mkdtemp(prefix="streaming-tests-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        tests = fetch_tests(work)
        junit = work / "junit.xml"
        run(tests, files, junit, args.timeout)
        table, failures = counts(junit)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    total = {k: sum(row[k] for row in table.values()) for k in ("passed", "failed", "skipped")}
    ran = total["passed"] + total["failed"]
    print(f"{'file':<24}{'passed':>8}{'failed':>8}{'skipped':>9}")
    for file, row in sorted(table.items()):
        print(f"{file:<24}{row['passed']:>8}{row['failed']:>8}{row['skipped']:>9}")
    print(f"{'total':<24}{total['passed']:>8}{total['failed']:>8}{total['skipped']:>9}"
          f"   {total['passed']}/{ran} = {100 * total['passed'] / max(ran, 1):.1f}%")
    if args.failures:
        for name, why in failures:
            print(f"FAILED {name}: {why}")
    print(json.dumps({"version": VERSION, "files": table, "total": total}))


if __name__ == "__main__":
    main()
