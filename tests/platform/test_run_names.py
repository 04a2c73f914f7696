"""Runs do not share checkpoints by accident: two `tessera run submit` of one shipped recipe under
different names train from step 0 each, into two checkpoint folders and two metrics files; a training
process refuses a save folder whose checkpoints another run name wrote unless `load_path=` says to start
from one; and which name a recipe run gets (`run_name=` > $RUN_NAME > the file's > the file's stem)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_helpers import TESSERA
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.recipe import load_recipe
from tessera.platform import Platform

torch = pytest.importorskip("torch")
runner = CliRunner()

STEPS = 8
SMALL = ["model.d_model=32", "model.n_layers=1", "model.max_seq_len=32", "global_train_batch_size=4",
         "device_train_microbatch_size=4", "torch_threads=1", "scheduler.t_warmup=2ba", "save_interval=4ba",
         "eval_interval=1000ba", "log_interval=1ba", "loggers=[jsonl]", "data.eval.max_batches=1",
         f"max_duration={STEPS}ba"]


def recipe_args(data: Path) -> list[str]:
    """tiny-cpu.yaml shrunk to 8 steps on `data`, with the recipe's own save_folder (no save_folder=)."""
    return ["tiny-cpu.yaml", *SMALL, f"data.train.streams.0.remote={data}", f"data.eval.streams.0.remote={data}"]


def steps_logged(metrics: Path) -> list[int]:
    return [row["step"] for row in map(json.loads, metrics.read_text().splitlines()) if "train/loss" in row]


def submit(name: str, data: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tessera run submit -f SPEC --follow` from `folder` (the run's working directory), until it ends."""
    spec = folder / f"{name}.yaml"
    spec.write_text(json.dumps({"name": name, "command": " ".join([TESSERA, "train", *recipe_args(data)]),
                                "scheduling": {"max_retries": 0}}))
    monkeypatch.chdir(folder)
    done = runner.invoke(app, ["run", "submit", "-f", str(spec), "--follow"])
    assert done.exit_code == 0, done.output[-3000:]


def test_two_platform_runs_of_one_recipe_keep_their_own_checkpoints(platform: Platform, tiny_data: Path,
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUN_NAME", raising=False)
    submit("first", tiny_data, tmp_path, monkeypatch)
    submit("second", tiny_data, tmp_path, monkeypatch)   # the same command, after the first has finished
    for name in ("first", "second"):
        run = platform.get_run(name)
        assert run.status == "COMPLETED" and run.resumptions[0].last_heartbeat["step"] == STEPS
        ckpt = tmp_path / "runs" / name / "checkpoints"
        assert sorted(p.name for p in ckpt.glob("ep*-ba*")) == ["ep0-ba4", "ep0-ba8"]
        meta = json.loads((ckpt / "ep0-ba8" / "meta.json").read_text())
        assert meta["config"]["run_name"] == name and meta["config"]["recipe"]["run_name"] == name
        assert steps_logged(tmp_path / "logs" / name / "metrics.jsonl") == list(range(1, STEPS + 1))
        assert [e.message for e in run.events if e.kind == "fit_start"] == ["fit_start (rank=0, step=0)"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["first", "second"]
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["first", "second"]


def test_another_runs_checkpoints_are_refused_unless_load_path_names_one(tiny_data: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUN_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    shared = tmp_path / "shared"
    train = [*recipe_args(tiny_data), f"save_folder={shared}"]
    assert runner.invoke(app, ["train", *train]).exit_code == 0              # run 'tiny-cpu' (the file's stem)
    done = runner.invoke(app, ["train", *train, "run_name=other"])
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert done.output.strip().splitlines()[-1] == (
        f"error: {shared} holds checkpoints of run 'tiny-cpu', this run is 'other': give "
        f"load_path={shared}/ep0-ba8 to start from it, or another save_folder")
    assert not (tmp_path / "logs" / "other").exists()                   # refused before training or logging

    done = runner.invoke(app, ["train", *train, "run_name=other", f"load_path={shared}/ep0-ba4"])
    assert done.exit_code == 0, done.output[-3000:]
    assert steps_logged(tmp_path / "logs" / "other" / "metrics.jsonl")[-4:] == [5, 6, 7, 8]  # from step 4 on
    meta = json.loads((shared / "ep0-ba8" / "meta.json").read_text())
    assert meta["config"]["run_name"] == "other"                        # its own checkpoint now
    assert runner.invoke(app, ["train", *train, "run_name=other"]).exit_code == 0   # and autoresume takes it


@pytest.mark.parametrize(("in_file", "override", "env", "expected"), [
    (None, None, None, "recipe"),            # the file's stem: the same command twice autoresumes
    ("mine", None, None, "mine"),            # a user's recipe names its run
    (None, None, "plat", "plat"),            # a platform run: $RUN_NAME
    ("mine", None, "plat", "plat"),          # the platform's run name over the file's (a copied recipe)
    ("mine", "cli", "plat", "cli"),          # run_name= on the command line over everything
])
def test_which_name_a_recipe_run_gets(in_file: str | None, override: str | None, env: str | None, expected: str,
                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(__file__).parents[2] / "src/tessera/llm/recipes/tiny-cpu.yaml").read_text()
    (tmp_path / "recipe.yaml").write_text(text + (f"run_name: {in_file}\n" if in_file else ""))
    if env:
        monkeypatch.setenv("RUN_NAME", env)
    else:
        monkeypatch.delenv("RUN_NAME", raising=False)
    overrides = [f"run_name={override}"] if override else []
    recipe = load_recipe(str(tmp_path / "recipe.yaml"), overrides)
    assert recipe.run_name == expected
    assert recipe.trainer_config().save_folder == f"./runs/{expected}/checkpoints"
    shown = runner.invoke(app, ["train", str(tmp_path / "recipe.yaml"), *overrides, "--print-config", "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["run_name"] == expected
