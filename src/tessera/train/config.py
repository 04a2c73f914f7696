"""The Trainer's settings as one typed config (`TrainerConfig`), and the checks run before anything starts,
with messages that say what to change.

`Trainer(model, opt, train_dataloader=..., max_duration="2ep", ...)` validates its keywords by building a
`TrainerConfig`; a recipe (llm/recipe.py) takes its training keys from the same fields. Objects (model,
optimizers, loaders, callbacks, loss functions) are not settings and stay Trainer arguments; a run that is
described rather than coded (a recipe) names its optimizer and schedule with `OptimizerConfig` and
`SchedulerConfig`, which build them.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tessera.storage import StorageError, open_store
from tessera.suggest import hint
from tessera.train.logger_settings import LOGGERS, dump_loggers, parse_loggers
from tessera.train.parallel.config import ParallelismConfig
from tessera.train.schedule import ConstantWithWarmup, CosineWithWarmup, LinearWithWarmup
from tessera.train.time import Time, TimeUnit
from tessera.typed_config import one_message, storage_url

if TYPE_CHECKING:
    import torch

    from tessera.train.schedule import Schedule


class Precision(StrEnum):
    """`fp32`, or autocast to bfloat16 / float16 (float16 adds a gradient scaler), or `pure_bf16`: the
    weights themselves (and so gradients and optimizer state) in bfloat16, no autocast: half the memory of
    fp32 weights, at the cost of bf16 rounding in every update."""

    FP32 = "fp32"
    AMP_BF16 = "amp_bf16"
    AMP_FP16 = "amp_fp16"
    PURE_BF16 = "pure_bf16"


def parse_precision(precision: str) -> Precision:
    try:
        return Precision(precision)
    except ValueError:
        raise ValueError(f"unknown precision {precision!r}; use one of {[p.value for p in Precision]}") from None


def parse_time(value: Time | str, name: str, *, allow_dur: bool = True) -> Time:
    """`Time.parse` with the setting's name in the error."""
    try:
        time = Time.parse(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name}: {exc}") from None
    if not allow_dur and time.unit is TimeUnit.DURATION:
        raise ValueError(f"{name} must be in ba, ep, sp or tok, not {time}")
    return time


def parse_microbatch(value: int | str | None) -> tuple[int | None, bool]:
    """(fixed microbatch size or None, auto?) from device_train_microbatch_size."""
    if value == "auto":
        return None, True
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value, False
    raise ValueError(f"device_train_microbatch_size must be a positive int, 'auto' or None, got {value!r}")


def per_device_batch_size(loader: Any, global_batch_size: int | None, world_size: int) -> int | None:
    """The per-device batch the global batch implies, checked against the loader's (if it tells)."""
    per_device = getattr(loader, "batch_size", None)
    if global_batch_size is None:
        return per_device
    if global_batch_size % world_size:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by the world size {world_size}; "
                         f"use a multiple of {world_size} or another number of ranks")
    wanted = global_batch_size // world_size
    if per_device is not None and per_device != wanted:
        raise ValueError(f"global_batch_size={global_batch_size} over {world_size} rank(s) needs a per-device "
                         f"batch of {wanted}, but train_dataloader yields {per_device}; set its batch_size to "
                         f"{wanted}")
    return wanted


def check_batch_size(got: int, expected: int | None) -> int:
    """The per-device batch size, checked on the first batch of each epoch."""
    if expected is not None and got != expected:
        raise ValueError(f"train_dataloader yields batches of {got}, but the global batch needs {expected} per "
                         f"device; set the loader's batch_size to {expected}")
    return got


def check_run_name(run_name: str) -> str:
    """A run name becomes a folder name (checkpoints, logs), so it may not climb out of its parent."""
    if not run_name or "/" in run_name or "\\" in run_name or ".." in run_name or run_name.startswith("."):
        raise ValueError(f"run_name {run_name!r} is refused: it names a folder, so it must be non-empty and "
                         "'/', '\\', '..' and a leading '.' (path traversal) are not allowed")
    return run_name


def check_save_folder(save_folder: str, run_name: str | None, rank: int) -> None:
    """Write and delete a small object in the save folder, so a typo or missing permission fails now."""
    run_name = run_name or os.environ.get("RUN_NAME", "")
    if run_name:
        check_run_name(run_name)
    if "{run_name}" in save_folder and not run_name:
        raise ValueError(f"save_folder {save_folder!r} contains {{run_name}}: pass run_name= or set RUN_NAME")
    folder = save_folder.replace("{run_name}", run_name)
    probe = f".tessera-write-check-{rank}"
    try:
        store = open_store(folder)
        store.put(probe, b"ok")
        store.delete(probe)
    except (StorageError, OSError, ValueError) as exc:
        raise ValueError(f"save_folder {folder!r} cannot be written ({exc}); check the bucket name, the "
                         f"credentials (S3_ENDPOINT_URL, AWS_*) and write permission, or pick another folder"
                         ) from None


# --- the typed settings -------------------------------------------------------------------------------------
# Each check lives on its type (Annotated), so a config that reuses a field (a recipe) reuses its check.


def _time(value: Any, info: ValidationInfo, *, allow_dur: bool = True, positive: bool = False) -> Time | None:
    if value is None:
        return None
    time = parse_time(value, info.field_name or "time", allow_dur=allow_dur)
    if positive and time.value <= 0:
        raise ValueError(f"{info.field_name} must be positive, got {time}")
    return time


def _duration(value: Any, info: ValidationInfo) -> Time | None:
    return _time(value, info, allow_dur=False)


def _interval(value: Any, info: ValidationInfo) -> Time | None:
    return _time(value, info, positive=True)


def _time_str(time: Time | None) -> str | None:
    return None if time is None else str(time)


TimeSetting = Annotated[Time | None, BeforeValidator(_time), PlainSerializer(_time_str)]
"""A time ("500ba", "2ep", "1e9tok", "0.1dur"), kept as a `Time`, written back as its string."""
Duration = Annotated[Time, BeforeValidator(_duration), PlainSerializer(_time_str)]
Interval = Annotated[Time | None, BeforeValidator(_interval), PlainSerializer(_time_str)]


def _precision(value: Any) -> Precision:
    return value if isinstance(value, Precision) else parse_precision(value)


def _microbatch(value: Any) -> Any:
    parse_microbatch(value)
    return value


_DEVICE_RE = re.compile(r"^(cpu|cuda|mps|xpu|hpu|meta)(:\d+)?$")


def _device(value: Any) -> Any:
    """A torch device or its name, checked without torch (a typo would otherwise fail after set-up)."""
    if value is not None and not isinstance(value, str) and hasattr(value, "type"):
        value = str(value)
    if isinstance(value, str) and not _DEVICE_RE.match(value):
        raise ValueError(f"device {value!r} is not a torch device; use cpu, cuda, cuda:N, mps or None")
    return value


def _run_name(value: str | None) -> str | None:
    return None if value is None else check_run_name(value)


def _clip(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"grad_clip_norm must be a positive number, or None (null) for no clipping, got {value}")
    return value


def _positive_or_none(none_means: str) -> AfterValidator:
    def check(value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"{info.field_name} must be >= 1, or None (null) {none_means}, got {value}")
        return value
    return AfterValidator(check)


StorageURL = Annotated[str | None, BeforeValidator(storage_url)]


def _fspath(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


class TrainerConfig(BaseModel):
    """Every setting of a training run, checked before any process group, download or upload."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, arbitrary_types_allowed=True,
                              validate_default=True)

    max_duration: Duration = Field(description="How long to train: ba, ep, sp or tok (e.g. 300ba, 2ep).")
    run_name: Annotated[str | None, AfterValidator(_run_name)] = Field(
        None, description="Names the run's folders ({run_name} in paths); no '/', '..' or leading '.'. None: "
                          "$RUN_NAME. A recipe's: run_name= given, else $RUN_NAME, else the file's, else its stem.")
    seed: int = Field(42, description="Seeds python, numpy and torch (plus the rank).")
    save_folder: StorageURL = Field(None, description="Where checkpoints go (a path or URL; may hold {run_name}).")
    save_interval: Interval = Field(None, description="How often to save a checkpoint; None: every epoch.")
    save_num_checkpoints_to_keep: Annotated[int | None, _positive_or_none("to keep every checkpoint")] = Field(
        None, description="How many recent checkpoints to keep; None keeps all.")
    save_keep_every_n: Annotated[int | None, _positive_or_none("to keep none beyond the recent ones")] = Field(
        None, description="Also keep every n-th checkpoint for good.")
    autoresume: bool = Field(False, description="Resume from the latest checkpoint in save_folder, if any.")
    load_path: StorageURL = Field(None, description="A checkpoint to start from (when not autoresuming).")
    load_weights_only: bool = Field(False, description="From load_path, load the weights only (fine-tuning).")
    eval_interval: Interval = Field(None, description="How often to evaluate; None: every epoch.")
    eval_subset_num_batches: Annotated[int | None, _positive_or_none("for the whole eval set")] = Field(
        None, description="Evaluate on this many batches only.")
    precision: Annotated[Precision, BeforeValidator(_precision)] = Field(
        Precision.FP32, description="fp32, amp_bf16 or amp_fp16 (adds a gradient scaler).")
    grad_clip_norm: Annotated[float | None, AfterValidator(_clip)] = Field(
        None, description="Clip the gradients' global norm to this; None: no clipping.")
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop", description="A NaN/infinite loss or grad norm: stop the run (NonFiniteError), or skip the step's "
                            "update and go on.")
    max_skipped_steps: int = Field(
        10, ge=0, description="With on_nonfinite=skip: the run stops anyway after more skipped steps than this.")
    device_train_microbatch_size: Annotated[int | Literal["auto"] | None, BeforeValidator(_microbatch)] = Field(
        None, description="Samples per forward/backward; 'auto' halves it on out-of-memory; None: the batch.")
    global_batch_size: Annotated[int | None, _positive_or_none("for the loader's batch x world size")] = Field(
        None, description="Samples per step over all ranks; must be the loader's batch x world size.")
    loggers: Annotated[list[Any], BeforeValidator(parse_loggers), PlainSerializer(dump_loggers)] = Field(
        default_factory=lambda: ["progress"], description=f"Logger names ({', '.join(LOGGERS)}), or a mapping "
        "of name to its settings ({mlflow: {tracking_uri: ..., experiment: ...}}); see docs/trackers.md.")
    log_dir: Annotated[str, BeforeValidator(_fspath)] = Field("logs/{run_name}",
                                                              description="Where file loggers write.")
    log_interval: Interval = Field("1ba", description="How often to log the training metrics.")
    torch_threads: int | None = Field(
        None, ge=1, le=1024, description="torch's CPU threads. None: decided at the run's first start from the CPUs "
        "it may use (affinity mask, cgroup quota, local ranks) less those other processes keep busy (cpu_threads.py); "
        "a resumed run keeps the count it started with, as CPU sums differ with it.")
    device: Annotated[str | None, BeforeValidator(_device)] = Field(
        None, description="A torch device (cpu, cuda, cuda:1); None: the rank's GPU, else the CPU.")
    parallelism: ParallelismConfig = Field(
        default_factory=ParallelismConfig, description="How the model is spread over ranks: ddp, fsdp, None "
        "(shorthands), or a section (train/parallel/config.py): fsdp sharding and dtypes, tensor_parallel, "
        "activation_checkpointing, compile, float8.")

    @model_validator(mode="after")
    def _needs_save_folder(self) -> TrainerConfig:
        if self.autoresume and self.save_folder is None:
            raise ValueError("autoresume=True needs save_folder (where the run's checkpoints are)")
        return self

    @classmethod
    def of(cls, settings: dict[str, Any]) -> TrainerConfig:
        """The config from keyword settings: TypeError for an unknown keyword (with a did-you-mean), as a
        Python call would raise, and ValueError naming the setting for a bad value."""
        for name in settings:
            if name not in cls.model_fields:
                raise TypeError(f"Trainer got an unknown setting {name!r}{hint(name, cls.model_fields)}")
        try:
            return cls(**settings)
        except ValidationError as exc:
            raise ValueError(one_message(exc)) from None


# --- the optimizer and the schedule a run description names ------------------------------------------------


def _non_negative(value: float, info: ValidationInfo) -> float:
    """A learning rate or a factor of one: NaN, infinity or a negative number would train nothing useful."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{info.field_name} must be a finite number >= 0, got {value}")
    return value


class OptimizerConfig(BaseModel):
    """The optimizer of a run by name, with its hyperparameters (`build` makes it)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: Literal["decoupled_adamw", "adamw", "decoupled_lionw"] = Field(
        "decoupled_adamw", description="decoupled_adamw (and decoupled_lionw, Lion: no eps): the weight decay "
                                       "follows the schedule, not the lr.")
    lr: Annotated[float, AfterValidator(_non_negative)] = Field(6e-4, description="The peak learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="Adam's moment decay rates, each in [0, 1).")
    eps: Annotated[float, AfterValidator(_non_negative)] = Field(1e-8, description="Adam's denominator term.")
    weight_decay: Annotated[float, AfterValidator(_non_negative)] = Field(
        0.0, description="Decay per step (decoupled: not scaled by lr).")

    @field_validator("betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):  # also false for NaN
            raise ValueError(f"each beta must be in [0, 1) (e.g. [0.9, 0.95]), got {list(value)}")
        return value

    def build(self, params: Iterable[Any]) -> torch.optim.Optimizer:
        from tessera.train.optim import build_optimizer  # torch: only when a run is built

        return build_optimizer(self.name, params, lr=self.lr, betas=self.betas, eps=self.eps,
                               weight_decay=self.weight_decay)


SCHEDULES = {"cosine_with_warmup": CosineWithWarmup, "linear_with_warmup": LinearWithWarmup,
             "constant_with_warmup": ConstantWithWarmup}


class SchedulerConfig(BaseModel):
    """The learning-rate schedule of a run by name (`build` makes it; the Trainer resolves it)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True,
                              validate_default=True)

    name: Literal["cosine_with_warmup", "linear_with_warmup", "constant_with_warmup"] = Field(
        "cosine_with_warmup", description="The shape after the warm-up.")
    t_warmup: TimeSetting = Field("0ba", description="Warm-up length, as a time (e.g. 100ba).")
    alpha_f: Annotated[float, AfterValidator(_non_negative)] = Field(
        0.1, description="The final learning rate as a fraction of lr (not used by constant_with_warmup).")

    def build(self) -> Schedule:
        decay = {"alpha_f": self.alpha_f} if self.name != "constant_with_warmup" else {}
        return SCHEDULES[self.name](warmup=self.t_warmup or "0ba", **decay)
