"""MCLI's `runInput` (what `createRun` sends: the run YAML in MosaicML's API spelling, camelCase) to and
from the run YAML that spec/mcli.py reads, so a run made through `mcli run -f` is validated and translated
exactly as `tessera run submit -f` does it, and `mcli describe run` shows the YAML back.

The client writes `runName`, `gpuType`, `envVariables: [{envKey, envValue}]`, `integrations:
[{type, params: {camelCase}}]`, `scheduling: {maxRetries, retryOnSystemFailure, maxDuration}` and
`compute: {gpuType, nodeNames}`; empty values (`parentName: null`, `dependentDeployment: {}`) mean unset.
A key this module does not know is passed on in snake_case, so spec/mcli.py refuses it by name.
"""

from __future__ import annotations

import re
from typing import Any

from tessera.platform.errors import SpecError
from tessera.platform.spec.mcli import PARAMETERS_PATH
from tessera.platform.spec.run_spec import RunSpec

_TOP = {"runName": "name", "gpuType": "gpu_type", "gpuNum": "gpu_num", "envVariables": "env_variables",
        "parentName": "parent_name", "dependentDeployment": "dependent_deployment"}
_PRIORITY = {"low": "low", "normal": "medium", "high": "high"}   # Tessera's -> MCLI's word for it


def snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"createRun runInput.{where}: must be an object")
    return value


def _env(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):    # a mapping (MCLI's YAML form) is taken as it is
        return value
    if not isinstance(value, list):
        raise SpecError("createRun runInput.envVariables: must be a list of {envKey, envValue}")
    out: dict[str, Any] = {}
    for i, item in enumerate(value):
        if not isinstance(item, dict) or "envKey" not in item:
            raise SpecError(f"createRun runInput.envVariables[{i}]: must be {{envKey, envValue}}")
        out[item["envKey"]] = item.get("envValue")
    return out


def _integration(item: Any, i: int) -> dict[str, Any]:
    item = _mapping(item, f"integrations[{i}]")
    if "type" not in item:
        raise SpecError(f"createRun runInput.integrations[{i}]: needs a type (e.g. git_repo)")
    params = _mapping(item.get("params") or {}, f"integrations[{i}].params")
    return {"integration_type": item["type"], **{snake(k): v for k, v in params.items()}}


def to_mcli_yaml(run_input: Any) -> dict[str, Any]:
    """The run YAML (as MCLI users write it) that a `createRun` runInput describes."""
    data = _mapping(run_input, "")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if value is None or value == {} or (key == "cluster" and value == ""):
            continue
        name = _TOP.get(key, snake(key))
        if name == "env_variables":
            value = _env(value)
        elif name == "integrations":
            value = [_integration(item, i) for i, item in enumerate(value or [])]
        elif name in ("scheduling", "compute"):
            value = {snake(k): v for k, v in _mapping(value, key).items() if v is not None}
        out[name] = value
    return out


def original_run_input(spec: RunSpec, cluster: str) -> dict[str, Any]:
    """The runInput that describes `spec` (MCLI's `details.originalRunInput`, read back into a RunConfig
    by the client): the run YAML it was made from, in the form Tessera keeps it."""
    compute = spec.compute
    scheduling: dict[str, Any] = {"priority": _PRIORITY[spec.scheduling.priority],
                                  "preemptible": spec.scheduling.preemptible,
                                  "retryOnSystemFailure": spec.scheduling.retry_on_system_failure,
                                  "maxRetries": spec.scheduling.max_retries}
    if spec.scheduling.max_duration is not None:
        scheduling["maxDuration"] = spec.scheduling.max_duration / 3600.0
    out: dict[str, Any] = {
        "runName": spec.name, "image": spec.image,
        "command": spec.command.replace("$TESSERA_PARAMETERS", PARAMETERS_PATH),
        "compute": {k: v for k, v in (("cluster", cluster), ("gpus", compute.gpus_per_node * compute.nodes),
                                      ("gpuType", compute.gpu_type), ("nodes", compute.nodes),
                                      ("instance", compute.instance)) if v is not None},
        "scheduling": scheduling,
        "integrations": [{"type": item.integration_type,
                          "params": {camel(k): v for k, v in item.model_dump(exclude_none=True).items()
                                     if k != "integration_type"}} for item in spec.integrations],
        "envVariables": [{"envKey": k, "envValue": v} for k, v in spec.env.items()],
        "parameters": spec.parameters, "metadata": spec.metadata,
    }
    if compute.cpus_per_node is not None:
        out["compute"]["cpus"] = compute.cpus_per_node * compute.nodes
    return out


def mcli_priority(priority: str) -> str:
    """MCLI's word for a Tessera priority (low, medium, high)."""
    return _PRIORITY.get(priority, priority).upper()
