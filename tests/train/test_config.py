"""TrainerConfig: the one typed source of the Trainer's settings; its checks run before anything starts."""

from __future__ import annotations

import pytest
import torch

from tessera.train import Trainer
from tessera.train.config import Precision, TrainerConfig
from tessera.train.time import Time


def test_settings_are_typed_and_written_back_as_strings() -> None:
    cfg = TrainerConfig.of({"max_duration": "2ep", "save_interval": "10ba", "precision": "amp_bf16",
                            "device_train_microbatch_size": "auto"})
    assert cfg.max_duration == Time(2, "ep") and cfg.save_interval == Time(10, "ba")
    assert cfg.precision is Precision.AMP_BF16 and cfg.eval_interval is None and cfg.loggers == ["progress"]
    dumped = cfg.model_dump(mode="json")
    assert dumped["max_duration"] == "2ep" and dumped["precision"] == "amp_bf16" and dumped["log_interval"] == "1ba"
    assert TrainerConfig.of(dumped) == cfg  # what a config writes, it reads back


@pytest.mark.parametrize(("settings", "message"), [
    ({"max_duration": "1ba", "save_interval": 20}, "save_interval: expected a time string such as '500ba', got 20; "
                                                   "did you mean '20ba'"),
    ({"max_duration": "1ba", "log_interval": "0ba"}, "log_interval must be positive, got 0ba"),
    ({"max_duration": "1ba", "save_num_checkpoints_to_keep": 0}, "save_num_checkpoints_to_keep must be >= 1"),
    ({"max_duration": "1ba", "grad_clip_norm": float("nan")}, "grad_clip_norm must be a positive number"),
    ({"max_duration": "1ba", "run_name": "../up"}, "run_name '../up' is refused"),
    ({"max_duration": "1ba", "loggers": ["neptune"]}, "loggers: unknown logger 'neptune'"),
    ({"max_duration": "1ba", "save_folder": "ftp://h/x"}, "save_folder: ftp://h/x: unsupported scheme 'ftp'"),
    ({"max_duration": "1ba", "seed": "3"}, "seed: Input should be a valid integer"),  # strict: no "3" -> 3
    ({}, "missing key 'max_duration'"),
])
def test_a_bad_setting_is_one_value_error_naming_it(settings: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        TrainerConfig.of(settings)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_trainer_takes_keywords_or_a_config_and_refuses_unknown_settings() -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="unknown setting 'max_duraton'; did you mean 'max_duration'"):
        Trainer(model, opt, train_dataloader=[], max_duraton="2ba")
    with pytest.raises(TypeError, match="not both"):
        Trainer(model, opt, train_dataloader=[], config=TrainerConfig(max_duration="2ba"), seed=1)
    trainer = Trainer(model, opt, train_dataloader=[], config=TrainerConfig(max_duration="3ba", seed=5, loggers=[],
                                                                             device="cpu"))
    assert trainer.max_duration == Time(3, "ba") and trainer.seed == 5 and trainer.settings.seed == 5
    assert trainer.save_interval == Time(1, "ep")  # None: every epoch
    trainer.close()


def test_paths_may_be_path_objects(tmp_path) -> None:
    cfg = TrainerConfig(max_duration="1ba", log_dir=tmp_path / "logs", save_folder=tmp_path / "ckpt")
    assert cfg.log_dir == str(tmp_path / "logs") and cfg.save_folder == str(tmp_path / "ckpt")


def test_device_is_checked_without_torch_and_takes_a_torch_device() -> None:
    assert TrainerConfig(max_duration="1ba", device=torch.device("cuda", 1)).device == "cuda:1"
    with pytest.raises(ValueError, match="device 'gpu0' is not a torch device"):
        TrainerConfig.of({"max_duration": "1ba", "device": "gpu0"})
