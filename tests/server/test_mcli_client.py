"""The real `mcli` client (mosaicml-cli 0.8.3 from PyPI) against a real `tessera server start` on 127.0.0.1,
unchanged: MOSAICML_API_ENDPOINT=http://127.0.0.1:PORT/graphql and MOSAICML_API_KEY=<a key made by
`tessera server admin create-user`> (issue 25, section 2).

The client lives in a virtual environment of its own: its pins (rich<14, ...) are not ours. The first run
makes it, once per machine, under $TESSERA_TEST_CACHE (default: <temp dir>/tessera-test-cache) in a folder
named by the version, `mcli-0.8.3` (about 45 s: pip from PyPI); later runs reuse it (a `.complete` file
marks it whole; a lock file keeps two test processes from building it at once). Delete the folder to
build it again.

One server for the module (conftest.py's `server`: users alice, team red, and bob, team blue). The CLI
steps are one user's session in order: clusters, run, list, describe, logs (whole, --tail, --follow), a
running run shown RUNNING, made preemptible, stopped, deleted (soft: listed with --include-deleted). The SDK flow and the websocket subprotocols run as scripts
in the client's environment. Every process is bounded by a timeout.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

# Building the client's environment (first run on a machine) counts against the first test's time.
pytestmark = pytest.mark.timeout(900)
MCLI_VERSION = "0.8.3"
TIMEOUT = 120          # seconds any one mcli process may take
SCRIPTS = Path(__file__).with_name("mcli_scripts")


def mcli_venv() -> Path:
    """The client's virtual environment, made on first use (see the module's docstring)."""
    cache = Path(os.environ.get("TESSERA_TEST_CACHE") or Path(tempfile.gettempdir()) / "tessera-test-cache")
    folder = cache / f"mcli-{MCLI_VERSION}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"mcli-{MCLI_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            venv.EnvBuilder(with_pip=True).create(folder)
            done = subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q",
                                   "--disable-pip-version-check", f"mosaicml-cli=={MCLI_VERSION}"],
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"pip install mosaicml-cli=={MCLI_VERSION} into {folder} failed (PyPI needed once): "
                            f"{done.stderr.strip()[-1500:]}")
            (folder / ".complete").write_text(MCLI_VERSION)
    return folder


@pytest.fixture(scope="module")
def client(server, tmp_path_factory: pytest.TempPathFactory):
    """(the venv, the environment mcli runs with as alice, a work folder); a local cluster `cpu` that runs
    commands on the host (container_runtime none: MCLI's YAML needs an image, this machine may have docker)."""
    folder = mcli_venv()
    work = tmp_path_factory.mktemp("mcli")
    env = {"PATH": f"{folder / 'bin'}:/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8", "COLUMNS": "250",
           "TERM": "dumb", "MCLI_CONFIG_DIR": str(work / "mosaic"), "MCLI_DISABLE_UPGRADE_CHECK": "true",
           "MOSAICML_API_ENDPOINT": f"{server.url}/graphql", "MOSAICML_API_KEY": server.keys["alice"]}
    with server.client("alice") as api:
        api.post("clusters", json={"name": "cpu", "type": "local", "config": {"container_runtime": "none"}}
                 ).raise_for_status()
    return folder, env, work


def mcli(client, *args: str, answer: str | None = None) -> str:
    """`mcli ARGS` (answering a confirmation with `answer`); its stdout. Fails on a non-zero exit."""
    folder, env, work = client
    done = subprocess.run([str(folder / "bin" / "mcli"), *args], input=answer, capture_output=True, text=True,
                          env=env, cwd=work, timeout=TIMEOUT)
    assert done.returncode == 0, f"mcli {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def mcli_at_once(client, *commands: list[str]) -> list[str]:
    """Several `mcli` commands started together (each its own process, as in several terminals)."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda args: mcli(client, *args), commands))


def script(client, name: str, *args: str, env: dict[str, str | None] | None = None) -> dict:
    """A script of mcli_scripts/ run by the client's Python (`env`: changes; None removes a variable); the
    JSON it prints last."""
    folder, base, work = client
    merged = {k: v for k, v in {**base, **(env or {})}.items() if v is not None}
    done = subprocess.run([str(folder / "bin" / "python"), str(SCRIPTS / name), *args], capture_output=True,
                          text=True, env=merged, cwd=work, timeout=TIMEOUT)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_status(server, name: str, wanted: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with server.client("alice") as api:
        while (status := api.get(f"runs/{name}").raise_for_status().json()["status"]) != wanted:
            assert time.monotonic() < deadline, f"run {name} is {status}, not {wanted}, after {timeout} s"
            time.sleep(0.1)


def output_lines(text: str) -> list[str]:
    """A run's own lines (Tessera's notes, `tessera: ...`, left out)."""
    return [line for line in text.splitlines() if line and not line.startswith("tessera:")]


def write_run(work: Path, name: str, command: str, extra: str = "") -> Path:
    path = work / f"{name}.yaml"
    path.write_text(f"name: {name}\nimage: python:3.11\ncompute:\n  cluster: cpu\n  gpus: 0\n{extra}"
                    f"command: |\n" + "".join(f"  {line}\n" for line in command.splitlines()))
    return path


def row(listing: str, name: str) -> str:
    return next(line for line in listing.splitlines() if line.startswith(name + " "))


def test_cli_session(server, client) -> None:
    """The eight steps of a MosaicML user's session, with the real CLI (independent commands at once)."""
    _, _, work = client
    ticks = "sleep 2\nfor i in 1 2 3; do echo tick $i; sleep 0.5; done"
    hello = write_run(work, "hello", 'echo "hello from mcli"\necho second line')
    # without retries on system failure, MCLI's table names a deleted run "NAME (Deleted)" (else "NAME 🐕")
    long = write_run(work, "long", "echo long-started\nsleep 120", "scheduling:\n  retry_on_system_failure: false\n")
    clusters, *_ = mcli_at_once(client, ["get", "clusters"], ["run", "-f", str(hello)],
                                ["run", "-f", str(long)],
                                ["run", "-f", str(write_run(work, "ticks", ticks))])
    assert [line.split()[0] for line in clusters.splitlines() if line.split()[:1] in (["cpu"], ["local"])] == \
        ["cpu", "local"]
    server.wait_done("alice", "hello")
    wait_status(server, "long", "RUNNING")

    listing, described, logs, tail, followed, _ = mcli_at_once(
        client, ["get", "runs"], ["describe", "run", "hello"], ["logs", "hello"], ["logs", "hello", "--tail", "1"],
        ["logs", "ticks", "--follow"], ["update", "run", "long", "--preemptible"])
    assert row(listing, "hello").split()[:5] == ["hello", "cpu", "1", "cpu", "Completed"]
    assert row(listing, "long").split()[:5] == ["long", "cpu", "1", "cpu", "Running"]
    assert "Run Name               hello" in described and "Status                 Completed" in described
    assert "User                   alice" in described and 'echo "hello from mcli"' in described
    assert output_lines(logs) == ["hello from mcli", "second line"]
    assert output_lines(tail) == ["second line"]
    assert output_lines(followed) == ["tick 1", "tick 2", "tick 3"]
    with server.client("alice") as api:
        running = api.get("runs/long").raise_for_status().json()
    assert running["spec"]["scheduling"]["preemptible"] is True and running["status"] == "RUNNING"
    assert running["events"][-1]["message"] == "scheduling updated: preemptible: False -> True"

    mcli(client, "stop", "run", "long", answer="y\n")
    wait_status(server, "long", "STOPPED")
    mcli(client, "delete", "run", "long", answer="y\n")
    with server.client("alice") as api:
        assert api.get("runs/long").status_code == 404
    listing, with_deleted = mcli_at_once(client, ["get", "runs"], ["get", "runs", "--include-deleted"])
    names = [line.split()[0] for line in listing.splitlines()[1:] if line.strip()]
    assert "long" not in names and {"hello", "ticks"} <= set(names)
    assert row(with_deleted, "long").split()[:6] == ["long", "(Deleted)", "cpu", "1", "cpu", "Stopped"]


def test_sdk_flow(server, client) -> None:
    """The SDK as MosaicML documents it: initialize, RunConfig.from_file, create_run, wait_for_run_status,
    get_run_logs; then update, filters, stop, delete and secrets, all in one process."""
    _, _, work = client
    path = write_run(work, "sdk-run", "echo sdk says hi\necho and bye")
    got = script(client, "sdk_flow.py", str(path), server.keys["alice"], env={"MOSAICML_API_KEY": None})
    assert got["created"] == {"name": "sdk-run", "status_known": True, "cluster": "cpu"}
    assert got["waited"] == "COMPLETED"
    assert output_lines(got["logs"]) == ["sdk says hi", "and bye"]
    assert got["updated"] == {"priority": "LOW", "max_retries": 2, "preemptible": True,
                              "retry_on_system_failure": False}
    assert ["sdk-run", "COMPLETED"] in got["completed_on_cpu"]
    assert {status for _, status in got["completed_on_cpu"]} == {"COMPLETED"}
    assert got["stopped"] == "STOPPED" and got["deleted"] is True and got["after_delete"] == []
    assert got["with_deleted"] == [["sdk-long", True]]
    assert got["secret_made"] == {"name": "sdk-token", "type": "environment", "key": "SDK_TOKEN"}
    assert got["secrets_after_delete"] == []
    with server.client("alice") as api:
        assert [s["name"] for s in api.get("secrets").raise_for_status().json()["secrets"]] == []


def test_websocket_subprotocols_and_refused_key(server, client) -> None:
    """Both subprotocols stream the log (base64 chunks, byte offsets) and the status; a bad key gets an
    error on each operation over either one, and mcli's own log call ends with it (no silent retrying)."""
    got = script(client, "subscriptions.py", "hello", server.keys["alice"])
    whole = b"".join(base64.b64decode(c) for c, _ in got["graphql-ws"]["chunks"])
    assert output_lines(whole.decode()) == ["hello from mcli", "second line"]
    for proto in ("graphql-ws", "graphql-transport-ws"):
        assert got[proto]["subprotocol"] == proto
        assert got[proto]["chunks"][-1][1] == len(whole)
        assert got[proto]["resumed"] == [[base64.b64encode(b"second line\n").decode(), len(whole)]]
        assert got[proto]["status"] == ["COMPLETED"]
        assert got[proto]["bad_key"] == [{"message": "invalid or revoked API key",
                                          "extensions": {"code": 401, "problem": "unauthorized"}}]
    assert got["mcli_bad_key"] == "MAPIException: Error 400: invalid or revoked API key"


def graphql(server, query: str, variables: dict, key: str | None) -> dict:
    headers = {"Authorization": key} if key else {}
    answer = httpx.post(f"{server.url}/graphql", json={"query": query, "variables": variables}, headers=headers,
                        timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


RUNS = ("query Q($d: GetRunsPaginatedInput!) { getRunsPaginated(getRunsPaginatedData: $d) "
        "{ cursor hasNextPage runs { name status } } }")
CREATE = "mutation C($d: CreateRunInput!) { createRun(createRunData: $d) { name } }"


def test_errors_codes_paging_and_teams(server, client) -> None:
    """Errors as errors[].extensions.code (the HTTP status mcli reads) and a stable problem code; teams see
    only their runs; cursor paging visits each run once."""
    alice, bob = server.keys["alice"], server.keys["bob"]
    missing = graphql(server, RUNS.replace("name status", "name"), {"d": {}}, None)["errors"][0]
    assert missing["extensions"] == {"code": 401, "problem": "unauthorized"}
    assert graphql(server, "mutation S($d: GetRunsInput!) { stopRuns(getRunsData: $d) { name } }",
                   {"d": {"filters": {"name": {"in": ["nope"]}}}}, alice)["errors"][0]["extensions"] == \
        {"code": 404, "problem": "run_not_found"}
    bad = graphql(server, CREATE, {"d": {"runInput": {"name": "bad", "image": "x", "command": "true",
                                                      "gpuNum": 0, "cpus": 0, "enviroment": 1}}}, bob)["errors"][0]
    assert bad["extensions"] == {"code": 422, "problem": "spec_invalid"}
    assert "enviroment: unknown key" in bad["message"]
    unknown_filter = graphql(server, RUNS, {"d": {"filters": {"owner": {"in": ["x"]}}}}, alice)["errors"][0]
    assert "owner" in unknown_filter["message"]

    for name in ("page-a", "page-b"):
        made = graphql(server, CREATE, {"d": {"runInput": {"runName": name, "image": "python:3.11", "command": "true",
                                                          "compute": {"cluster": "cpu", "gpus": 0}}}}, alice)
        assert made == {"data": {"createRun": [{"name": name}]}}
        server.wait_done("alice", name)
    assert graphql(server, RUNS, {"d": {}}, bob)["data"]["getRunsPaginated"]["runs"] == []
    seen, cursor = [], None
    while True:
        page = graphql(server, RUNS, {"d": {"limit": 1, "cursor": cursor}}, alice)["data"]["getRunsPaginated"]
        seen += [r["name"] for r in page["runs"]]
        cursor = page["cursor"]
        assert page["hasNextPage"] is (cursor is not None)
        if cursor is None:
            break
    with server.client("alice") as api:
        listed = [r["name"] for r in api.get("runs", params={"limit": 100}).raise_for_status().json()["items"]]
    assert seen == listed and len(seen) == len(set(seen)) >= 2
    completed = graphql(server, RUNS, {"d": {"filters": {"status": {"in": ["Completed"]}}}}, alice)
    assert {r["status"] for r in completed["data"]["getRunsPaginated"]["runs"]} == {"COMPLETED"}
    for window, expected in (({"gte": "2000-01-01T00:00:00Z"}, listed), ({"lt": "2000-01-01T00:00:00+00:00"}, [])):
        dated = graphql(server, RUNS, {"d": {"filters": {"createdAt": window, "gpuNum": {"in": [0]}}}}, alice)
        assert [r["name"] for r in dated["data"]["getRunsPaginated"]["runs"]] == expected
    bad_date = graphql(server, RUNS, {"d": {"filters": {"createdAt": {"lt": "yesterday"}}}}, alice)["errors"][0]
    assert bad_date == {"message": "createdAt.lt: 'yesterday' is not an ISO 8601 time",
                        "locations": [{"line": 1, "column": 39}], "path": ["getRunsPaginated"],
                        "extensions": {"code": 400, "problem": "value_invalid"}}
    someone = graphql(server, RUNS, {"d": {"entity": {"emails": ["carol"]}}}, alice)
    assert someone["data"]["getRunsPaginated"]["runs"] == []
    team = graphql(server, RUNS, {"d": {"entity": {"organizationIds": ["red"]}, "limit": 100}}, alice)
    assert [r["name"] for r in team["data"]["getRunsPaginated"]["runs"]] == listed


GET_RUNS = ("query G($d: GetRunsInput!) { getRuns(getRunsData: $d) { id name isDeleted preemptible "
            "retryOnSystemFailure } }")
DELETE = "mutation D($d: GetRunsInput!) { deleteRuns(getRunsData: $d) { id name isDeleted } }"
UPDATE = ("mutation U($g: GetRunsInput!, $u: UpdateRunInput!) { updateRun(getRunsData: $g, updateRunData: $u) "
          "{ name preemptible retryOnSystemFailure } }")


def test_deleted_runs_free_their_name_and_show_on_request(server, client) -> None:
    """deleteRuns keeps the record: includeDeleted shows it (isDeleted), REST and the default lists do
    not, and its name can be submitted again (twice: two deleted runs share it). The new update fields
    through REST (PATCH) and GraphQL (updateRun)."""
    alice, by_name = server.keys["alice"], {"filters": {"name": {"in": ["again"]}}}
    ids: list[str] = []
    with server.client("alice") as api:
        def submit() -> None:
            made = api.post("runs", json={"spec": {"name": "again", "command": "true", "compute": {"cluster": "cpu"}}})
            assert made.status_code == 201, made.text
            ids.append(made.json()["id"])

        for _ in range(2):
            submit()
            server.wait_done("alice", "again")
            gone = graphql(server, DELETE, {"d": by_name}, alice)["data"]["deleteRuns"]
            assert gone == [{"id": ids[-1], "name": "again", "isDeleted": True}]
            assert api.get("runs/again").status_code == 404
        submit()
        patched = api.patch("runs/again", json={"preemptible": True, "retry_on_system_failure": False})
        assert patched.status_code == 200, patched.text
        assert {k: patched.json()["spec"]["scheduling"][k] for k in ("preemptible", "retry_on_system_failure")} \
            == {"preemptible": True, "retry_on_system_failure": False}
        assert patched.json()["events"][-1]["message"] == \
            "scheduling updated: preemptible: False -> True, retry_on_system_failure: True -> False"
        refused = api.patch("runs/again", json={"preemptible": "sometimes"})
        assert refused.status_code == 422 and "preemptible" in refused.text
        listed = api.get("runs", params={"q": "again"}).raise_for_status().json()
    assert [(r["id"], r["name"]) for r in listed["items"]] == [(ids[2], "again")] and listed["total"] == 1

    live = graphql(server, GET_RUNS, {"d": by_name}, alice)["data"]["getRuns"]
    assert live == [{"id": ids[2], "name": "again", "isDeleted": False, "preemptible": True,
                     "retryOnSystemFailure": False}]
    every = graphql(server, GET_RUNS, {"d": {**by_name, "includeDeleted": True}}, alice)["data"]["getRuns"]
    assert [(r["id"], r["isDeleted"]) for r in every] == [(ids[2], False), (ids[1], True), (ids[0], True)]
    paged = graphql(server, RUNS.replace("name status", "id isDeleted"), {"d": {"includeDeleted": True, "limit": 100}},
                    alice)["data"]["getRunsPaginated"]["runs"]
    assert [r for r in paged if r["id"] in ids] == [{"id": i, "isDeleted": i != ids[2]} for i in reversed(ids)]
    back = graphql(server, UPDATE, {"g": by_name, "u": {"preemptible": False, "retryOnSystemFailure": True}}, alice)
    assert back == {"data": {"updateRun": [{"name": "again", "preemptible": False, "retryOnSystemFailure": True}]}}


@pytest.mark.parametrize("mapi, expected", [
    ({"runName": "a", "image": "i", "command": " x ", "gpuNum": 16, "cpus": 0, "parentName": None,
      "envVariables": [{"envKey": "K", "envValue": "v"}], "dependentDeployment": {},
      "integrations": [{"type": "git_repo", "params": {"gitRepo": "o/r", "pipInstall": "-e ."}}],
      "scheduling": {"maxRetries": 1, "retryOnSystemFailure": True}, "compute": {"gpuType": "a100_40gb"}},
     {"name": "a", "image": "i", "command": " x ", "gpu_num": 16, "cpus": 0, "env_variables": {"K": "v"},
      "integrations": [{"integration_type": "git_repo", "git_repo": "o/r", "pip_install": "-e ."}],
      "scheduling": {"max_retries": 1, "retry_on_system_failure": True}, "compute": {"gpu_type": "a100_40gb"}}),
])
def test_run_input_reads_as_mcli_yaml(mapi: dict, expected: dict) -> None:
    from tessera.platform.server.graphql.run_input import original_run_input, to_mcli_yaml
    from tessera.platform.spec.mcli import to_run_spec

    assert to_mcli_yaml(mapi) == expected
    spec = to_run_spec(expected)
    back = original_run_input(spec, "c")
    assert back["compute"] == {"cluster": "c", "gpus": 16, "gpuType": "a100_40gb", "nodes": 2}
    assert to_run_spec(to_mcli_yaml({**back, "compute": {**back["compute"], "cluster": None}})) == \
        spec.model_copy(update={"compute": spec.compute.model_copy(update={"cluster": None})})


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40),
                max_size=30), st.data())
def test_log_chunks_resume_at_their_offsets(lines: list[str], data: st.DataObject) -> None:
    """Chunks from any line boundary are the log's bytes from there, ending at the offsets they name, so a
    client that resumes at the last endOffset it saw gets the rest exactly once."""
    from tessera.platform.server.graphql import logs

    whole = "".join(line + "\n" for line in lines).encode()
    cut = data.draw(st.integers(0, len(lines)))
    start = len("".join(line + "\n" for line in lines[:cut]).encode())
    chunks = list(logs._Chunker(start).chunks(lines))
    assert b"".join(base64.b64decode(c.chunk) for c in chunks) == whole[start:]
    ends = [c.end_offset for c in chunks]
    assert ends == sorted(set(ends)) and (not chunks or ends[-1] == len(whole))
