"""The web console in a real browser: Debian's chromium (scripts/chromium-up.sh) driven by Playwright,
against a real `tessera server start` subprocess whose team runs go to the local cluster.

A user logs in with `/?api_key=K` (the key leaves the address bar), sees the run in the runs table, opens
it, watches its log lines arrive over the live stream and its loss plot draw, clones it through the
dialog; another run is stopped with the Stop button, restarted (a new resumption), and moved: to an unknown
cluster (refused, by name, in the banner), then to a second local cluster added through the API.
The first run's script waits for a file the test creates only after the browser showed its first lines,
so "live" is proven by order, not by timing.
The screenshot goes to docs/console.png when TESSERA_UPDATE_SCREENSHOT=1, else to a temporary folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.platform.clusters.local import free_port
from tessera.platform.server.settings import ServerSettings
from tessera.platform.store.db import migrate
from tessera.platform.supervision.supervisor import stop_supervisor

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
expect = sync_api.expect

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
WAIT_MS = 15_000

# Prints training lines and reports their metrics to $TESSERA_METRICS; after step 12 it waits for the
# test's go-ahead file, then prints the rest. The tokenizer line holds text an HTML parser would eat.
JOB = """\
import json, math, os, pathlib, sys, time
go = pathlib.Path(sys.argv[1])
print("tokenizer: gpt-neox-20b, special tokens <|endoftext|> <pad>", flush=True)
def train(first, last):
    for i in range(first, last + 1):
        row = {"step": i, "loss/train": 0.6 + 3.5 * math.exp(-i / 9), "lr": 3e-4 * min(1, i / 6),
               "throughput/tokens_per_sec": 41000 + 900 * math.sin(i / 3),
               "throughput/mfu": 0.41 + 0.01 * math.cos(i / 4)}
        print(f"[batch={i}/40] train/loss: {row['loss/train']:.4f}  lr: {row['lr']:.2e}  "
              f"tok/s: {row['throughput/tokens_per_sec']:,.0f}  mfu: {row['throughput/mfu']:.1%}", flush=True)
        with open(os.environ["TESSERA_METRICS"], "a") as f:
            f.write(json.dumps(row) + "\\n")
train(1, 12)
while not go.exists():
    time.sleep(0.05)
print("checkpoint: saved ep0-ba12-rank0.pt", flush=True)
train(13, 40)
print("training done", flush=True)
"""


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "tessera.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.fixture(scope="session")
def chromium() -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "chromium-up.sh")], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        pytest.skip(f"BROWSER TEST SKIPPED: scripts/chromium-up.sh could not provide chromium: "
                    f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return done.stdout.strip()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """`tessera server start` on a free port with alice (team red); yields url, key, home, folder."""
    folder = tmp_path_factory.mktemp("console")
    home = folder / "server"
    env = {**os.environ, "TESSERA_HOME": str(folder / "tessera"), "TESSERA_SUPERVISOR_POLL": "0.2",
           "TESSERA_SUPERVISOR_IDLE": "30", "TESSERA_RETRY_BACKOFF": "0"}
    for name in ("TESSERA_API_URL", "TESSERA_API_KEY", "TESSERA_DB_URL"):
        env.pop(name, None)
    # The two CLI processes below start together (each takes seconds to import); each migrates the database
    # first, and two first migrations of one SQLite file at once would race: so it exists before they start.
    migrate(ServerSettings.resolve(home=home, db_url=f"sqlite:///{home / 'server.db'}").db_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(folder / "server.log", "wb")
    proc = subprocess.Popen([PYTHON, "-m", "tessera.cli.main", "server", "start", "--port", str(port),
                             "--home", str(home)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    made = _cli("server", "admin", "create-user", "alice", "--team", "red", "--home", str(home), env=env)
    key = made.stdout.strip()
    try:
        assert made.returncode == 0, made.stderr
        _wait_healthy(url, proc, folder / "server.log")
        yield {"url": url, "key": key, "home": home, "folder": folder}
    finally:
        _stop_active_runs(url, key)
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
        stop_supervisor(home / "teams" / "red")


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the server did not answer /api/v1/health within 30 s: {log.read_text()[-2000:]}")


def _stop_active_runs(url: str, key: str) -> None:
    """A failed test must not leave `sleep` runs behind: stop what is still active."""
    try:
        runs = httpx.get(f"{url}/api/v1/runs", headers=_auth(key), timeout=5).json()["items"]
        for run in runs:
            if run["status"] not in ("COMPLETED", "FAILED", "STOPPED"):
                httpx.post(f"{url}/api/v1/runs/{run['name']}/stop", headers=_auth(key), timeout=10)
    except httpx.HTTPError:
        pass


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _submit(server: dict[str, object], name: str, command: str) -> None:
    answer = httpx.post(f"{server['url']}/api/v1/runs", headers=_auth(str(server["key"])), timeout=30,
                        json={"spec": {"name": name, "command": command}})
    assert answer.status_code == 201, answer.text


def _run(server: dict[str, object], name: str) -> dict[str, Any]:
    answer = httpx.get(f"{server['url']}/api/v1/runs/{name}", headers=_auth(str(server["key"])), timeout=10)
    return answer.json()


def _wait_run(server: dict[str, object], name: str, done: Callable[[dict[str, Any]], bool]) -> None:
    """Wait (up to WAIT_MS) until the server's record of the run satisfies `done`."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while not done(run := _run(server, name)):
        if time.monotonic() > deadline:
            pytest.fail(f"run {name} did not reach the awaited state: {run}")
        time.sleep(0.05)


def _status(server: dict[str, object], name: str) -> str:
    return str(_run(server, name)["status"])


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[object]:
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield instance
        instance.close()


@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # console errors too (a Content-Security-Policy refusal is one), but not the 401/409 answers the tests ask for
    page.on("console", lambda message: errors.append(message.text)
            if message.type == "error" and not message.text.startswith("Failed to load resource") else None)
    yield page
    context.close()
    assert not errors, f"the page raised: {errors}"


def _screenshot_path(folder: Path) -> Path:
    if os.environ.get("TESSERA_UPDATE_SCREENSHOT") == "1":
        return ROOT / "docs" / "console.png"
    return folder / "console.png"


def test_run_appears_logs_stream_and_loss_plot_draws(server, page) -> None:  # type: ignore[no-untyped-def]
    folder = Path(str(server["folder"]))
    script, go = folder / "job.py", folder / "go"
    script.write_text(JOB)
    _submit(server, "gpt-125m-demo", f"{PYTHON} {script} {go}")

    page.goto(f"{server['url']}/?api_key={server['key']}")
    expect(page.locator("#runs-table")).to_contain_text("gpt-125m-demo", timeout=WAIT_MS)
    assert "api_key" not in page.url                 # the key left the address bar (history, screenshots)
    assert page.evaluate("sessionStorage.getItem('tessera.apiKey')") == server["key"]

    table = page.locator("#runs-table tbody")
    page.locator("#run-search").fill("no-such-run")            # the search box asks the server (q=)
    expect(table).to_have_text("No runs.")
    page.locator("#run-search").fill("125m")
    expect(table).to_contain_text("gpt-125m-demo")
    page.locator("#status-filter").select_option("FAILED")     # nothing failed here
    expect(table).to_have_text("No runs.")
    page.locator("#status-filter").select_option("")
    page.locator("#runs-table a", has_text="gpt-125m-demo").click()
    expect(page.locator("#run-title")).to_have_text("gpt-125m-demo")
    log = page.locator("#log-view")
    expect(log).to_contain_text("[batch=12/40]", timeout=WAIT_MS)
    expect(log).to_contain_text("special tokens <|endoftext|> <pad>")
    assert page.locator("#log-view *").count() == 0   # a log line is text, never markup
    expect(page.locator("#loss-plot path.plot-line")).to_have_count(1, timeout=WAIT_MS)

    go.touch()   # only now does the run print its last lines: the open stream must deliver them
    expect(log).to_contain_text("checkpoint: saved ep0-ba12-rank0.pt", timeout=WAIT_MS)
    expect(log).to_contain_text("training done", timeout=WAIT_MS)
    expect(page.locator("#run-status")).to_have_text("COMPLETED", timeout=WAIT_MS)
    expect(page.locator("#log-state")).to_have_text("run ended", timeout=WAIT_MS)
    expect(page.locator("#resumption-timeline")).to_contain_text("submitted")
    # all 40 metric rows drawn: the loss line ends at step 40 (the x axis' last label)
    expect(page.locator("#loss-plot")).to_contain_text("40", timeout=WAIT_MS)
    assert page.locator("#loss-plot path.plot-line").get_attribute("d").count("L") >= 39
    for plot in ("#lr-plot", "#throughput-plot", "#mfu-plot"):
        expect(page.locator(f"{plot} path.plot-line")).to_have_count(1)
    page.locator("#log-view").evaluate("el => { el.scrollTop = 0; }")
    page.screenshot(path=str(_screenshot_path(folder)), full_page=True)

    page.locator("#clone-button").click()
    page.locator("#ask-input").fill("gpt-125m-demo")        # taken: the server's refusal shows in the banner
    page.locator("#ask-ok").click()
    expect(page.locator("#banner")).to_contain_text("clone failed", timeout=WAIT_MS)
    expect(page.locator("#banner")).to_contain_text("exists")
    page.locator("#clone-button").click()
    page.locator("#ask-input").fill("gpt-125m-demo-2")
    page.locator("#ask-ok").click()
    expect(page.locator("#run-title")).to_have_text("gpt-125m-demo-2", timeout=WAIT_MS)
    assert _status(server, "gpt-125m-demo-2") in ("PENDING", "QUEUED", "STARTING", "RUNNING", "COMPLETED")


def test_stop_restart_and_move_buttons(server, page) -> None:  # type: ignore[no-untyped-def]
    _submit(server, "long-sleeper", "echo sleeping; sleep 300")
    page.goto(f"{server['url']}/?api_key={server['key']}#/clusters")
    # what runs where: the local cluster's node lists the run
    expect(page.locator("[data-cluster=local] table")).to_contain_text("long-sleeper", timeout=WAIT_MS)
    expect(page.locator("[data-cluster=local] thead")).to_contain_text("GPUs")   # per node, from describe
    page.locator("[data-cluster=local] a", has_text="long-sleeper").first.click()
    status = page.locator("#run-status")
    expect(status).to_have_text("RUNNING", timeout=WAIT_MS)
    page.locator("#stop-button").click()
    expect(status).to_have_text("STOPPED", timeout=WAIT_MS)
    assert _status(server, "long-sleeper") == "STOPPED"   # the server's record, not only the page
    expect(page.locator("#stop-button")).to_be_disabled()
    expect(page.locator("#move-button")).to_be_disabled()   # a finished run is restarted, not moved

    # Restart: the stopped run leaves its terminal state at once (the answer shows it) and starts again
    page.locator("#restart-button").click()
    expect(page.locator("#banner")).to_contain_text("Restarting long-sleeper.", timeout=WAIT_MS)
    expect(status).not_to_have_text("STOPPED")
    expect(page.locator("#move-button")).to_be_enabled()
    # Move: an unknown cluster is refused, by name, in the banner
    page.locator("#move-button").click()
    page.locator("#ask-input").fill("nowhere")
    page.locator("#ask-ok").click()
    expect(page.locator("#banner")).to_contain_text("move failed", timeout=WAIT_MS)
    expect(page.locator("#banner")).to_contain_text("nowhere")
    added = httpx.post(f"{server['url']}/api/v1/clusters", headers=_auth(str(server["key"])), timeout=10,
                       json={"name": "box", "type": "local"})
    assert added.status_code == 201, added.text
    # the restart is a second resumption, running (the server's record)
    _wait_run(server, "long-sleeper", lambda run: run["status"] == "RUNNING" and len(run["resumptions"]) == 2)
    # ... and a second local cluster takes the running run: a third resumption, on box
    page.locator("#move-button").click()
    expect(page.locator("#ask-options option[value=box]")).to_have_count(1)   # the dialog suggests it
    page.locator("#ask-input").fill("box")
    page.locator("#ask-ok").click()
    expect(page.locator("#banner")).to_contain_text("Moving long-sleeper to box.", timeout=WAIT_MS)
    expect(page.locator("dl.facts dt:text-is('Cluster') + dd")).to_have_text("box", timeout=WAIT_MS)
    resumptions = page.locator("#resumption-timeline li.resumption .resumption-head")   # newest first
    expect(resumptions).to_have_text([re.compile(r"#2 .*moved from local to box on box"),
                                      re.compile(r"#1 .*restarted on request on local"),
                                      re.compile(r"#0 .* on local")], timeout=WAIT_MS)
    assert _run(server, "long-sleeper")["cluster"] == "box"
    # no `sleep 300` left behind (the Stop button was tested above; the API's answer comes sooner than a poll)
    httpx.post(f"{server['url']}/api/v1/runs/long-sleeper/stop", headers=_auth(str(server["key"])), timeout=10)
    _wait_run(server, "long-sleeper", lambda run: run["status"] == "STOPPED")


def test_login_form_refuses_a_wrong_key_and_accepts_the_right_one(server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(str(server["url"]))
    page.locator("#login-key").fill("tsk_wrong")
    page.locator("#login-form button").click()
    expect(page.locator("#banner")).to_contain_text("refused", timeout=WAIT_MS)
    expect(page.locator("#login-form")).to_be_visible()
    page.locator("#login-key").fill(str(server["key"]))
    page.locator("#login-form button").click()
    expect(page.locator("#runs-table")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#whoami")).to_contain_text("alice")
    page.locator("#logout-button").click()
    expect(page.locator("#login-form")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('tessera.apiKey')") is None


def test_a_run_is_running_from_the_start_of_its_processes_everywhere(server, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The command prints nothing and writes no heartbeat: RUNNING comes from its processes alone, for the
    run and its resumption, in the API, the CLI and the console (it was STARTING, the resumption QUEUED)."""
    from typer.testing import CliRunner

    from tessera.cli.run import app as run_app

    started, go = tmp_path / "started", tmp_path / "go"
    _submit(server, "silent", f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done")
    deadline = time.monotonic() + WAIT_MS / 1000
    while not started.exists():
        assert time.monotonic() < deadline, _run(server, "silent")
        time.sleep(0.05)
    _wait_run(server, "silent", lambda run: run["status"] == "RUNNING"
              and [r["status"] for r in run["resumptions"]] == ["RUNNING"])
    log = Path(_run(server, "silent")["resumptions"][0]["folder"]) / "node-0.log"
    assert log.read_bytes() == b""        # not a line yet: RUNNING did not wait for one
    described = CliRunner().invoke(run_app, ["describe", "silent"], env={
        "TESSERA_API_URL": str(server["url"]), "TESSERA_API_KEY": str(server["key"])}, terminal_width=200)
    assert described.exit_code == 0, described.output
    top = {key: value.strip() for key, _, value in (line.partition(":") for line in described.output.splitlines()
                                                     if line and not line.startswith(" "))}
    assert (top["status"], top["cluster"], top["user"]) == ("RUNNING", "local", "alice")
    outcome = next(line for line in described.output.split("resumptions:")[1].splitlines() if "outcome:" in line)
    assert outcome.split(":", 1)[1].strip() == "RUNNING"    # the outcome of an unfinished resumption
    page.goto(f"{server['url']}/?api_key={server['key']}#/runs/silent")
    expect(page.locator("#run-status")).to_have_text("RUNNING", timeout=WAIT_MS)
    expect(page.locator("#resumption-timeline .resumption-head")).to_have_text(
        re.compile(r"^#0 RUNNING submitted on local$"), timeout=WAIT_MS)
    go.touch()
    _wait_run(server, "silent", lambda run: run["status"] == "COMPLETED")


def test_the_runs_list_pages_through_the_api(server, page) -> None:  # type: ignore[no-untyped-def]
    """12 runs named page-NN, 10 a page: Next shows the 2 oldest, Previous the 10 newest again."""
    for i in range(12):
        _submit(server, f"page-{i:02d}", "true")
    page.goto(f"{server['url']}/?api_key={server['key']}")
    page.locator("#run-search").fill("page-")
    page.locator("#page-size").select_option("10")
    names = page.locator("#runs-table tbody tr td:first-child")
    newest = [f"page-{i:02d}" for i in range(11, 1, -1)]
    expect(names).to_have_text(newest, timeout=WAIT_MS)
    expect(page.locator("#runs-count")).to_have_text("1–10 of 12 runs")
    expect(page.locator("#prev-page")).to_be_disabled()
    page.locator("#next-page").click()
    expect(names).to_have_text(["page-01", "page-00"], timeout=WAIT_MS)
    expect(page.locator("#runs-count")).to_have_text("11–12 of 12 runs")
    expect(page.locator("#next-page")).to_be_disabled()
    page.locator("#prev-page").click()
    expect(names).to_have_text(newest, timeout=WAIT_MS)
    page.locator("#run-search").fill("page-1")                  # a new filter starts at the first page
    expect(names).to_have_text(["page-11", "page-10"], timeout=WAIT_MS)
    expect(page.locator("#runs-count")).to_have_text("2 runs")


def test_api_docs_render_offline(server, page) -> None:  # type: ignore[no-untyped-def]
    """/api/v1/docs with every request that leaves the server refused: the page's scripts and styles
    are the server's own (from an installed package), so Swagger UI still draws the operations."""
    outside: list[str] = []
    origin = str(server["url"])

    def only_the_server(route) -> None:  # type: ignore[no-untyped-def]
        if route.request.url.startswith(origin):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_server)
    page.goto(f"{origin}/api/v1/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Tessera control plane", timeout=WAIT_MS)
    expect(page.locator(".opblock-summary-path[data-path='/api/v1/runs']").first).to_be_visible()
    assert outside == []
    html = httpx.get(f"{origin}/api/v1/docs", timeout=10).text
    assert "http://" not in html and "https://" not in html
    for asset in re.findall(r'(?:src|href)="(/[^"]+)"', html):
        assert httpx.get(f"{origin}{asset}", timeout=10).status_code == 200, asset
