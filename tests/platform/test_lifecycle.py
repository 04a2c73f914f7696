"""The run lifecycle verbs MCLI users expect, on the local cluster with a real supervisor: delete, update,
clone, list with filters and pages, metrics read incrementally, Run.from_dict, and an old state.db
without the runs' user column imported."""

from __future__ import annotations

import getpass
import json
import sys
import time
from pathlib import Path

import pytest
import yaml
from old_home import build_old_home
from platform_helpers import wait_for
from sqlalchemy import event, text

from tessera.platform import Platform, Run, RunFailed, RunNotFound, RunStateError, SpecError
from tessera.platform.api import sdk
from tessera.platform.store.models import run_leases
from tessera.platform.store.state import PENDING, RunRecord, new_run_id

TIMEOUT = 30


def spec(name: str, command: str, **scheduling) -> dict:
    return {"name": name, "command": command, "compute": {"cluster": "local", "procs_per_node": 1},
            "scheduling": {"max_retries": 2, "stop_grace": "2s", **scheduling}}


# --- delete ---------------------------------------------------------------------------------------


def test_delete_stops_an_active_run_first_and_refuses_one_that_will_not_stop(
        platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "pid"
    # SIGTERM is ignored, so only the SIGKILL after stop_grace (+2 s in the supervisor) ends it
    platform.create_run(spec("stubborn", f"trap '' TERM; echo $$ > {pid_file}; echo up; exec sleep 60"))
    platform.wait_for_run_status("stubborn", "RUNNING", timeout=TIMEOUT)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the pid file"))
    folder = Path(platform.get_run("stubborn").folder)

    monkeypatch.setattr(sdk, "STOP_MARGIN", 0.0)     # wait only stop_grace: shorter than the SIGKILL
    with pytest.raises(RunStateError, match="did not stop within 2 s"):
        platform.delete_run("stubborn")
    assert platform.get_run("stubborn").status in ("RUNNING", "STOPPING") and folder.is_dir()

    monkeypatch.undo()
    platform.delete_run("stubborn")
    with pytest.raises(RunNotFound):
        platform.get_run("stubborn")
    assert not folder.exists()
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=10, what=f"process {pid} to be gone")
    # resumptions and events went with the record
    with platform.db.engine.connect() as c:
        for table in ("resumptions", "events"):
            assert c.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar() == 0
    with pytest.raises(RunNotFound):
        platform.delete_run("stubborn")


# --- a finished run: from_dict, clone, delete -----------------------------------------------------


def test_finished_run_round_trips_through_json_clones_and_deletes(platform: Platform, tmp_path: Path) -> None:
    platform.add_cluster("other", "local")
    platform.create_run({**spec("orig", "echo hello"), "parameters": {"lr": 0.5}}, user="alice")
    run = platform.wait_for_run_status("orig", "COMPLETED", timeout=TIMEOUT)
    assert run.user == "alice" and run.to_dict()["user"] == "alice"
    assert run.resumptions and run.events

    wire = json.loads(json.dumps(run.to_dict()))
    rebuilt = Run.from_dict(wire)
    assert rebuilt == run and rebuilt.to_dict() == run.to_dict()
    assert Run.from_dict({**wire, "added_by_a_newer_server": 1}) == run

    clone = platform.clone_run("orig", "orig-2", cluster="other", gpus=2)
    assert (clone.name, clone.cluster, clone.user) == ("orig-2", "other", getpass.getuser())
    assert clone.id != run.id and clone.spec.compute.gpus_per_node == 2
    assert clone.spec.model_dump(exclude={"name", "compute"}) == run.spec.model_dump(exclude={"name", "compute"})
    assert yaml.safe_load((Path(clone.folder) / "parameters.yaml").read_text()) == {"lr": 0.5}
    with pytest.raises(SpecError, match="exists"):
        platform.clone_run("orig", "orig-2")
    with pytest.raises(SpecError, match="gpus_per_node"):
        platform.clone_run("orig", "orig-3", gpus=100000)

    platform.delete_run("orig")
    with pytest.raises(RunNotFound):
        platform.get_run("orig")
    assert not Path(run.folder).exists()
    assert [r.name for r in platform.list_runs()] == ["orig-2"]


# --- update ---------------------------------------------------------------------------------------


def test_update_is_bounded_like_submit_stored_and_recorded(platform: Platform) -> None:
    platform.create_run(spec("queued", "true"), supervise=False)
    for kwargs, key in (({"max_retries": 1001}, "max_retries"), ({"max_retries": -1}, "max_retries"),
                        ({"priority": "urgent"}, "priority"), ({"max_duration": "400d"}, "max_duration"),
                        ({"max_duration": "soon"}, "max_duration")):
        with pytest.raises(SpecError) as refused:
            platform.update_run("queued", **kwargs)
        message = str(refused.value)
        assert f"scheduling.{key}" in message and "queued" in message and "\n" not in message, message
    with pytest.raises(SpecError, match="nothing to update"):
        platform.update_run("queued")
    with pytest.raises(RunNotFound):
        platform.update_run("nope", max_retries=1)

    run = platform.update_run("queued", priority="high", max_duration="1h30m", max_retries=7)
    assert (run.spec.scheduling.priority, run.spec.scheduling.max_duration, run.spec.scheduling.max_retries) == \
        ("high", 5400.0, 7)
    stored = yaml.safe_load((Path(run.folder) / "spec.yaml").read_text())
    assert stored["scheduling"]["max_retries"] == 7
    [event] = [e for e in run.events if e.kind == "updated"]
    assert "max_retries: 2 -> 7" in event.message and "max_duration: - -> 1h30m" in event.message


def test_supervisor_honours_lowered_max_retries_and_max_duration(platform: Platform) -> None:
    # a crash (SIGKILL) is retried; with 1000 retries allowed it would go on far past the timeout
    platform.create_run(spec("crashy", "kill -9 $$", max_retries=1000))
    wait_for(lambda: len(platform.get_run("crashy").resumptions) >= 2, what="a retried crash")
    platform.update_run("crashy", max_retries=0)
    with pytest.raises(RunFailed, match="gave up"):
        platform.wait_for_run_status("crashy", "COMPLETED", timeout=TIMEOUT)
    run = platform.get_run("crashy")
    assert run.status == "FAILED" and run.failure_kind == "crash"

    platform.create_run(spec("long", "echo up; exec sleep 60"))
    wait_for(lambda: (r := platform.get_run("long").resumptions) and r[0].start and time.time() - r[0].start > 1,
             what="one second of running time")
    platform.update_run("long", max_duration=1)
    with pytest.raises(RunFailed, match="max_duration"):
        platform.wait_for_run_status("long", "COMPLETED", timeout=TIMEOUT)
    assert platform.get_run("long").failure_kind == "max_duration"


# --- list -----------------------------------------------------------------------------------------


def test_list_filters_pages_and_counts_with_bulk_queries(platform: Platform) -> None:
    for i, user in enumerate(["alice", "bob", "alice", "carol", "alice"]):
        platform.create_run(spec(f"job-{i}", "true"), user=user, supervise=False)
    platform.create_run(spec("other-run", "true"), supervise=False)
    run_id = platform.get_run("job-1").id
    platform.db.update_run(run_id, status="FAILED")

    names = [r.name for r in platform.list_runs()]
    assert names == ["other-run", "job-4", "job-3", "job-2", "job-1", "job-0"]   # newest first
    assert platform.get_run("other-run").user == getpass.getuser()
    assert [r.name for r in platform.list_runs(user="alice")] == ["job-4", "job-2", "job-0"]
    first = platform.run_page(user="alice", limit=2)
    assert ([r.name for r in first.items], first.total) == (["job-4", "job-2"], 3)
    last = platform.run_page(user="alice", limit=2, cursor=first.next_cursor)
    assert ([r.name for r in last.items], last.next_cursor) == (["job-0"], None)
    assert [r.name for r in platform.list_runs(status="failed")] == ["job-1"]
    assert [r.name for r in platform.list_runs(q="JOB-3")] == ["job-3"]
    assert [r.name for r in platform.list_runs(status="PENDING", q="job", user="alice", limit=1)] == ["job-4"]
    assert platform.list_runs(q="%") == [] and platform.list_runs(user="nobody") == []
    assert platform.count_runs() == 6 and platform.count_runs(user="alice") == 3
    assert platform.count_runs(status=["PENDING"], q="job") == 4 and platform.count_runs(cluster="elsewhere") == 0
    with pytest.raises(ValueError, match="unknown run status"):
        platform.count_runs(status="SLEEPING")

    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if statement.startswith("SELECT"):    # not BEGIN and COMMIT
            statements.append(statement)
    event.listen(platform.db.engine, "before_cursor_execute", count)
    runs = platform.list_runs()
    event.remove(platform.db.engine, "before_cursor_execute", count)
    assert len(runs) == 6 and all(r.events for r in runs)
    assert len(statements) <= 3, statements     # runs, resumptions, events: not two queries per run


def test_descriptions_of_a_page_are_describe_runs_answers_read_at_once(platform: Platform) -> None:
    """What MCLI's run lists and the API's verbs answer: `describe_runs` (a page) and `run_detail` (the run
    a verb returned) give exactly `describe_run`'s dicts, leases included, in a fixed number of queries."""
    made = [platform.create_run(spec(f"d-{i}", "true"), supervise=False) for i in range(5)]
    assert [platform.run_detail(run) for run in made] == [platform.describe_run(run.name) for run in made]
    for run in made:   # finished: deleting them starts no supervisor, whose leases would race the ones below
        platform.db.update_run(run.id, status="COMPLETED")
    with platform.db.engine.begin() as c:
        c.execute(run_leases.insert().values(run_id=made[1].id, owner="replica-a", token=1, heartbeat=1.0,
                                             expires=99.0))
        c.execute(run_leases.insert().values(run_id=made[2].id, owner=None, token=2, heartbeat=1.0, expires=0.0))
    platform.delete_run("d-3", soft=True)
    platform.delete_run("d-4")
    ids = [made[i].id for i in (2, 0, 3, 1, 4, 0)]     # any order, a soft-deleted, a deleted and a repeated id

    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if statement.startswith("SELECT"):
            statements.append(statement)
    event.listen(platform.db.engine, "before_cursor_execute", count)
    live, every = platform.describe_runs(ids), platform.describe_runs(ids, include_deleted=True)
    event.remove(platform.db.engine, "before_cursor_execute", count)
    assert live == [platform.describe_run(made[i].id) for i in (2, 0, 1)]
    assert every == [platform.describe_run(made[i].id, include_deleted=True) for i in (2, 0, 3, 1)]
    assert [d["supervisor"] for d in every] == [None, None, None, {"replica": "replica-a", "lease_expires": 99.0}]
    assert every[2]["deleted"] is not None and platform.describe_runs([]) == []
    assert len(statements) == 2 * 5, statements   # secrets, runs, resumptions, events, leases: none per run


# --- metrics --------------------------------------------------------------------------------------


METRICS_WRITER = """
import json, os, sys, time
go = sys.argv[1]
with open(os.environ["TESSERA_METRICS"], "a") as f:
    for step in (1, 2):
        f.write(json.dumps({"step": step, "loss/train": 3.0 - step}) + "\\n")
    f.write('{"step": 3, "loss/tr')          # a line still being written
    f.flush()
    while not os.path.exists(go):
        time.sleep(0.05)
    f.write('ain": 0.5}\\nnot json\\n' + json.dumps({"step": 4, "loss/train": 0.25}) + "\\n")
"""


def test_metrics_are_read_incrementally_from_the_artifacts(platform: Platform, tmp_path: Path) -> None:
    """The run appends to its resumption's metrics.jsonl; the supervisor ships complete lines to the
    artifacts store, where run_metrics pages through them (positions are the `next` of each answer)."""
    script, go = tmp_path / "writer.py", tmp_path / "go"
    script.write_text(METRICS_WRITER)
    platform.create_run(spec("plots", f"{sys.executable} {script} {go}"))
    rows, offset = wait_for(lambda: (got := platform.run_metrics("plots"))[0] and got, what="metrics")
    assert rows == [{"step": 1, "loss/train": 2.0}, {"step": 2, "loss/train": 1.0}]
    assert platform.run_metrics("plots", offset) == ([], offset)     # the partial line is not returned
    go.touch()
    platform.wait_for_run_status("plots", "COMPLETED", timeout=TIMEOUT)
    rows, end = platform.run_metrics("plots", offset)
    assert rows == [{"step": 3, "loss/train": 0.5}, {"step": 4, "loss/train": 0.25}]
    assert (Path(platform.get_run("plots").resumptions[0].folder) / "metrics.jsonl").read_text().count("\n") == 5
    assert platform.run_metrics("plots", end) == ([], end)
    with pytest.raises(ValueError, match="metrics position must be an integer >= 0"):
        platform.run_metrics("plots", -1)
    with pytest.raises(RunNotFound):
        platform.run_metrics("nope")


# --- an old state.db ------------------------------------------------------------------------------


def test_an_old_state_db_without_the_user_column_is_imported(tmp_path: Path) -> None:
    """A version-1 state.db (no runs.user): its runs arrive in the store with no user, beside new ones."""
    build_old_home(tmp_path, 2, version=1)
    platform = Platform(tmp_path)
    now = time.time()
    platform.db.insert_run(RunRecord(new_run_id(), "fresh", spec("fresh", "true"), PENDING, "local", now, now,
                                     str(tmp_path), user="dora"))
    platform = Platform(tmp_path)              # opening again imports nothing twice
    assert [r.name for r in platform.list_runs(user="dora")] == ["fresh"]
    assert platform.get_run("old-0000").user is None and platform.count_runs() == 3
    platform.db.add_event("no-such-run", "late", "from a pass that ended a deleted run")   # dropped, no error
    assert platform.db.events("no-such-run") == []
