"""The run spec's schema: every key Tessera's own run YAML has, with its bounds, and the helpers the
keys use (names, durations). `spec.py` reads files into it (Tessera's YAML or MCLI's, see mcli.py);
the definitions live here so the MCLI translation can build on them without an import circle.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)

from tessera.suggest import hint

# Variables Tessera sets itself in every run; a spec may not override them.
RESERVED_ENV = frozenset({
    "RUN_NAME", "TESSERA_RUN_ID", "TESSERA_RESUMPTION", "TESSERA_HEARTBEAT", "TESSERA_HEARTBEAT_INTERVAL",
    "TESSERA_PARAMETERS", "TESSERA_METRICS", "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT",
})

NAME_MAX = 63         # run, secret, cluster, team and user names: one path component, and a DNS label
_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|d|h|m|s)")
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_CPUS_PER_NODE = 4096
MAX_PROCS_PER_NODE = 1024
MAX_RETRIES = 1000
MAX_INTEGRATIONS = 32
MAX_METADATA_BYTES = 65536
WEEK = 7 * 86400.0  # hang_timeout, stop_grace: longer is a typo, not a setting
YEAR = 366 * 86400.0  # max_duration: total running time over all resumptions


def shorten(value: str, keep: int = 32) -> str:
    """`value` cut to its first `keep` characters (and '...') for a one-line message about it."""
    return value if len(value) <= keep else value[:keep] + "..."


def validate_name(name: str, what: str = "name") -> str:
    """A run, secret or cluster name: it names a folder, so no path tricks and nothing exotic. A name
    longer than NAME_MAX is refused first, by its length (the message shows its start, not all of it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string")
    if len(name) > NAME_MAX:
        raise ValueError(f"{what} {shorten(name)!r} is {len(name)} characters long; at most {NAME_MAX} are "
                         "allowed")
    if "/" in name or "\\" in name or ".." in name or name.startswith("."):
        raise ValueError(f"{what} {name!r} is refused: it names a folder, so '/', '\\', '..' and a leading "
                         "'.' (path traversal) are not allowed")
    if not _NAME.match(name):
        raise ValueError(f"{what} {name!r} must be 1-63 characters of a-z, 0-9, '-', '_', '.', starting and "
                         "ending with a letter or digit")
    return name


def parse_duration(value: Any) -> float:
    """Seconds from "12h", "10m", "1h30m", "45s", "2d", "500ms", or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"duration {value!r} is not a duration; write e.g. '10m', '12h' or '30s'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"duration {value!r} is not understood; write e.g. '10m', '12h', '1h30m' "
                                 "or '30s'") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"duration {value!r} is not a duration; write e.g. '10m', '12h' or '30s'")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"duration {value!r} must be positive and finite")
    return seconds


def _at_most(limit: float) -> Any:
    """A validator refusing durations above `limit` seconds, naming the limit as a duration."""

    def check(seconds: float) -> float:
        if seconds > limit:
            raise ValueError(f"duration {format_duration(seconds)} is longer than the {format_duration(limit)} "
                             "allowed")
        return seconds

    return AfterValidator(check)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    out, rest = [], float(seconds)
    for unit in ("d", "h", "m"):
        count, rest = divmod(rest, _UNITS[unit])
        if count:
            out.append(f"{int(count)}{unit}")
    if rest or not out:
        out.append(f"{rest:g}s")
    return "".join(out)


Duration = Annotated[float, BeforeValidator(parse_duration), _at_most(WEEK)]
LongDuration = Annotated[float, BeforeValidator(parse_duration), _at_most(YEAR)]


def _stringify(value: Any) -> Any:
    """YAML turns `FOO: 1` into an int; environment values are strings."""
    if isinstance(value, dict):
        return {k: (str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v)
                for k, v in value.items()}
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class Compute(_Model):
    cluster: str | None = Field(None, description="Cluster name; `--cluster` or 'local' when absent.")
    nodes: int = Field(1, ge=1, le=MAX_NODES, description="Nodes, all started together (gang).")
    gpus_per_node: int = Field(0, ge=0, le=MAX_GPUS_PER_NODE)
    cpus_per_node: int | None = Field(None, ge=1, le=MAX_CPUS_PER_NODE)
    gpu_type: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                                 description="GPU model the run needs (e.g. a100_40gb); checked before start.")
    instance: str | None = Field(None, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_./-]*$",
                                 description="MCLI's instance name: recorded and shown, chosen by no backend.")
    procs_per_node: int | None = Field(
        None, ge=1, le=MAX_PROCS_PER_NODE, description="Ranks per node (torchrun when > 1); default gpus_per_node, or 1.")

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, value: str | None) -> str | None:
        return None if value is None else validate_name(value, "cluster name")

    @property
    def ranks_per_node(self) -> int:
        return self.procs_per_node or self.gpus_per_node or 1


class Scheduling(_Model):
    max_retries: int = Field(3, ge=0, le=MAX_RETRIES, description="Retries after failures that may be transient.")
    retry_on_system_failure: bool = Field(
        True, description="Retry node faults and preemptions without counting them against max_retries.")
    max_duration: LongDuration | None = Field(None, description="Total running time over all resumptions.")
    priority: Literal["low", "normal", "high"] = "normal"
    preemptible: bool = Field(False, description="May be stopped for other work (Slurm: the cluster's "
                                                 "preemptible_qos).")
    hang_timeout: Duration | None = Field(None, description="Kill and retry after this long without a heartbeat.")
    stop_grace: Duration = Field(30.0, description="Time between SIGTERM and SIGKILL on stop, move or hang.")


_REF = r"^[A-Za-z0-9_][A-Za-z0-9_./+@{}-]*$"   # a git branch or tag name that cannot read as an option


def _shell_words(value: str, what: str) -> str:
    """Pip arguments are split like a shell would (MCLI hands them to one); unbalanced quotes are refused."""
    try:
        shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"{what} {value!r} cannot be split into arguments: {exc}") from None
    return value


class GitRepoIntegration(_Model):
    """MCLI's git_repo integration: clone on every node (then `pip install <pip_install>` inside it)."""
    integration_type: Literal["git_repo"]
    git_repo: str = Field(min_length=1, max_length=512, pattern=r"^[^\s-][^\s]*$",
                          description="org/repo on `host`, or a clone URL (https://, ssh://, git@, file://).")
    git_branch: str | None = Field(None, max_length=255, pattern=_REF)
    git_commit: str | None = Field(None, pattern=r"^[0-9a-fA-F]{4,64}$", description="Checked out after the clone.")
    path: str | None = Field(None, max_length=255, description="Folder to clone into, relative to the node's "
                                                               "working folder; default: the repository's name.")
    ssh_clone: bool = Field(False, description="Clone git@host:org/repo.git with the run's git-ssh secret.")
    pip_install: str | None = Field(None, max_length=1000, description="Arguments of `pip install`, run in the clone.")
    host: str = Field("github.com", max_length=255, pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?$")
    git_clone_recursive: bool = False

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = value.replace("\\", "/").split("/")
        if value.startswith(("/", "-", "~")) or ".." in parts or not value.strip("/."):
            raise ValueError(f"path {value!r} must be a relative folder without '..' (it is created inside "
                             "the run's working folder on each node)")
        return value

    @field_validator("pip_install")
    @classmethod
    def _pip_install(cls, value: str | None) -> str | None:
        return None if value is None else _shell_words(value, "pip_install")


class PipPackagesIntegration(_Model):
    """MCLI's pip_packages integration: `pip install [--upgrade] <packages>` on every node."""
    integration_type: Literal["pip_packages"]
    packages: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(min_length=1, max_length=200)
    upgrade: bool = False

    @field_validator("packages")
    @classmethod
    def _packages(cls, value: list[str]) -> list[str]:
        return [_shell_words(package, "package") for package in value]


class AptPackagesIntegration(_Model):
    """MCLI's apt_packages integration: `apt-get install -y <packages>` (needs root, as in an image)."""
    integration_type: Literal["apt_packages"]
    packages: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9+.:=~-]*$", max_length=200)]] = Field(
        min_length=1, max_length=200)


Integration = Annotated[GitRepoIntegration | PipPackagesIntegration | AptPackagesIntegration,
                        Field(discriminator="integration_type")]


class RunSpec(_Model):
    name: str
    command: str = Field(min_length=1)
    image: str | None = Field(None, max_length=512, pattern=r"^[A-Za-z0-9][^\s]*$",
                              description="Container image the command runs in, where the cluster can (docs/mcli.md).")
    compute: Compute = Field(default_factory=Compute)
    env: Annotated[dict[str, str], BeforeValidator(_stringify)] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    all_secrets: bool = Field(False, description="Every secret of the platform home (a team's, on a server) "
                                                 "goes to the run, as MCLI does; `secrets` is then ignored.")
    scheduling: Scheduling = Field(default_factory=Scheduling)
    parameters: dict[str, Any] = Field(default_factory=dict)
    integrations: list[Integration] = Field(default_factory=list, max_length=MAX_INTEGRATIONS,
                                            description="Set-up steps run on every node before the command.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form; kept and shown.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name(value, "run name")

    @field_validator("command")
    @classmethod
    def _command(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("command is empty")
        return value

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, value: list[str]) -> list[str]:
        for name in value:
            validate_name(name, "secret name")
        if len(set(value)) != len(value):
            raise ValueError("a secret is listed twice")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_KEY.match(key):
                raise ValueError(f"environment variable name {key!r} is not valid ([A-Za-z_][A-Za-z0-9_]*)")
            if key in RESERVED_ENV:
                raise ValueError(f"environment variable {key} is set by Tessera and cannot be overridden")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(value, default=str)) > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is larger than {MAX_METADATA_BYTES // 1024} KiB")
        return value

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def parameters_yaml(self) -> str:
        """parameters.yaml as every cluster gives it to the run (TESSERA_PARAMETERS), in the spec's order."""
        return yaml.safe_dump(self.parameters, sort_keys=False)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose field list applies at `loc` (for did-you-mean on unknown keys)."""
    model: type[BaseModel] | None = RunSpec
    for part in loc:
        field = model.model_fields.get(part) if model else None
        annotation = field.annotation if field else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if model is None:
            return None
    return model


def describe_error(error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    where = ".".join(str(p) for p in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        parent, key = _model_at(loc[:-1]), str(loc[-1])
        known = list(parent.model_fields) if parent else []
        return f"{where}: unknown key{hint(key, known, list_known=True)}"
    if error["type"] == "missing":
        return f"{where}: required"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"
