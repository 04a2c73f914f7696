"""`tessera data convert --mode resume` stores every input row exactly once.

- Resuming a completed conversion is a no-op that says so: "already complete: N samples in M shards;
  nothing to do", exit 0, no file written or touched.
- A conversion killed with SIGKILL (a real `tessera` process) at a chosen point and then resumed holds
  each input row exactly once, byte for byte the dataset an uninterrupted conversion writes. The points:
  before a shard file lands (mid-shards), right after one landed (before the journal names it), during
  the final index.json write (its temp file written, not renamed) and after it (journal not yet deleted).
- A resume that is not one (another input's write, a dataset that records no conversion of this input,
  rows that do not line up with the shards the journal kept) is refused with one line, nothing written;
  `verify` flags source rows stored twice, naming both shards.

How a kill lands at a point: the killed process runs the same CLI (`tessera.cli.main.main`) under an
audit hook (`sys.addaudithook`, a standard Python mechanism; nothing in src/ knows of it) that stops the
process with SIGSTOP at the file operation named (an `os.replace` onto a shard or index.json, the folder
fsync after a shard's rename, the journal's removal), the thread at that point going no further. The test
waits for the stop (waitpid WUNTRACED), then SIGKILLs the process group: a kill at exactly that point,
every run (other threads are wherever the stop found them, as with any kill). The process journals every
confirmed shard (`JOURNAL_INTERVAL = 0`, as a long conversion does once a second) and cuts its input into
16 KiB chunks, so two workers share a single file; the resume, in this process, reads it as one chunk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import MDSDataset
from tessera.shards.errors import IndexFormatError
from tessera.shards.provenance import PROVENANCE_KEY, Provenance
from tessera.shards.session import JOURNAL_BASENAME

runner = CliRunner()
ROWS = 5000
OPTIONS = ["--size-limit", "16kb"]

STOPPER = r"""
import os, signal, sys, threading, time
journals, event, target = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import tessera.shards.sources as sources
import tessera.shards.writer as writer
writer.JOURNAL_INTERVAL = 0.0
sources.LINE_CHUNK = 16 << 10
seen = {"journals": 0}
shard_last = {}  # thread -> whether its last rename put a shard in place

def stop(name, args):
    if name not in ("os.rename", "os.remove", "open") or not args:  # os.replace is audited as os.rename
        return
    path, me = str(args[1] if name == "os.rename" else args[0]), threading.get_ident()
    if name == "os.rename":
        shard_last[me] = path.endswith(".mds")
        if shard_last[me] and journals:
            time.sleep(0.05)  # storing a shard takes a while (a disk, a bucket): journals come between
        seen["journals"] += path.endswith("index.partial.json")
    if name == event and path.endswith(target) and seen["journals"] >= journals and (
            name != "open" or shard_last.get(me)):
        print(f"stopped at {name} {path}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        while True:  # the stop may take effect after kill() returns: this thread goes no further
            time.sleep(60)

sys.addaudithook(stop)
from tessera.cli.main import main
sys.argv = ["tessera", *sys.argv[4:]]
sys.exit(main())
"""


def row(i: int, part: str = "") -> dict:
    return {"id": i, "text": f"{part}row {i} " + "x" * (i * 37 % 90)}


def write_input(root: Path, files: int) -> tuple[Path, list[dict]]:
    """5,000 rows: one JSONL file, or a folder of `files` JSONL files (one below a sub-folder)."""
    names = ["in.jsonl"] if files == 1 else ["a.jsonl", "b.jsonl", "c/d.jsonl"][:files]
    counts = [ROWS // files] * (files - 1) + [ROWS - ROWS // files * (files - 1)]
    rows = []
    for name, count in zip(names, counts, strict=True):
        path = root / "in" / name if files > 1 else root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        part = [row(len(rows) + i, name if files > 1 else "") for i in range(count)]
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        rows += part
    return (root / "in" if files > 1 else root / "in.jsonl"), rows


def tessera_here(*args: str, code: int = 0) -> str:
    """The CLI in this process; its stdout and stderr."""
    res = runner.invoke(app, list(args))
    assert res.exit_code == code, f"tessera {' '.join(args)} exited {res.exit_code}:\n{res.output[-3000:]}"
    return res.output


def error_line(output: str) -> str:
    """The one line of a refusal (after the progress bar's line)."""
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    return line


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below `folder` (hidden temp files too) with its bytes and modification time."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_exactly_once(out: Path, rows: list[dict]) -> None:
    """The dataset holds each input row once, in input order, and verify finds nothing wrong."""
    ds = MDSDataset(out)
    assert len(ds) == ROWS
    assert [{"id": int(s["id"]), "text": s["text"]} for s in ds] == rows
    assert f"ok: {len(json.loads((out / 'index.json').read_text())['shards'])} shards, 5,000 samples" \
        in tessera_here("data", "verify", str(out))


def kill_at(inp: Path, out: Path, journals: int, event: str, target: str, workers: int = 1) -> str:
    """Run `tessera data convert INP OUT` in a process of its own, stop it at the first `event` on a path
    ending in `target` once the journal was written `journals` times ("open" of the folder: its fsync
    right after a shard was renamed into place), SIGKILL it; the path it was stopped at."""
    proc = subprocess.Popen([sys.executable, "-c", STOPPER, str(journals), event, target, "data", "convert",
                             str(inp), str(out), "--workers", str(workers), *OPTIONS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        os.killpg(proc.pid, signal.SIGKILL)  # the conversion and its workers
    _, err = proc.communicate()
    assert os.WIFSTOPPED(status), f"the conversion ended before {event} {target}:\n{err.decode()[-2000:]}"
    return err.decode().rpartition(f"stopped at {event} ")[2].strip()


@pytest.mark.parametrize("workers,files", [(1, 1), (2, 3)])
def test_resuming_a_completed_conversion_writes_nothing(tmp_path: Path, workers: int, files: int) -> None:
    inp, rows = write_input(tmp_path, files)
    out = tmp_path / "out"
    tessera_here("data", "convert", str(inp), str(out), "--workers", str(workers), *OPTIONS)
    before = snapshot(out)
    shards = len(json.loads((out / "index.json").read_text())["shards"])
    for _ in range(2):
        said = tessera_here("data", "convert", str(inp), str(out), "--workers", str(workers), "--mode", "resume",
                            *OPTIONS)
        assert f"already complete: 5,000 samples in {shards} shards; nothing to do" in said
        assert snapshot(out) == before  # not a byte written, not a file touched
    assert_exactly_once(out, rows)


@pytest.mark.parametrize("point,workers,files", [
    ("mid-shards", 2, 1),
    ("after-a-shard", 1, 3),
    ("index-write", 1, 1),
    ("journal-delete", 2, 3),
])
def test_a_conversion_killed_then_resumed_holds_each_row_once(tmp_path: Path, point: str, workers: int,
                                                              files: int) -> None:
    inp, rows = write_input(tmp_path, files)
    out = tmp_path / "out"
    at = kill_at(inp, out, *{"mid-shards": (1, "os.rename", ".mds"),  # before a shard lands
                             "after-a-shard": (1, "open", str(out)),  # a shard landed, no journal names it
                             "index-write": (0, "os.rename", "/index.json"),  # index.json not yet in place
                             "journal-delete": (0, "os.remove", JOURNAL_BASENAME)}[point], workers=workers)
    journal = json.loads((out / JOURNAL_BASENAME).read_text())
    kept = {s["raw_data"]["basename"]: (out / s["raw_data"]["basename"]).read_bytes() for s in journal["shards"]}
    committing = journal["tessera_journal"]["state"] == "committing"
    assert committing == (point in ("index-write", "journal-delete"))
    assert (out / "index.json").exists() == (point == "journal-delete")
    if point == "mid-shards":
        shard = Path(at).name
        assert kept and shard not in kept and not (out / shard).exists()
    if point == "after-a-shard":
        shard = next(p.name for p in out.iterdir() if p.name.endswith(".mds") and p.stat().st_mtime_ns ==
                     max(q.stat().st_mtime_ns for q in out.glob("shard.*.mds")))
        assert at == str(out) and kept and shard not in kept

    said = tessera_here("data", "convert", str(inp), str(out), "--workers", str(workers), "--mode", "resume",
                        *OPTIONS, "--json")
    summary = json.loads(said.strip().splitlines()[-1])
    if committing:  # everything was stored: the resume only finishes the commit
        assert (summary["status"], summary["samples"], summary["skipped"]) == ("committed", ROWS, 0)
    else:
        kept_samples = sum(s["samples"] for s in journal["shards"])
        assert (summary["status"], summary["samples"], summary["skipped"]) == ("written", ROWS, kept_samples)
    assert not (out / JOURNAL_BASENAME).exists()
    assert {name: (out / name).read_bytes() for name in kept} == kept  # the confirmed shards were kept as they were
    assert_exactly_once(out, rows)
    tessera_here("data", "convert", str(inp), str(tmp_path / "fresh"), *OPTIONS)
    assert {k: v[0] for k, v in snapshot(out).items() if not k.startswith(".")} == \
        {k: v[0] for k, v in snapshot(tmp_path / "fresh").items()}  # byte for byte an uninterrupted conversion
    done = snapshot(out)
    assert "already complete: 5,000 samples" in tessera_here("data", "convert", str(inp), str(out), "--mode",
                                                             "resume", *OPTIONS)
    assert snapshot(out) == done


def test_a_resume_with_another_input_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.shards import sources

    inp, _ = write_input(tmp_path, 1)
    lines = inp.read_text().splitlines(keepends=True)
    bad = tmp_path / "bad" / "in.jsonl"
    bad.parent.mkdir()
    bad.write_text("".join(lines[:4000]) + '{"id": 4000, "text": broken\n' + "".join(lines[4001:]))
    monkeypatch.setattr(sources, "LINE_CHUNK", 16 << 10)  # shards are stored before the bad line is read
    out = tmp_path / "out"
    said = tessera_here("data", "convert", str(bad), str(out), *OPTIONS, code=1)
    assert f"{bad}, line 4001: bad JSON" in said and (out / JOURNAL_BASENAME).exists()
    interrupted = snapshot(out)
    said = error_line(tessera_here("data", "convert", str(inp), str(out), "--mode", "resume", *OPTIONS, code=1))
    assert "the interrupted write (index.partial.json) was converting other input: " \
        "its input 1 was in.jsonl (size " in said and "resume with the same input and options" in said
    assert snapshot(out) == interrupted

    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(row(0)) + "\n")
    done = tmp_path / "done"
    tessera_here("data", "convert", str(inp), str(done), *OPTIONS)
    said = error_line(tessera_here("data", "convert", str(other), str(done), "--mode", "resume", *OPTIONS, code=1))
    assert "holds a committed dataset (5,000 samples in" in said
    assert "1 of this command's 1 inputs are not among them (first: other.jsonl): there is nothing to resume; " \
        "pass --mode append" in said


def test_a_resume_whose_rows_do_not_line_up_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.shards import ShardWriter, sources

    inp, _ = write_input(tmp_path, 1)
    lines = inp.read_text().splitlines(keepends=True)
    inp.write_text("".join(lines[:4000]) + '{"id": 4000, "text": broken\n' + "".join(lines[4001:]))
    monkeypatch.setattr(sources, "LINE_CHUNK", 16 << 10)
    out = tmp_path / "out"
    tessera_here("data", "convert", str(inp), str(out), *OPTIONS, code=1)
    journal = json.loads((out / JOURNAL_BASENAME).read_text())
    record = journal["tessera_journal"]["extensions"][PROVENANCE_KEY]["shards"]["shard.00000.mds"]
    last = record[0][2]
    record[0][1:] = [1, last + 1]  # as if the rows of that shard were counted from 1
    (out / JOURNAL_BASENAME).write_text(json.dumps(journal, sort_keys=True))
    before = {k: v[0] for k, v in snapshot(out).items()}
    said = error_line(tessera_here("data", "convert", str(inp), str(out), "--mode", "resume", *OPTIONS, code=1))
    assert f"the interrupted write stored in.jsonl rows 1..{last + 1} in shard.00000.mds, but this input puts " \
           f"in.jsonl rows 0..{last} there: it is not the input that write was converting" in said
    assert {k: v[0] for k, v in snapshot(out).items()} == before

    # A journal that records no input (a ShardWriter's) is continued by its sample count: a shorter input
    # cannot be the one it was writing.
    with pytest.raises(RuntimeError), ShardWriter(tmp_path / "w", {"id": "int", "text": "str"},
                                                  size_limit="16kb") as writer:
        writer.journal_interval = 0
        for i in range(2000):
            writer.write(row(i))
        raise RuntimeError("interrupted")
    stored = json.loads((tmp_path / "w" / JOURNAL_BASENAME).read_text())
    stored = sum(shard["samples"] for shard in stored["shards"])
    short = tmp_path / "short.jsonl"
    short.write_text("".join(lines[:1000]))
    said = error_line(tessera_here("data", "convert", str(short), str(tmp_path / "w"), "--mode", "resume", code=1))
    assert f"the interrupted write stored {stored:,} samples, but this input has only 1,000" in said and stored > 1000


def test_verify_flags_source_rows_stored_twice(tmp_path: Path) -> None:
    inp, rows = write_input(tmp_path, 1)
    out = tmp_path / "out"
    tessera_here("data", "convert", str(inp), str(out), *OPTIONS)
    index = json.loads((out / "index.json").read_text())
    # What a second resume that appended would have left: the last two shards' rows again, in new shards.
    n = len(index["shards"])
    prov = index[PROVENANCE_KEY]["shards"]
    for k, entry in enumerate(index["shards"][-2:]):
        copy = json.loads(json.dumps(entry))
        name = copy["raw_data"]["basename"] = f"shard.{n + k:05}.mds"
        (out / name).write_bytes((out / entry["raw_data"]["basename"]).read_bytes())
        prov[name] = prov[entry["raw_data"]["basename"]]
        index["shards"].append(copy)
    (out / "index.json").write_text(json.dumps(index, sort_keys=True))
    said = tessera_here("data", "verify", str(out), code=1)
    first, last = prov[f"shard.{n - 2:05}.mds"][0][1], prov[f"shard.{n - 1:05}.mds"][0][2]
    assert f"in.jsonl rows {first}..{prov[f'shard.{n - 2:05}.mds'][0][2]} are stored twice: in shard {n - 2} " \
           f"(shard.{n - 2:05}.mds) and in shard {n} (shard.{n:05}.mds)" in said
    assert f"rows {prov[f'shard.{n - 1:05}.mds'][0][1]}..{last} are stored twice: in shard {n - 1} " \
           f"(shard.{n - 1:05}.mds) and in shard {n + 1} (shard.{n + 1:05}.mds)" in said
    assert "2 problem(s)" in said and first > 0
    assert len(MDSDataset(out)) == ROWS + sum(r[2] - r[1] + 1 for r in prov[f"shard.{n - 2:05}.mds"] +
                                              prov[f"shard.{n - 1:05}.mds"])

    # Appending the same input again is the same mistake, made with the CLI: every row twice.
    tessera_here("data", "convert", str(inp), str(tmp_path / "twice"), *OPTIONS)
    tessera_here("data", "convert", str(inp), str(tmp_path / "twice"), "--mode", "append", *OPTIONS)
    said = tessera_here("data", "verify", str(tmp_path / "twice"), "--quick", code=1)
    assert f"{n} problem(s)" in said and "in.jsonl rows 0.." in said and f"in shard {n} (shard.{n:05}.mds)" in said

    # Recorded rows that do not add up to a shard's samples are a problem too.
    index = json.loads((out / "index.json").read_text())
    index["shards"], index[PROVENANCE_KEY]["shards"]["shard.00000.mds"][0][2] = index["shards"][:n], 5
    (out / "index.json").write_text(json.dumps(index, sort_keys=True))
    said = tessera_here("data", "verify", str(out), "--quick", code=1)
    samples = index["shards"][0]["samples"]
    assert f"(shard 0): {PROVENANCE_KEY} records 6 rows for 'shard.00000.mds', which holds {samples} samples" in said
    assert rows  # the input the dataset came from


def test_a_dataset_without_provenance_is_not_resumed(tmp_path: Path) -> None:
    from tessera.shards import ShardWriter

    inp, _ = write_input(tmp_path, 1)
    out = tmp_path / "out"
    with ShardWriter(out, {"id": "int", "text": "str"}) as writer:
        writer.write(row(0))
    said = tessera_here("data", "convert", str(inp), str(out), "--mode", "resume", code=1)
    assert "holds a committed dataset (1 samples in 1 shards) and no interrupted write, and its index records " \
           f"no conversion ({PROVENANCE_KEY} is absent): there is nothing to resume" in said


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**63) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(st.one_of(JSON, st.fixed_dictionaries({"version": st.just(1), "inputs": st.lists(JSON, max_size=2),
                                              "shards": st.dictionaries(st.text(max_size=4), JSON, max_size=2)})))
def test_provenance_of_an_untrusted_index_parses_or_is_one_named_error(obj: object) -> None:
    try:
        found = Provenance.from_extensions({PROVENANCE_KEY: obj}, "ds/index.json")
    except IndexFormatError as exc:
        assert str(exc).startswith(f"ds/index.json: {PROVENANCE_KEY}: ")
        return
    assert found is None or all(0 <= i < len(found.inputs) and 0 <= a < b for segs in found.shards.values()
                                for i, a, b in segs)
