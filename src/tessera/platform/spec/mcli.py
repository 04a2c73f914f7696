"""MCLI's run YAML, read as it is: `is_mcli` recognises it, `to_run_spec` turns it into a RunSpec.

Every key of MCLI's RunConfig is understood (docs/mcli.md says what Tessera does with each): `name` /
`run_name`, `image`, `command`, `gpu_num`, `gpu_type`, `cpus`, `cluster` / `platform`, `compute`
{cluster, gpus, gpu_type, instance, nodes, cpus}, `integrations`, `env_variables` (MCLI's list of
{key, value}, or the mapping newer MCLI writes), `parameters`, `scheduling` {priority, preemptible,
retry_on_system_failure, max_retries, max_duration (hours), resumable}, `metadata`. Keys MCLI accepts but
Tessera cannot honour (an inference `dependent_deployment`, pinned `node_names`) are refused by name
rather than dropped, and so is any unknown key, so a typo never silently changes a run.

Tessera keeps MCLI's defaults where they differ from its own: no retries unless `scheduling` asks, and
every secret goes to the run (`all_secrets`), since MCLI's YAML has no list of them.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from tessera.platform.errors import SpecError
from tessera.platform.spec.schema import RunSpec, describe_error, validate_name
from tessera.suggest import did_you_mean, meant

TOP_KEYS = ("name", "run_name", "image", "command", "compute", "gpu_num", "gpu_type", "cpus", "cluster",
            "platform", "integrations", "env_variables", "parameters", "scheduling", "metadata")
COMPUTE_KEYS = ("cluster", "gpus", "gpu_type", "instance", "nodes", "cpus")
SCHEDULING_KEYS = ("priority", "preemptible", "retry_on_system_failure", "max_retries", "max_duration",
                   "resumable")
# Keys only MCLI's YAML has: one of them makes a file MCLI's.
_MCLI_ONLY = {"run_name", "gpu_num", "gpu_type", "cpus", "cluster", "platform", "env_variables", "entrypoint",
              "dependent_deployment", "partitions", "optimization_level", "parent_name", "experiment_tracker"}
_REFUSED = {
    "entrypoint": "MCLI deprecated `entrypoint`; write the command under `command`",
    "dependent_deployment": "inference deployments are not part of Tessera",
    "experiment_tracker": "set the tracker in the training config (Tessera's MLflow / W&B loggers)",
    "partitions": "choose the Slurm partition on the cluster (`tessera cluster add --partition`)",
    "optimization_level": "MCLI deprecated `optimization_level`; remove it",
    "parent_name": "runs have no parent in Tessera; remove it",
    "node_names": "Tessera places nodes itself (it excludes faulty ones); remove compute.node_names",
    "secrets": "an MCLI run gets every secret (`tessera secret create ...`), as on MCLI; remove it",
}
_MEANT = {"env": "env_variables", "environment": "env_variables", "gpus": "gpu_num", "num_gpus": "gpu_num",
          "nodes": "compute", "gpus_per_node": "compute"}
_INTEGRATIONS = ("git_repo", "pip_packages", "apt_packages")
_TRACKERS = {"wandb": "WANDB_PROJECT, WANDB_ENTITY", "comet_ml": "COMET_PROJECT_NAME, COMET_WORKSPACE",
             "mlflow": "MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME"}
_PRIORITY = {"lowest": "low", "low": "low", "medium": "normal", "default": "normal", "normal": "normal",
             "high": "high", "highest": "high"}
GPUS_PER_NODE = 8   # MCLI's clusters: gpu_num beyond 8 means whole 8-GPU nodes
PARAMETERS_PATH = "/mnt/config/parameters.yaml"   # where MCLI mounts `parameters`


def priority_from_mcli(value: str) -> str:
    """Tessera's priority for one of MCLI's (lowest, low, medium, high, highest, any case)."""
    found = _PRIORITY.get(str(value).lower())
    if found is None:
        raise SpecError(f"scheduling.priority: {value!r} is not one of lowest, low, medium, high, highest")
    return found


def is_mcli(data: dict[str, Any]) -> bool:
    """True for MCLI's run YAML: a key only MCLI has, MCLI's compute/scheduling keys, or MCLI's priorities.
    A file with only keys both share (name, image, command, parameters) reads the same either way."""
    if _MCLI_ONLY & set(data):
        return True
    compute, scheduling = data.get("compute"), data.get("scheduling")
    if isinstance(compute, dict) and {"gpus", "cpus", "node_names"} & set(compute):
        return True
    if isinstance(scheduling, dict):   # `preemptible` is Tessera's key too: it tells nothing
        return "resumable" in scheduling or scheduling.get("priority") in ("lowest", "medium", "highest")
    return False


class _Problems:
    """Problems found while translating, each naming the MCLI key; raised together as one SpecError."""

    def __init__(self, source: str) -> None:
        self.source, self.items = source, []

    def add(self, key: str, message: str) -> None:
        self.items.append(f"{key}: {message}")

    def raise_if_any(self) -> None:
        if len(self.items) == 1:
            raise SpecError(f"{self.source}: {self.items[0]}")
        if self.items:
            raise SpecError(f"{self.source} is invalid (MCLI run YAML):\n" +
                            "\n".join(f"  - {item}" for item in self.items))


def _unknown(keys: set[str], known: tuple[str, ...], where: str, problems: _Problems) -> None:
    for key in sorted(keys - set(known), key=str):
        name = f"{where}{key}"
        if key in _REFUSED:
            problems.add(name, f"not supported: {_REFUSED[key]}")
            continue
        named = _MEANT.get(key) if _MEANT.get(key) in known else None
        hint = meant(named) if named else did_you_mean(str(key), known, list_known=True)
        problems.add(name, f"unknown key (MCLI run YAML; {hint})")


def _integer(value: Any, key: str, problems: _Problems, minimum: int = 0) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.add(key, f"{value!r} is not a whole number >= {minimum}")
        return None
    return value


def _one(data: dict[str, Any], compute: dict[str, Any], top: str, inner: str, problems: _Problems) -> Any:
    """The value given at top level (MCLI's older form) or under compute (its newer form); both must agree."""
    a, b = data.get(top), compute.get(inner)
    if a is not None and b is not None and a != b:
        problems.add(top, f"{a!r} disagrees with compute.{inner} {b!r}; give one of them")
    return a if a is not None else b


def env_from_mcli(value: Any, problems: _Problems) -> dict[str, Any]:
    """MCLI's env_variables: a list of {key, value} (older MCLI) or a mapping (newer MCLI)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if not isinstance(value, list):
        problems.add("env_variables", "must be a list of {key: ..., value: ...} or a mapping of NAME: value")
        return {}
    out: dict[str, Any] = {}
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"key", "value"}:
            problems.add(f"env_variables[{i}]", "must be {key: NAME, value: VALUE}")
            continue
        if item["key"] in out:
            problems.add(f"env_variables[{i}]", f"{item['key']} is listed twice")
        out[item["key"]] = item["value"]
    return out


def hours_to_seconds(value: Any, problems: _Problems) -> float | str | None:
    """MCLI's max_duration is hours as a number; a Tessera duration string ("12h") is taken too."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        problems.add("scheduling.max_duration", f"{value!r} is not a positive number of hours")
        return None
    return float(value) * 3600.0


def _scheduling(value: Any, problems: _Problems) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        problems.add("scheduling", "must be a mapping")
        return {}
    _unknown(set(value), SCHEDULING_KEYS, "scheduling.", problems)
    out: dict[str, Any] = {"max_retries": 0, "retry_on_system_failure": bool(value.get("resumable", False))}
    priority = value.get("priority")
    if priority is not None:
        if str(priority).lower() not in _PRIORITY:
            problems.add("scheduling.priority", f"{priority!r} is not one of lowest, low, medium, high, highest")
        else:
            out["priority"] = _PRIORITY[str(priority).lower()]
    for key in ("preemptible", "retry_on_system_failure", "max_retries"):
        if value.get(key) is not None:
            out[key] = value[key]
    seconds = hours_to_seconds(value.get("max_duration"), problems)
    if seconds is not None:
        out["max_duration"] = seconds
    return out


def _integrations(value: Any, problems: _Problems) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.add("integrations", "must be a list of {integration_type: ..., ...}")
        return []
    out = []
    for i, item in enumerate(value):
        kind = item.get("integration_type") if isinstance(item, dict) else None
        if kind is None:
            problems.add(f"integrations[{i}]", f"needs integration_type ({', '.join(_INTEGRATIONS)})")
        elif kind in _TRACKERS:
            problems.add(f"integrations[{i}]", f"integration_type {kind} is not run by Tessera: set "
                         f"{_TRACKERS[kind]} in env_variables and its API key through a secret")
        elif kind not in _INTEGRATIONS:
            problems.add(f"integrations[{i}]", f"integration_type {kind!r} is not supported (supported: "
                         f"{', '.join(_INTEGRATIONS)})")
        else:
            out.append(item)
    return out


def _compute(data: dict[str, Any], problems: _Problems) -> dict[str, Any]:
    compute = data.get("compute") or {}
    if not isinstance(compute, dict):
        problems.add("compute", "must be a mapping")
        compute = {}
    _unknown(set(compute), COMPUTE_KEYS, "compute.", problems)
    gpus = _integer(_one(data, compute, "gpu_num", "gpus", problems), "gpu_num", problems) or 0
    cpus = _integer(_one(data, compute, "cpus", "cpus", problems), "cpus", problems)
    nodes = _integer(compute.get("nodes"), "compute.nodes", problems, minimum=1)
    if nodes is None:
        nodes = 1 if gpus <= GPUS_PER_NODE else -(-gpus // GPUS_PER_NODE)
        if gpus > GPUS_PER_NODE and gpus % GPUS_PER_NODE:
            problems.add("gpu_num", f"{gpus} GPUs do not fill whole {GPUS_PER_NODE}-GPU nodes; set compute.nodes")
    if gpus % nodes:
        problems.add("gpu_num", f"{gpus} GPUs cannot be split evenly over {nodes} nodes")
    out: dict[str, Any] = {"nodes": nodes, "gpus_per_node": gpus // nodes}
    cluster = data.get("cluster") or data.get("platform") or compute.get("cluster")
    if cluster is not None:
        out["cluster"] = cluster
    gpu_type = _one(data, compute, "gpu_type", "gpu_type", problems)
    if gpu_type is not None and str(gpu_type).lower() not in ("none", "cpu", ""):
        out["gpu_type"] = str(gpu_type)
    if cpus:
        out["cpus_per_node"] = max(1, cpus // nodes)
    if compute.get("instance") is not None:
        out["instance"] = compute["instance"]
    return out


def _name(data: dict[str, Any], problems: _Problems) -> tuple[str, str]:
    key = "run_name" if data.get("run_name") is not None else "name"
    name = data.get(key)
    if data.get("name") is not None and data.get("run_name") is not None and data["name"] != data["run_name"]:
        problems.add("run_name", f"{data['run_name']!r} disagrees with name {data['name']!r}; give one of them")
    if name is None:
        problems.add("run_name", "required (MCLI's `name` or `run_name`)")
        return key, ""
    try:
        validate_name(name, key)
    except ValueError as exc:
        problems.add(key, str(exc))
    return key, name


def to_spec_dict(data: dict[str, Any], source: str = "run spec") -> tuple[dict[str, Any], dict[str, str]]:
    """Tessera's spec as a dict, and which MCLI key each Tessera key came from (for error messages)."""
    problems = _Problems(source)
    _unknown(set(data), TOP_KEYS, "", problems)
    key, name = _name(data, problems)
    command = data.get("command")
    if not isinstance(command, str) or not command.strip():
        problems.add("command", "required: the shell command the run executes")
        command = ""
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        problems.add("parameters", "must be a mapping")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        problems.add("metadata", "must be a mapping")
    spec: dict[str, Any] = {
        "name": name, "command": command.replace(PARAMETERS_PATH, "$TESSERA_PARAMETERS"),
        "compute": _compute(data, problems), "env": env_from_mcli(data.get("env_variables"), problems),
        "scheduling": _scheduling(data.get("scheduling"), problems),
        "integrations": _integrations(data.get("integrations"), problems),
        "parameters": parameters, "metadata": metadata, "all_secrets": True,
    }
    if data.get("image") is not None:
        spec["image"] = data["image"]
    problems.raise_if_any()
    origin = {"name": key, "env": "env_variables", "compute.gpus_per_node": "gpu_num",
              "compute.cpus_per_node": "cpus", "compute.cluster": "cluster"}
    return spec, origin


def _mcli_location(error: dict[str, Any], origin: dict[str, str]) -> str:
    loc = [str(p) for p in error["loc"]]
    if loc[:1] == ["integrations"] and len(loc) > 1:
        rest = loc[3:] if len(loc) > 2 and loc[2] in _INTEGRATIONS else loc[2:]   # drop pydantic's union tag
        return f"integrations[{loc[1]}]" + "".join(f".{p}" for p in rest)
    for cut in range(len(loc), 0, -1):
        head = ".".join(loc[:cut])
        if head in origin:
            return ".".join([origin[head], *loc[cut:]])
    return ".".join(loc)


def to_run_spec(data: dict[str, Any], source: str = "run spec") -> RunSpec:
    """A RunSpec from MCLI's run YAML (parsed), or one SpecError whose lines name MCLI's keys."""
    spec, origin = to_spec_dict(data, source)
    try:
        return RunSpec.model_validate(spec)
    except ValidationError as exc:
        problems = _Problems(source)
        for error in exc.errors():
            message = describe_error(error).split(": ", 1)[-1]
            problems.add(_mcli_location(error, origin), message)
        problems.raise_if_any()
        raise   # not reached: raise_if_any raised
