"""The loggers of a run as typed settings: names (`[progress, jsonl]`) or a mapping of a logger's name to its
settings (`{mlflow: {tracking_uri: sqlite:///mlflow.db, experiment: lm}, wandb: {project: lm, mode: offline}}`).

`TrainerConfig` and recipes validate loggers here without importing torch, mlflow or wandb. loggers.py
builds the file and console loggers from their settings; a tracker's settings build it (`build`), importing
its module only then, and its library only when the run starts, since mlflow and wandb are slow to import.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tessera.suggest import hint
from tessera.train.logger_base import Logger


class LoggerSettings(BaseModel):
    """One logger's settings; `name` is its key in `loggers`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: ClassVar[str]

    def build(self) -> Logger:
        """The logger (trackers; loggers.py builds the others)."""
        raise NotImplementedError(f"loggers.py builds the {self.name} logger")


class ProgressSettings(LoggerSettings):
    """A progress bar on a terminal, a plain line every `every` logged steps otherwise."""

    name: ClassVar[str] = "progress"
    every: int = Field(1, ge=1, description="Without a terminal: print every n-th logged step.")


class JSONLSettings(LoggerSettings):
    """One JSON object per logged step."""

    name: ClassVar[str] = "jsonl"
    path: str | None = Field(None, description="The file; None: <log_dir>/metrics.jsonl.")


class TensorBoardSettings(LoggerSettings):
    """TensorBoard event files (needs the tensorboard package)."""

    name: ClassVar[str] = "tensorboard"
    path: str | None = Field(None, description="The folder; None: <log_dir>/tensorboard.")


_MLFLOW_SCHEMES = {"file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks"}


class MLflowSettings(LoggerSettings):
    """An MLflow run: params, metrics, artifacts; resumed with the training run."""

    name: ClassVar[str] = "mlflow"
    tracking_uri: str | None = Field(None, description="file:/path, sqlite:///mlflow.db or http(s)://server; "
                                                       "None: $MLFLOW_TRACKING_URI, else MLflow's default.")
    experiment: str | None = Field(None, description="The experiment (created if missing); None: "
                                                     "$MLFLOW_EXPERIMENT_NAME, else MLflow's Default.")
    run_name: str | None = Field(None, description="The MLflow run's name; None: $RUN_NAME, else the run's.")
    tags: dict[str, str] = Field(default_factory=dict, description="Tags set on the MLflow run.")
    artifacts: bool = Field(True, description="At the end, upload metrics.jsonl and the run's config.")

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        scheme = parts.scheme.split("+")[0]  # postgresql+psycopg://...
        if parts.scheme and len(parts.scheme) > 1 and scheme not in _MLFLOW_SCHEMES:
            raise ValueError(f"unsupported scheme {parts.scheme!r} in {value!r}; use file:/path, "
                             "sqlite:///file.db or http(s)://host:port")
        if parts.password:
            raise ValueError("it holds a password: remove it and set MLFLOW_TRACKING_USERNAME and "
                             "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the run's environment")
        return value

    def build(self) -> Logger:
        from tessera.train.trackers.mlflow_logger import MLflowLogger

        return MLflowLogger(tracking_uri=self.tracking_uri, experiment=self.experiment, run_name=self.run_name,
                            tags=self.tags, artifacts=self.artifacts)


class WandBSettings(LoggerSettings):
    """A Weights & Biases run (online, or offline to sync later); resumed with the training run."""

    name: ClassVar[str] = "wandb"
    project: str | None = Field(None, description="The W&B project; None: $WANDB_PROJECT, else W&B's default.")
    entity: str | None = Field(None, description="The team or user; None: $WANDB_ENTITY, else your default.")
    run_name: str | None = Field(None, description="The W&B run's display name; None: $RUN_NAME, else the run's.")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="online, offline (sync later with `wandb sync`) or disabled; None: $WANDB_MODE.")
    group: str | None = Field(None, description="Groups runs in the W&B UI.")
    tags: list[str] = Field(default_factory=list, description="Tags on the W&B run.")

    def build(self) -> Logger:
        from tessera.train.trackers.wandb_logger import WandBLogger

        return WandBLogger(project=self.project, entity=self.entity, run_name=self.run_name, mode=self.mode,
                           group=self.group, tags=self.tags)


LOGGERS: dict[str, type[LoggerSettings]] = {
    cls.name: cls for cls in (ProgressSettings, JSONLSettings, TensorBoardSettings, MLflowSettings, WandBSettings)}


def parse_loggers(value: Any) -> list[Any]:
    """`loggers` as a list of names, `LoggerSettings` and Logger instances (kept as they are). Accepts a
    name, a list of names and `{name: settings}` items, or one `{name: settings}` mapping; `settings` null
    or {} means the defaults. ValueError with one line naming the logger and the key otherwise."""
    if value is None:
        return ["progress"]
    if isinstance(value, (str, Logger, LoggerSettings)):
        value = [value]
    if isinstance(value, dict):
        value = [{name: settings} for name, settings in value.items()]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"loggers must be a list of names or a mapping of name to settings, got {value!r}")
    return [_item(item) for item in value]


def _item(item: Any) -> Any:
    if isinstance(item, (Logger, LoggerSettings)):
        return item
    if isinstance(item, str):
        _known(item)
        return item
    if not (isinstance(item, dict) and len(item) == 1):
        raise ValueError(f"loggers: unknown logger {item!r}; use one of {sorted(LOGGERS)}, a {{name: settings}} "
                         "mapping or a Logger instance")
    ((name, settings),) = item.items()
    cls = LOGGERS[_known(name)]
    if settings is None:
        return cls()
    if not isinstance(settings, dict):
        raise ValueError(f"loggers: {name}'s settings must be a mapping (or null for the defaults), got {settings!r}")
    try:
        return cls.model_validate(settings)
    except ValidationError as exc:
        raise ValueError(_settings_error(name, cls, exc)) from None


def _known(name: Any) -> str:
    if not isinstance(name, str) or name not in LOGGERS:  # an unhashable name ([1]) is not looked up
        raise ValueError(f"loggers: unknown logger {name!r}; use one of {sorted(LOGGERS)} or a Logger instance")
    return name


def _settings_error(name: str, cls: type[LoggerSettings], exc: ValidationError) -> str:
    """The first problem as `loggers: unknown key 'mlflow.experimnt'; did you mean 'mlflow.experiment'?`."""
    err = exc.errors()[0]
    key = f"{name}." + ".".join(str(part) for part in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"loggers: unknown key {key!r}" + hint(str(err["loc"][-1]), cls.model_fields, prefix=f"{name}.")
    if err["type"] == "value_error":  # our own checks: the message says what is wrong, and never echoes a secret
        return f"loggers: {key}: {err['msg'].removeprefix('Value error, ')}"
    return f"loggers: {key}: {err['msg']} (got {err.get('input')!r})"


def dump_loggers(value: list[Any]) -> list[Any] | dict[str, Any]:
    """What a config file writes back, and reads back equal: a list of names as it is; with settings, the
    `{name: settings}` mapping (a list of one-key mappings if a name repeats); a Logger instance as its
    class name (an object a file cannot hold)."""
    if not any(isinstance(item, LoggerSettings) for item in value):
        return [item if isinstance(item, str) else type(item).__name__ for item in value]
    items = [{item.name: item.model_dump(mode="json")} if isinstance(item, LoggerSettings)
             else {item: None} if isinstance(item, str) else {type(item).__name__: None} for item in value]
    names = [next(iter(item)) for item in items]
    if len(set(names)) < len(names):
        return items
    return {name: settings for item in items for name, settings in item.items()}


def as_mapping(value: Any) -> Any:
    """A recipe's `loggers` list as the `{name: settings}` mapping, so an override can set one logger's key
    (`loggers.mlflow.experiment=lm` on `loggers: [progress, jsonl]`); anything else as it is."""
    if not isinstance(value, list):
        return value
    out: dict[str, Any] = {}
    for item in value:
        if isinstance(item, str) and item not in out:
            out[item] = None
        elif isinstance(item, dict) and len(item) == 1 and next(iter(item)) not in out:
            out.update(item)
        else:
            return value
    return out
