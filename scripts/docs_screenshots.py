"""The console screenshot of the README and docs/server.md, from a real server and a real training run.

    make docs-screenshots          # or: .venv/bin/python scripts/docs_screenshots.py [--out docs/console.png]

1. data: a few packages of the Python standard library, tokenized to bytes (`tessera llm prep`);
2. a real `tessera server start` on a free port of this machine, with one user (team red) whose runs go to
   the local cluster;
3. a real CPU training run submitted through the server's API: `tessera train tiny-cpu.yaml` (the `make
   demo` model) for a hundred batches, logging every 2, evaluating twice; its metrics reach the console
   as any run's do (the platform's metrics stream);
4. the run's page in headless Chromium (scripts/chromium-up.sh, driven by Playwright as
   tests/server/test_console.py drives it), once the run has completed and the console has drawn its
   loss and learning-rate curves: a full-page screenshot into --out.
Nothing is staged: the curves are the run's own. Takes a few minutes on 2 CPU cores (the training run
dominates). Everything else goes into a temporary folder, removed at the end (--keep keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tessera.platform.clusters.local import free_port

ROOT = Path(__file__).resolve().parents[1]
TESSERA = [sys.executable, "-m", "tessera.cli.main"]
RUN = "gpt-tiny-cpu"
PACKAGES = ("json", "email", "http", "logging")
BATCHES = 100
WAIT = 900  # seconds the run may take on a busy machine


def say(text: str) -> None:
    print(f"docs-screenshots: {text}", flush=True)


def call(url: str, key: str, method: str = "GET", body: dict | None = None) -> dict:
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def make_data(work: Path, env: dict[str, str]) -> Path:
    """Byte-tokenized MDS windows of a few standard-library packages (train/ and val/)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = work / "corpus"
    for package in PACKAGES:
        shutil.copytree(stdlib / package, corpus / package, ignore=shutil.ignore_patterns("__pycache__"))
    data = work / "data"
    subprocess.run([*TESSERA, "llm", "prep", str(corpus), str(data), "--tokenizer", "byte", "--seq-len", "128",
                    "--val-fraction", "0.05"], env=env, check=True)
    return data


def start_server(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str, str]:
    """`tessera server start` on a free port; (its process, its URL, alice's API key)."""
    home = work / "server"
    made = subprocess.run([*TESSERA, "server", "admin", "create-user", "alice", "--team", "red", "--home",
                           str(home)], env=env, check=True, capture_output=True, text=True)
    url = f"http://127.0.0.1:{free_port()}"
    log = open(work / "server.log", "wb")  # noqa: SIM115 (the server's whole life)
    server = subprocess.Popen([*TESSERA, "server", "start", "--port", url.rsplit(":", 1)[1], "--home", str(home)],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited: {(work / 'server.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/v1/health", timeout=2):
                return server, url, made.stdout.strip()
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    raise SystemExit(f"the server did not answer within 60 s: {(work / 'server.log').read_text()[-2000:]}")


def train_command(data: Path, work: Path) -> str:
    tessera = Path(sys.executable).with_name("tessera")
    overrides = [f"data.train.streams.0.remote={data}", f"data.eval.streams.0.remote={data}",
                 f"max_duration={BATCHES}ba", "log_interval=2ba", "eval_interval=50ba", "save_folder=null",
                 "autoresume=false", "scheduler.t_warmup=15ba", f"log_dir={work}/logs/{{run_name}}"]
    return f"{tessera} train tiny-cpu.yaml " + " ".join(overrides)


def wait_completed(url: str, key: str) -> dict:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        run = call(f"{url}/api/v1/runs/{RUN}", key)
        if run["status"] in ("FAILED", "STOPPED"):
            raise SystemExit(f"the training run ended {run['status']}: see `tessera run logs {RUN}` in {url}")
        if run["status"] == "COMPLETED":
            return run
        time.sleep(2)
    raise SystemExit(f"the training run did not complete within {WAIT} s")


def screenshot(url: str, key: str, out: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = subprocess.run(["bash", str(ROOT / "scripts" / "chromium-up.sh")], check=True, capture_output=True,
                              text=True).stdout.strip()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
        page.goto(f"{url}/?api_key={key}#/runs/{RUN}")
        expect(page.locator("#run-status")).to_have_text("COMPLETED", timeout=30_000)
        expect(page.locator("#log-state")).to_have_text("run ended", timeout=30_000)
        for plot in ("#loss-plot", "#lr-plot"):
            expect(page.locator(f"{plot} path.plot-line").first).to_be_visible(timeout=30_000)
        expect(page.locator("#loss-plot")).to_contain_text(str(BATCHES), timeout=30_000)  # every step drawn
        page.locator("#log-view").evaluate("el => { el.scrollTop = 0; }")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True)
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "console.png")
    ap.add_argument("--keep", action="store_true", help="Keep the temporary folder (data, server, logs).")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tessera-screenshots-"))
    env = {**os.environ, "TESSERA_HOME": str(work / "home"), "PYTHONUNBUFFERED": "1"}
    for name in ("TESSERA_API_URL", "TESSERA_API_KEY", "TESSERA_DB_URL"):
        env.pop(name, None)
    server = None
    try:
        say(f"tokenizing {', '.join(PACKAGES)} of the standard library into {work / 'data'}")
        data = make_data(work, env)
        say("starting a server with one user (team red, the local cluster)")
        server, url, key = start_server(work, env)
        say(f"submitting {RUN}: tessera train tiny-cpu.yaml for {BATCHES} batches on this CPU")
        call(f"{url}/api/v1/runs", key, "POST", {"spec": {"name": RUN, "command": train_command(data, work)}})
        run = wait_completed(url, key)
        say(f"{RUN} completed; photographing its page")
        screenshot(url, key, args.out)
        say(f"wrote {args.out} ({args.out.stat().st_size:,} bytes) from run {run['name']}")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
            from tessera.platform.supervision.supervisor import stop_supervisor

            stop_supervisor(work / "server" / "teams" / "red")
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
