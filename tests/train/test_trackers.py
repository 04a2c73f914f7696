"""Experiment trackers and the platform's metrics stream, through real tiny Trainer runs: MLflow on a
sqlite store read back with MlflowClient, W&B in offline mode read back from its .wandb file, the
TESSERA_METRICS file, and the recipe's `loggers` section."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.recipe import RecipeError, load_recipe_leaving_unset
from tessera.train import Callback, Trainer
from tessera.train.loggers import JSONLLogger, console_row
from tessera.train.trackers.record import flat_params

BATCHES = [{"x": torch.randn(4, 3, generator=torch.Generator().manual_seed(i)), "y": torch.ones(4, 1) * i}
           for i in range(4)]
SECRETS = {"api_key": "sk-not-for-logs", "bucket": "s3://user:pw-not-for-logs@host/b",
           "data": {"hf_token": "hf-not-for-logs", "tokenizer": "byte", "accessKeyId": "AKIA-not-for-logs",
                    "wandb_api_key_value": "not-for-logs", "max_tokens": 7, "DB_PASSWORD": "not-for-logs"}}


class Linear(torch.nn.Module):
    flops_per_token = 6 * 4

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])


class FailAt(Callback):
    """Raises after step `step` was logged, once the checkpoints in flight are committed: a crash that
    leaves logged steps past the last checkpoint, which the resumed run trains (and logs) again."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_batch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if trainer.timestamp.batch == self.step:
            trainer.checkpoints.wait()
            raise RuntimeError("simulated crash")


def fit(tmp: Path, loggers: list[Any], *, steps: int, fail_at: int | None = None, **settings: Any) -> Trainer:
    model = Linear()
    settings.setdefault("autoresume", True)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), train_dataloader=BATCHES,
                      num_tokens_fn=lambda batch: batch["x"].numel(),
                      max_duration=f"{steps}ba", run_name="tiny", save_folder=str(tmp / "ckpt"),
                      save_interval="4ba", loggers=loggers, log_dir=str(tmp / "logs"), global_batch_size=4,
                      device="cpu", parallelism=None, callbacks=[FailAt(fail_at)] if fail_at else [],
                      run_config={"recipe": {"optimizer": {"lr": 0.05}}, **SECRETS}, **settings)
    try:
        trainer.fit()
    except RuntimeError as exc:
        assert fail_at is not None and "simulated crash" in str(exc)
    finally:
        trainer.close()
    return trainer


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- MLflow ---------------------------------------------------------------------------------------------


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A local file store: MLflow 3 asks for an opt-in, and a sqlite store's first use (its migrations)
    takes many seconds, the file store none; both go through the same MlflowClient calls."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def mlflow_client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_run_holds_the_params_metrics_and_artifacts_the_run_wrote(tmp_path: Path, tracking_uri: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUN_NAME", raising=False)
    spec = {"mlflow": {"tracking_uri": tracking_uri, "experiment": "metrics-match", "tags": {"team": "red"}},
            "jsonl": None}
    trainer = fit(tmp_path, spec, steps=3)
    client = mlflow_client(tracking_uri)
    record = json.loads((tmp_path / "logs" / "mlflow_run.json").read_text())
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny" and run.data.tags["team"] == "red"
    assert client.get_experiment(run.info.experiment_id).name == "metrics-match"

    params = run.data.params
    assert params == flat_params(trainer.config) and params["recipe.optimizer.lr"] == "0.05"
    assert params["data.tokenizer"] == "byte" and params["data.max_tokens"] == "7"
    assert not any("not-for-logs" in k + v for k, v in params.items())  # secret keys dropped, URL password masked
    assert params["bucket"] == "s3://user:***@host/b"

    rows = jsonl_rows(tmp_path / "logs" / "metrics.jsonl")
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step":
                expected.setdefault(key, []).append((row["step"], value))
    assert {"train/loss", "lr/opt0", "throughput/tokens_per_sec"} <= set(expected)
    for key, points in expected.items():
        assert history(client, run.info.run_id, key) == sorted(points), key
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"metrics.jsonl", "config.json"} <= artifacts
    config = json.loads(Path(client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))).read_text())
    assert config["recipe"] == {"optimizer": {"lr": 0.05}} and "api_key" not in config
    assert "hf_token" not in config["data"] and "not-for-logs" not in json.dumps(config)


def test_autoresume_continues_the_same_mlflow_run_without_duplicated_steps(tmp_path: Path, tracking_uri: str) -> None:
    spec = [{"mlflow": {"tracking_uri": tracking_uri, "experiment": "resume"}}, "jsonl"]
    fit(tmp_path, spec, steps=8, fail_at=6)  # checkpoint at step 4; steps 5 and 6 logged, then a crash
    record = json.loads((tmp_path / "logs" / "mlflow_run.json").read_text())
    client = mlflow_client(tracking_uri)
    assert client.get_run(record["run_id"]).info.status == "RUNNING"  # the crash did not end it
    assert [s for s, _ in history(client, record["run_id"], "train/loss")] == [1, 2, 3, 4, 5, 6]

    # a fresh machine: only the save folder survives (its logs/ holds the MLflow run id)
    (tmp_path / "logs" / "mlflow_run.json").unlink()
    fit(tmp_path, spec, steps=8)
    assert json.loads((tmp_path / "logs" / "mlflow_run.json").read_text()) == record
    runs = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert [r.info.run_id for r in runs] == [record["run_id"]]
    assert client.get_run(record["run_id"]).info.status == "FINISHED"
    steps = [s for s, _ in history(client, record["run_id"], "train/loss")]
    assert steps == list(range(1, 9))  # 5 and 6 were trained twice, logged once
    jsonl_steps = [r["step"] for r in jsonl_rows(tmp_path / "logs" / "metrics.jsonl") if "train/loss" in r]
    assert jsonl_steps == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]


def test_a_run_started_from_scratch_under_an_old_name_gets_a_new_mlflow_run(tmp_path: Path,
                                                                              tracking_uri: str) -> None:
    spec = {"mlflow": {"tracking_uri": tracking_uri, "experiment": "fresh"}}
    fit(tmp_path, spec, steps=2, autoresume=False)
    first = json.loads((tmp_path / "logs" / "mlflow_run.json").read_text())["run_id"]
    fit(tmp_path, spec, steps=2, autoresume=False)
    second = json.loads((tmp_path / "logs" / "mlflow_run.json").read_text())["run_id"]
    client = mlflow_client(tracking_uri)
    assert first != second and [s for s, _ in history(client, second, "train/loss")] == [1, 2]


# --- Weights & Biases, offline ---------------------------------------------------------------------------


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a .wandb file: W&B's 7-byte header, then LevelDB log blocks of 32 KiB whose records
    (crc32, length, type; FULL=1, FIRST=2, MIDDLE=3, LAST=4) carry wandb_internal_pb2.Record messages."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, parts = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero padding at a block's end
            pos += block - pos % block if pos % block else 0
            continue
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def wandb_history(run_dir: Path) -> tuple[str, dict[str, Any], dict[int, dict[str, Any]]]:
    """(run id, config, {step: metrics}) of one offline run folder."""
    (file,) = run_dir.glob("run-*.wandb")
    run_id, config, steps = "", {}, {}
    for record in wandb_records(file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            steps[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
    return run_id, config, steps


def test_wandb_offline_run_holds_the_metrics_and_resumes_with_the_same_id(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "cfg"),
                        "WANDB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    spec = {"wandb": {"project": "tessera-test", "mode": "offline"}, "jsonl": None}
    fit(tmp_path, spec, steps=4)
    fit(tmp_path, spec, steps=6)  # resumes from the checkpoint at step 4

    runs = sorted((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    (id1, config, first), (id2, _, second) = (wandb_history(run) for run in runs)
    assert id1 == id2 == json.loads((tmp_path / "logs" / "wandb_run.json").read_text())["run_id"]
    assert config["recipe"] == {"optimizer": {"lr": 0.05}} and "api_key" not in config
    assert "hf_token" not in config["data"] and "not-for-logs" not in json.dumps(config)
    assert sorted(first) == [1, 2, 3, 4] and sorted(second) == [5, 6]
    rows = {r["step"]: r for r in jsonl_rows(tmp_path / "logs" / "metrics.jsonl") if "train/loss" in r}
    for step, logged in {**first, **second}.items():
        assert logged["train/loss"] == rows[step]["train/loss"] and logged["lr/opt0"] == rows[step]["lr/opt0"]


# --- the platform's metrics stream ----------------------------------------------------------------------


def test_tessera_metrics_gets_the_console_keys_on_each_log_line(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    stream = tmp_path / "run-folder" / "metrics.jsonl"
    monkeypatch.setenv("TESSERA_METRICS", str(stream))
    # a CPU has no listed peak FLOP/s, so no MFU: give it one to see MFU reach the stream
    monkeypatch.setattr("tessera.train.trainer.device_peak_flops", lambda device, precision: 1e9)
    fit(tmp_path, ["jsonl"], steps=3, eval_dataloader=BATCHES[:1], eval_interval="3ba")
    rows = jsonl_rows(stream)
    own = jsonl_rows(tmp_path / "logs" / "metrics.jsonl")  # the run's own file: the trainer's keys
    train = [(r, o) for r, o in zip(rows, own, strict=True) if "loss/train" in r]  # the same lines
    assert [r["step"] for r, _ in train] == [1, 2, 3]
    for row, trainer_row in train:
        assert {"loss/train", "lr", "throughput/tokens_per_sec", "throughput/mfu"} <= set(row)
        assert "train/loss" not in row and "lr/opt0" not in row  # renamed: one line per plot, not two
        assert row["loss/train"] == trainer_row["train/loss"] and row["lr"] == trainer_row["lr/opt0"]
        assert row["throughput/mfu"] == trainer_row["throughput/mfu"] > 0
    assert [r["loss/eval"] for r in rows if "loss/eval" in r]


def test_a_jsonl_logger_writing_the_stream_file_is_not_doubled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("TESSERA_METRICS", str(stream))
    fit(tmp_path, [JSONLLogger(stream)], steps=2)
    rows = jsonl_rows(stream)
    assert [r["step"] for r in rows if "loss/train" in r] == [1, 2] and not any("train/loss" in r for r in rows)


def test_stream_rows_are_strict_json() -> None:
    row = console_row({"train/loss": math.nan, "lr/opt0": 0.1, "throughput/mfu": math.inf})
    assert row == {"loss/train": None, "lr": 0.1, "throughput/mfu": None}
    json.dumps(row, allow_nan=False)


# --- recipes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "message"), [
    ("loggers.mlflow.experimnt=lm", "loggers: unknown key 'mlflow.experimnt'; did you mean 'mlflow.experiment'?"),
    ("loggers.wandb.mode=onlin", "loggers: wandb.mode: Input should be 'online', 'offline' or 'disabled'"),
    ("loggers.mlflow.tracking_uri=ftp://host/x", "loggers: mlflow.tracking_uri: unsupported scheme 'ftp'"),
    ("loggers=[progress, neptune]", "loggers: unknown logger 'neptune'"),
    ("loggers={wandb: 3}", "loggers: wandb's settings must be a mapping"),
])
def test_recipe_logger_errors_are_one_line_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe_leaving_unset("tiny-cpu.yaml", [override])
    assert str(info.value).startswith(f"invalid recipe: {message}") and "\n" not in str(info.value)


def test_a_password_in_the_tracking_uri_is_refused_without_echoing_it() -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe_leaving_unset("tiny-cpu.yaml", ["loggers.mlflow.tracking_uri=https://me:hunter2@mlflow:5000"])
    assert "MLFLOW_TRACKING_PASSWORD" in str(info.value) and "hunter2" not in str(info.value)


def print_config(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["train", *args, "--print-config"])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout)


def test_print_config_shows_the_trackers_and_reads_back(tmp_path: Path) -> None:
    overrides = ["loggers.mlflow.tracking_uri=sqlite:///mlflow.db", "loggers.mlflow.experiment=lm",
                 "loggers.wandb.project=p", "loggers.wandb.mode=offline"]
    printed = print_config("tiny-cpu.yaml", *overrides)
    loggers = printed["loggers"]
    assert list(loggers) == ["progress", "jsonl", "mlflow", "wandb"]
    assert loggers["mlflow"]["experiment"] == "lm" and loggers["wandb"]["mode"] == "offline"
    (tmp_path / "printed.yaml").write_text(yaml.safe_dump(printed))
    assert print_config(str(tmp_path / "printed.yaml"))["loggers"] == loggers


def test_a_store_mlflow_refuses_stops_the_run_at_start_with_one_line(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ValueError) as info:
        fit(tmp_path, {"mlflow": {"tracking_uri": (tmp_path / "mlruns").as_uri()}}, steps=1)
    assert str(info.value).startswith("loggers.mlflow: cannot log to file://") and "\n" not in str(info.value)


def test_importing_the_train_layer_does_not_import_the_trackers() -> None:
    code = ("import sys, tessera.train, tessera.train.config, tessera.train.loggers; "
            "from tessera.train.trackers import MLflowLogger, WandBLogger; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'wandb')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
