"""A recipe composes the layers' typed configs: its training keys are the Trainer's settings and its data
section is the stream layer's models, so adding a setting to a layer makes it a recipe key."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.recipe import TRAINER_KEYS_RENAMED, Recipe, load_recipe
from tessera.llm.recipe_keys import key_paths, recipe_keys
from tessera.stream import Stream
from tessera.stream.config import StreamConfig, StreamingConfig
from tessera.train.config import OptimizerConfig, SchedulerConfig, TrainerConfig
from tessera.train.schedule import CosineWithWarmup
from tessera.train.time import Time


def test_every_trainer_setting_is_a_recipe_key() -> None:
    keys = set(key_paths(Recipe))
    for name in TrainerConfig.model_fields:
        assert TRAINER_KEYS_RENAMED.get(name, name) in keys, f"Trainer setting {name!r} is not accepted by recipes"
        if name not in TRAINER_KEYS_RENAMED:  # same type, checks and description as the Trainer's
            assert Recipe.model_fields[name].annotation == TrainerConfig.model_fields[name].annotation
            assert Recipe.model_fields[name].description == TrainerConfig.model_fields[name].description


def test_the_recipe_builds_the_trainer_config_with_every_setting() -> None:
    recipe = load_recipe("tiny-cpu.yaml", ["parallelism=fsdp", "save_keep_every_n=4", "data.eval.max_batches=3"])
    cfg = recipe.trainer_config()
    assert cfg.parallelism.data_parallel == "fsdp" and cfg.save_keep_every_n == 4 and cfg.eval_subset_num_batches == 3
    assert cfg.global_batch_size == recipe.global_train_batch_size and cfg.seed == recipe.seed == 17
    assert cfg.save_folder == "./runs/tiny-cpu/checkpoints" and str(cfg.max_duration) == "300ba"


def test_optimizer_and_scheduler_are_the_train_layers_configs() -> None:
    assert Recipe.model_fields["optimizer"].annotation is OptimizerConfig
    assert Recipe.model_fields["scheduler"].annotation is SchedulerConfig
    recipe = load_recipe("tiny-cpu.yaml", ["scheduler.t_warmup=7ba"])
    schedule = recipe.scheduler.build()
    assert isinstance(schedule, CosineWithWarmup) and schedule.warmup == Time(7, "ba") and schedule.alpha_f == 0.1
    with pytest.raises(ValueError, match=r"optimizer\.betas: .*each beta must be in \[0, 1\)"):
        load_recipe("tiny-cpu.yaml", ["optimizer.betas=[1.0,0.9]"])


def test_the_recipe_stream_spec_is_the_stream_layers_model() -> None:
    for section in ("train", "eval"):
        spec = Recipe.model_fields["data"].annotation.model_fields[section].annotation
        loader = next(a for a in (spec, *getattr(spec, "__args__", ())) if isinstance(a, type))
        assert issubclass(loader, StreamingConfig)
        assert loader.model_fields["streams"].annotation == list[StreamConfig]
    recipe = load_recipe("tiny-cpu.yaml")
    assert isinstance(recipe.data.train.streams[0], StreamConfig)
    assert recipe.data.train.shuffle is True and recipe.data.eval.shuffle is False  # the recipe's defaults


def test_stream_checks_its_arguments_through_the_stream_config() -> None:
    with pytest.raises(ValueError, match="a Stream needs a remote URL, a local folder, or both"):
        Stream()
    with pytest.raises(ValueError, match=r"at most one of proportion, repeat, choose; got \['proportion', 'choose'\]"):
        Stream(remote="s3://b/x", proportion=0.5, choose=10)
    with pytest.raises(ValueError, match="remote: ftp://h/x: unsupported scheme"):
        Stream(remote="ftp://h/x")
    with pytest.raises(ValueError, match="repeat: Input should be greater than or equal to 0"):
        Stream(local="/tmp/x", repeat=-1.0)
    # a recipe's stream says the same, with its whole key
    with pytest.raises(ValueError, match=r"data\.train\.streams\.0\.remote: ftp://h/x: unsupported"):
        load_recipe("tiny-cpu.yaml", ["data.train.streams.0.remote=ftp://h/x"])


def test_help_lists_every_key_from_the_schema() -> None:
    rows = {key: (kind, default, text) for key, kind, default, text in recipe_keys(Recipe)}
    assert rows["max_duration"][1] == "required" and rows["seed"][1] == "17"
    assert rows["precision"][0] == "fp32 | amp_bf16 | amp_fp16 | pure_bf16"
    assert rows["data.train.streams.N.remote"][2] == StreamConfig.model_fields["remote"].description
    result = CliRunner().invoke(app, ["train", "--list-keys"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for key in ("save_keep_every_n", "data.eval.max_batches", "optimizer.betas", "list[str | Logger]"):
        assert key in result.output
