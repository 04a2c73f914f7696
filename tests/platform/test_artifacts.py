"""Shared artifacts (issue 23, section 2): run files, logs and metrics under one storage root, a folder or
an S3 bucket (SeaweedFS), with one code path. Logs and metrics are shipped from the local files a run
writes in chunks (runs/chunks.py, runs/shipping.py) and read back by any reader: followed while they grow,
per node, rank and resumption; a shipper that crashes between writing a chunk and noting it neither
duplicates nor loses a byte; secret values never reach the store; no name reaches it as a path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tessera.cli.server import app as server_cli
from tessera.platform.runs import shipping
from tessera.platform.runs.artifacts import ArtifactStore
from tessera.platform.runs.chunks import ArtifactError, Chain
from tessera.platform.runs.info import Resumption, Run
from tessera.platform.runs.logs import follow
from tessera.platform.runs.metrics import read_metrics
from tessera.platform.runs.shipping import Shipper, adopt_history, ship_history
from tessera.platform.secrets.redaction import Redactor
from tessera.platform.spec.run_spec import RunSpec
from tessera.storage import Store, open_store

SECRET = "hunter2-very-secret"
REDACT = Redactor([SECRET])


@pytest.fixture(params=["folder", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An artifacts root: a folder, or a fresh bucket on the SeaweedFS server."""
    if request.param == "folder":
        return str(tmp_path / "artifacts")
    return request.getfixturevalue("s3_bucket") + "/tessera"


def make_spec(name: str = "job", nodes: int = 1, procs: int = 1) -> RunSpec:
    return RunSpec.model_validate({"name": name, "command": "true", "parameters": {"lr": 0.1, "tags": ["a"]},
                                   "compute": {"cluster": "local", "nodes": nodes, "procs_per_node": procs}})


def make_run(spec: RunSpec, ended: list[bool], status: str = "RUNNING", run_id: str = "0123abcd") -> Run:
    """A Run with a resumption per entry of `ended` (True: that resumption has ended)."""
    resumptions = [Resumption(i, "local", "submitted", "RUNNING", None, [], 0.0, 0.0, 1.0 if done else None,
                              None, None, None, f"/nowhere/r{i}", None) for i, done in enumerate(ended)]
    return Run(run_id, spec.name, status, "local", spec, 0.0, 0.0, None, "/nowhere", resumptions=resumptions)


class LocalRun:
    """The files a run's processes append to, per resumption: node-R.log and metrics.jsonl."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def res(self, index: int) -> Path:
        path = self.folder / f"r{index}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write(self, index: int, name: str, data: bytes) -> None:
        with open(self.res(index) / name, "ab") as f:
            f.write(data)

    def ship(self, shipper: Shipper, artifacts: ArtifactStore, index: int, nodes: int = 1,
             final: bool = False) -> int:
        folder = self.res(index)
        return shipper.ship_resumption(artifacts, "0123abcd", index, folder,
                                       [folder / f"node-{n}.log" for n in range(nodes)], lambda: REDACT, final)


def shipped_bytes(chain: Chain) -> bytes:
    chunks, _ = chain.read()
    return b"".join(c.payload for c in chunks)


class Follower:
    """A reader that polls a chain as `follow` does: what it has read so far, chunk by chunk."""

    def __init__(self, chain: Chain) -> None:
        self.chain, self.next, self.data = chain, 0, b""

    def poll(self) -> bytes:
        chunks, _ = self.chain.read(self.next)
        self.next += len(chunks)
        self.data += b"".join(c.payload for c in chunks)
        return self.data


# --- run files --------------------------------------------------------------------------------------


def test_run_files_are_written_whole_under_team_and_run_id(root: str, tmp_path: Path) -> None:
    artifacts = ArtifactStore.open(root, "red")
    spec = make_spec()
    artifacts.put_run_files("0123abcd", spec)
    store = open_store(root)
    assert sorted(i.key for i in store.list()) == ["red/runs/0123abcd/parameters.yaml", "red/runs/0123abcd/spec.yaml"]
    assert RunSpec.model_validate(yaml.safe_load(store.get("red/runs/0123abcd/spec.yaml"))) == spec
    assert yaml.safe_load(store.get("red/runs/0123abcd/parameters.yaml")) == {"lr": 0.1, "tags": ["a"]}
    edited = spec.model_copy(update={"command": "false"})
    artifacts.put_spec("0123abcd", edited)
    assert RunSpec.model_validate(yaml.safe_load(store.get("red/runs/0123abcd/spec.yaml"))) == edited

    folder = tmp_path / "elsewhere" / "job"          # a replica that did not take the submission
    artifacts.place_run_files("0123abcd", edited, folder)
    assert yaml.safe_load((folder / "parameters.yaml").read_text()) == {"lr": 0.1, "tags": ["a"]}
    assert RunSpec.model_validate(yaml.safe_load((folder / "spec.yaml").read_text())) == edited
    assert (folder / "parameters.yaml").stat().st_mode & 0o777 == 0o600
    (folder / "parameters.yaml").write_text("lr: 0.2\n")  # what the host has is kept
    artifacts.place_run_files("0123abcd", edited, folder)
    assert yaml.safe_load((folder / "parameters.yaml").read_text()) == {"lr": 0.2}
    assert ArtifactStore.open(root, "blue").run_prefix("0123abcd") == "blue/runs/0123abcd/"

    artifacts.delete_run("0123abcd")
    assert list(store.list()) == []


# --- logs -------------------------------------------------------------------------------------------


def test_logs_are_followed_while_the_run_writes_per_resumption_and_rank(root: str, tmp_path: Path) -> None:
    artifacts = ArtifactStore.open(root, "red")
    local, shipper = LocalRun(tmp_path / "run"), Shipper()
    spec = make_spec(nodes=2, procs=2)               # ranks 0,1 on node 0; ranks 2,3 on node 1
    state = {"run": make_run(spec, [False])}
    lines = follow(artifacts, lambda: state["run"], REDACT, poll=0.01)

    local.write(0, "node-0.log", b"[default0]:zero a\n[default1]:one a\n[default0]:zero ")
    local.write(0, "node-1.log", b"[default0]:two a\n")
    local.ship(shipper, artifacts, 0, nodes=2)
    got = [next(lines) for _ in range(3)]
    assert got == ["[node 0] [default0]:zero a", "[node 0] [default1]:one a", "[node 1] [default0]:two a"]

    # the held-back half line, and a secret, arrive with the next chunk
    local.write(0, "node-0.log", f"b {SECRET}\n".encode())
    local.ship(shipper, artifacts, 0, nodes=2)
    assert next(lines) == "[node 0] [default0]:zero b ****"

    # resumption 0 ends with a line that has no newline; resumption 1 starts and is followed on
    local.write(0, "node-1.log", b"[default0]:two last")
    local.ship(shipper, artifacts, 0, nodes=2, final=True)
    local.write(1, "node-0.log", b"[default0]:zero again\n")
    local.ship(shipper, artifacts, 1, nodes=2)
    state["run"] = make_run(spec, [True, False])
    assert [next(lines) for _ in range(2)] == ["[node 1] [default0]:two last", "[node 0] [default0]:zero again"]
    local.ship(shipper, artifacts, 1, nodes=2, final=True)
    state["run"] = make_run(spec, [True, True], status="COMPLETED")
    assert list(lines) == []

    done = make_run(spec, [True, True], status="COMPLETED")
    rank1 = list(follow(artifacts, lambda: done, REDACT, rank=1, resumption=0, follow=False))
    assert rank1 == ["[default1]:one a"]
    rank2 = list(follow(artifacts, lambda: done, REDACT, rank=2, resumption=0, follow=False))
    assert rank2 == ["[default0]:two a", "[default0]:two last"]
    assert list(follow(artifacts, lambda: done, REDACT, follow=False)) == ["[node 0] [default0]:zero again"]
    # the store holds no secret value: it was masked before it left the host
    store = open_store(root)
    assert all(SECRET.encode() not in store.get(i.key) for i in store.list())


def test_a_log_longer_than_a_page_is_read_whole_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipping, "CHUNK_LIMIT", 64)
    monkeypatch.setattr("tessera.platform.runs.logs.READ_LIMIT", 300)
    artifacts = ArtifactStore.open(str(tmp_path / "artifacts"), "red")
    local = LocalRun(tmp_path / "run")
    expected = [f"line {i:04d} " + "x" * (i % 50) for i in range(200)]
    local.write(0, "node-0.log", ("\n".join(expected) + "\n").encode())
    local.ship(Shipper(), artifacts, 0, final=True)
    assert len(list(artifacts.log_chain("0123abcd", 0, 0).listed())) > 100
    run = make_run(make_spec(), [True], status="COMPLETED")
    assert list(follow(artifacts, lambda: run, REDACT, follow=False)) == expected


def test_between_passes_live_resumptions_are_shipped_until_their_final_ship(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass registers the resumption it ships; `ship_live` (the loop between passes) ships what came
    since; the final ship ends that; one no pass has seen for LIVE_FOR (its lease went elsewhere) is dropped."""
    artifacts = ArtifactStore.open(str(tmp_path / "artifacts"), "red")
    local, shipper = LocalRun(tmp_path / "run"), Shipper()
    chain = artifacts.log_chain("0123abcd", 0, 0)
    local.write(0, "node-0.log", b"one\n")
    local.ship(shipper, artifacts, 0)
    local.write(0, "node-0.log", b"two\n")
    assert shipper.ship_live() == 4 and shipped_bytes(chain) == b"one\ntwo\n"
    local.write(0, "node-0.log", b"three")
    assert local.ship(shipper, artifacts, 0, final=True) == 5
    local.write(0, "node-0.log", b"\nlate\n")
    assert shipper.ship_live() == 0 and shipped_bytes(chain) == b"one\ntwo\nthree"

    local.ship(shipper, artifacts, 1)
    monkeypatch.setattr(shipping, "LIVE_FOR", 0.0)
    local.write(1, "node-0.log", b"elsewhere\n")
    assert shipper.ship_live() == 0 and shipper.live == {}


# --- crashes and races --------------------------------------------------------------------------------


class CrashAfterPut(Store):
    """A store whose conditional put lands and then 'crashes' the caller (the process dies before it
    notes the chunk; or the answer is lost on the way), every `every`-th time."""

    def __init__(self, inner: Store, every: int) -> None:
        self.inner, self.every, self.count = inner, every, 0
        self.url, self.retry = inner.url, inner.retry

    def put_if_absent(self, key: str, data: bytes) -> bool:
        wrote = self.inner.put_if_absent(key, data)
        self.count += 1
        if self.count % self.every == 0:
            raise ConnectionError(f"crashed after writing {key}")
        return wrote

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    # the abstract methods, forwarded
    def get(self, key): return self.inner.get(key)  # noqa: E704
    def get_range(self, key, start, end): return self.inner.get_range(key, start, end)  # noqa: E704
    def get_ranges(self, key, ranges): return self.inner.get_ranges(key, ranges)  # noqa: E704
    def put(self, key, data): return self.inner.put(key, data)  # noqa: E704
    def put_file(self, key, path): return self.inner.put_file(key, path)  # noqa: E704
    def _put_create(self, key, data): return self.inner._put_create(key, data)  # noqa: E704
    def head(self, key): return self.inner.head(key)  # noqa: E704
    def list(self, prefix="", *, start_after=""): return self.inner.list(prefix, start_after=start_after)  # noqa: E704
    def delete(self, key): return self.inner.delete(key)  # noqa: E704
    def copy(self, src, dst): return self.inner.copy(src, dst)  # noqa: E704
    def child(self, prefix): return self.inner.child(prefix)  # noqa: E704
    def url_for(self, key): return self.inner.url_for(key)  # noqa: E704


@pytest.mark.parametrize("restart", [True, False], ids=["new-shipper", "same-shipper"])
def test_a_crash_between_shipping_and_noting_neither_duplicates_nor_loses(root: str, tmp_path: Path,
                                                                          restart: bool) -> None:
    """Every 3rd chunk 'crashes' after it was written. A new shipper (a restarted supervisor, another
    replica taking over) or the same one (a lost answer) goes on: the chain holds the file exactly."""
    artifacts = ArtifactStore(CrashAfterPut(open_store(root), every=3), "red")
    local, shipper = LocalRun(tmp_path / "run"), Shipper()
    follower = Follower(artifacts.log_chain("0123abcd", 0, 0))
    written = b""
    for i in range(12):
        line = f"step {i} {'y' * i}\n".encode()
        local.write(0, "node-0.log", line)
        local.write(0, "metrics.jsonl", b'{"step": %d}\n' % i)
        written += line
        for _ in range(3):            # each crash is followed by another pass
            try:
                local.ship(shipper, artifacts, 0)
                break
            except ConnectionError:
                shipper = Shipper() if restart else shipper
                local.write(0, "node-0.log", b"more\n")     # the run goes on printing meanwhile
                written += b"more\n"
            finally:
                follower.poll()
    assert follower.poll() == written            # read as it came: every chunk seen once, never rewritten
    assert shipped_bytes(artifacts.log_chain("0123abcd", 0, 0)) == written
    assert read_metrics(artifacts, "0123abcd", REDACT) == ([{"step": i} for i in range(12)], 12)


def test_a_stale_shipper_cannot_rewrite_what_another_shipped(root: str, tmp_path: Path) -> None:
    """Two supervisors ship one file (one paused past its lease, one took the run over): the one that
    writes behind the chain's end is refused by the store and goes on after it; a follower reads each
    byte once."""
    artifacts = ArtifactStore.open(root, "red")
    local, old, new = LocalRun(tmp_path / "run"), Shipper(), Shipper()
    follower = Follower(artifacts.log_chain("0123abcd", 0, 0))
    local.write(0, "node-0.log", b"one\n")
    assert local.ship(old, artifacts, 0) == 4
    assert local.ship(new, artifacts, 0) == 0                # learns the end from the chain
    local.write(0, "node-0.log", b"two\n")
    assert local.ship(new, artifacts, 0) == 4
    assert follower.poll() == b"one\ntwo\n"
    local.write(0, "node-0.log", b"three\n")
    assert local.ship(old, artifacts, 0) == 6                # tried seq 1 from byte 4: refused, went on
    assert local.ship(new, artifacts, 0) == 0
    assert follower.poll() == b"one\ntwo\nthree\n"
    assert [c.start for c in artifacts.log_chain("0123abcd", 0, 0).read()[0]] == [0, 4, 8]


# --- metrics ----------------------------------------------------------------------------------------


def test_metrics_continue_across_resumptions_masked_and_paged(root: str, tmp_path: Path) -> None:
    artifacts = ArtifactStore.open(root, "red")
    local, shipper = LocalRun(tmp_path / "run"), Shipper()
    local.write(0, "metrics.jsonl", b'{"step": 1, "loss": 2.5}\nnot json\n{"step": 2, "note": "' + SECRET.encode()
                + b'"}\n{"step": 3, "lo')
    local.ship(shipper, artifacts, 0)
    rows, position = read_metrics(artifacts, "0123abcd", REDACT)
    assert rows == [{"step": 1, "loss": 2.5}, {"step": 2, "note": "****"}] and position == 1
    assert read_metrics(artifacts, "0123abcd", REDACT, position) == ([], 1)    # the half line waits
    local.write(0, "metrics.jsonl", b'ss": 1.5}\n')
    local.ship(shipper, artifacts, 0, final=True)
    local.write(1, "metrics.jsonl", b'{"step": 3, "loss": 1.25}\n')   # a resumed run starts a new file
    local.ship(shipper, artifacts, 1)
    assert read_metrics(artifacts, "0123abcd", REDACT, position) == (
        [{"step": 3, "loss": 1.5}, {"step": 3, "loss": 1.25}], 3)
    assert read_metrics(artifacts, "0123abcd", Redactor([]), 0, limit=1)[1] == 1      # one chunk a page
    assert read_metrics(artifacts, "0123abcd", REDACT, 99) == ([], 99)
    with pytest.raises(ValueError, match="metrics position must be an integer >= 0"):
        read_metrics(artifacts, "0123abcd", REDACT, -1)
    # a secret created after the rows were shipped is masked when they are read
    assert read_metrics(artifacts, "0123abcd", Redactor([SECRET, "1.25"]), 2)[0] == [{"step": 3, "loss": "****"}]


def test_a_metrics_line_longer_than_a_chunk_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipping, "CHUNK_LIMIT", 40)
    artifacts = ArtifactStore.open(str(tmp_path / "artifacts"), "red")
    local = LocalRun(tmp_path / "run")
    local.write(0, "metrics.jsonl", b'{"step": 1}\n' + b'{"x": "' + b"x" * 100 + b'"}\n{"step": 2}\n')
    local.ship(Shipper(), artifacts, 0)
    assert read_metrics(artifacts, "0123abcd", REDACT) == ([{"step": 1}, {"step": 2}], 5)


def test_logs_of_a_home_from_before_artifacts_are_shipped_once_when_read(tmp_path: Path) -> None:
    """An imported home's run has its logs and metrics in its local folders only: the first read ships
    them (the run's one metrics.jsonl as its last resumption's); shipping again ships nothing."""
    artifacts = ArtifactStore.open(str(tmp_path / "artifacts"), "local")
    run_folder = tmp_path / "runs" / "old"
    for i in (0, 1):
        (run_folder / f"r{i}").mkdir(parents=True)
        (run_folder / f"r{i}" / "node-0.log").write_bytes(f"resumption {i}\n".encode())
    (run_folder / "metrics.jsonl").write_bytes(b'{"step": 1}\n{"step": 2}\n')
    old = make_run(make_spec("old"), [True, True], status="COMPLETED", run_id="0123abcd")
    old = Run(**{**old.__dict__, "folder": str(run_folder),
                 "resumptions": [Resumption(**{**r.__dict__, "folder": str(run_folder / f"r{r.index}")})
                                 for r in old.resumptions]})
    assert adopt_history(artifacts, old.id, lambda: old, lambda: REDACT) == 2 * 13 + 24
    assert adopt_history(artifacts, old.id, lambda: old, lambda: REDACT) == 0      # looked at once
    resumptions = [(r.index, Path(r.folder), 1) for r in old.resumptions]
    assert ship_history(artifacts, old.id, run_folder, resumptions, lambda: REDACT) == 0   # the chains know
    assert list(follow(artifacts, lambda: old, REDACT, resumption=0, follow=False)) == ["resumption 0"]
    assert list(follow(artifacts, lambda: old, REDACT, follow=False)) == ["resumption 1"]
    assert read_metrics(artifacts, old.id, REDACT) == ([{"step": 1}, {"step": 2}], 1)


# --- a real run ---------------------------------------------------------------------------------------


WRITER = """
import json, os, sys, time
print("one", flush=True)
with open(os.environ["TESSERA_METRICS"], "a") as f:
    f.write(json.dumps({"step": 1, "loss": 2.5}) + "\\n")
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("two", end="", flush=True)
"""


def test_a_real_run_is_followed_through_an_s3_artifacts_root(s3_bucket: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             request: pytest.FixtureRequest) -> None:
    """The standalone CLI's supervisor ships a live run's log to the bucket, where a follower reads it."""
    monkeypatch.setenv("TESSERA_ARTIFACTS_URL", s3_bucket + "/art")
    platform = request.getfixturevalue("platform")
    script, go = tmp_path / "writer.py", tmp_path / "go"
    script.write_text(WRITER)
    run = platform.create_run({"name": "live", "command": f"{sys.executable} {script} {go}",
                               "parameters": {"lr": 0.5}, "compute": {"cluster": "local"}})
    lines = platform.follow_logs("live")
    assert next(lines) == "one"
    assert platform.get_run("live").status == "RUNNING"        # seen while the command runs
    go.touch()
    assert list(lines) == ["two"]                               # the last line, without its newline
    assert platform.get_run("live").status == "COMPLETED"
    store = open_store(s3_bucket + "/art")
    keys = sorted(i.key for i in store.list())
    prefix = f"local/runs/{run.id}/"
    assert keys[-2:] == [prefix + "parameters.yaml", prefix + "spec.yaml"]
    assert {k.rsplit("/", 1)[0] for k in keys[:-2]} == {prefix + "logs/r0/node-0", prefix + "metrics"}
    assert yaml.safe_load(store.get(prefix + "parameters.yaml")) == {"lr": 0.5}
    assert RunSpec.model_validate(yaml.safe_load(store.get(prefix + "spec.yaml"))) == run.spec
    assert read_metrics(platform.artifacts, run.id, REDACT) == ([{"step": 1, "loss": 2.5}], 1)
    assert not (platform.home / "artifacts").exists()
    platform.delete_run("live")
    assert list(store.list()) == []


@pytest.mark.parametrize(("url", "code", "message"), [
    ("s3:/bucket/x", 2, "s3:/bucket/x: a URL needs two slashes after 's3:' (write s3://bucket/x)"),
    ("s3://no-such-bucket-tessera/x", 1, "BucketNotFound: s3://no-such-bucket-tessera/x: bucket does not exist"),
])
def test_a_bad_artifacts_url_stops_the_server_in_one_line(tmp_path: Path, url: str, code: int, message: str,
                                                          request: pytest.FixtureRequest) -> None:
    if url.startswith("s3://"):
        request.getfixturevalue("s3_bucket")          # the SeaweedFS server and its credentials
    result = CliRunner().invoke(server_cli, ["start", "--home", str(tmp_path / "home"), "--artifacts", url])
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output


# --- names --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("team", "run_id", "resumption", "node", "message"), [
    ("../red", "0123abcd", 0, 0, "team name '../red' is refused"),
    ("red/x", "0123abcd", 0, 0, "team name 'red/x' is refused"),
    ("red", "../../etc", 0, 0, "run id '../../etc' is refused"),
    ("red", "a/b", 0, 0, "run id 'a/b' is refused"),
    ("red", ".hidden", 0, 0, "run id '.hidden' is refused"),
    ("red", "0123abcd", -1, 0, "resumption must be an integer >= 0, got -1"),
    ("red", "0123abcd", "0/../1", 0, "resumption must be an integer >= 0, got '0/../1'"),
    ("red", "0123abcd", 0, "../0", "node rank must be an integer >= 0, got '../0'"),
])
def test_path_traversal_in_a_name_is_refused(tmp_path: Path, team, run_id, resumption, node, message) -> None:
    root = tmp_path / "artifacts"
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        ArtifactStore.open(str(root), team).log_chain(run_id, resumption, node)
    assert not root.exists() and not (tmp_path / "etc").exists()


def test_a_chunk_not_written_by_tessera_is_a_clear_error(tmp_path: Path) -> None:
    artifacts = ArtifactStore.open(str(tmp_path / "artifacts"), "red")
    chain = artifacts.log_chain("0123abcd", 0, 0)
    artifacts.store.put(chain.key(0), b"no header here")
    with pytest.raises(ArtifactError, match=r"red/runs/0123abcd/logs/r0/node-0/000000000000\.chunk: not a log "
                                            r"chunk written by Tessera \(no header line\)"):
        chain.read()
