"""The run spec: what to run, where, with which secrets, and how hard to keep it alive.

```yaml
name: gpt-tiny
command: tessera train tiny-cpu.yaml save_folder=s3://bucket/runs/$RUN_NAME/checkpoints
compute: {cluster: local, nodes: 1, gpus_per_node: 0, cpus_per_node: 2}
env: {FOO: bar}
secrets: [r2-creds]
scheduling: {max_retries: 5, retry_on_system_failure: true, max_duration: 12h, priority: normal,
             hang_timeout: 10m}
parameters: {lr: 0.001}
```
`load_spec` validates everything before anything is submitted and raises one `SpecError` listing every
problem (unknown keys come with a did-you-mean). Every number is bounded to what a real run can use:
`gpus_per_node: 100000000000000000000` would otherwise reach torchrun (which allocates per rank) and the
supervisor would retry it, and a timeout of `1e400` (infinity) would never fire.

MCLI's run YAML (`run_name`, `gpu_num`, `integrations`, ...) is accepted by the same three functions:
`is_mcli` recognises it and mcli.py translates it (docs/mcli.md), so `tessera run submit -f mcli.yaml`
and the server's POST /api/v1/runs take either form. The schema itself is in spec_schema.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tessera.platform.errors import SpecError
from tessera.platform.spec.mcli import is_mcli, to_run_spec
from tessera.platform.spec.schema import (
    MAX_CPUS_PER_NODE,
    MAX_GPUS_PER_NODE,
    MAX_INTEGRATIONS,
    MAX_METADATA_BYTES,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    MAX_RETRIES,
    RESERVED_ENV,
    WEEK,
    YEAR,
    AptPackagesIntegration,
    Compute,
    GitRepoIntegration,
    Integration,
    PipPackagesIntegration,
    RunSpec,
    Scheduling,
    describe_error,
    format_duration,
    parse_duration,
    validate_name,
)
from tessera.syntax_errors import yaml_error

__all__ = [
    "MAX_CPUS_PER_NODE", "MAX_GPUS_PER_NODE", "MAX_INTEGRATIONS", "MAX_METADATA_BYTES", "MAX_NODES",
    "MAX_PROCS_PER_NODE", "MAX_RETRIES", "RESERVED_ENV", "WEEK", "YEAR", "AptPackagesIntegration", "Compute",
    "GitRepoIntegration", "Integration", "PipPackagesIntegration", "RunSpec", "Scheduling", "format_duration",
    "is_mcli", "load_spec", "parse_duration", "parse_spec", "validate_name", "validate_spec",
]


def validate_spec(data: Any, source: str = "run spec") -> RunSpec:
    """A RunSpec from parsed YAML/JSON (Tessera's form or MCLI's), or one SpecError naming every problem."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of keys (name, command, compute, ...), "
                        f"got {type(data).__name__}")
    if is_mcli(data):
        return to_run_spec(data, source)
    try:
        return RunSpec.model_validate(data)
    except ValidationError as exc:
        problems = "\n".join(f"  - {describe_error(e)}" for e in exc.errors())
        raise SpecError(f"{source} is invalid:\n{problems}") from None


def load_spec(path: str | Path) -> RunSpec:
    """Read and validate a run spec YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read run spec {path}: {exc.strerror or exc}") from None
    return parse_spec(text, str(path))


def parse_spec(text: str, source: str = "run spec") -> RunSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(yaml_error(exc, text, source)) from None
    return validate_spec(data, source)
