"""New specs made from a run's stored one: `Platform.update_run` (scheduling changed in place) and
`Platform.clone_run` (the same run under a new name). Pure functions: the SDK stores or submits what they
return. Both validate through the spec's own models, so a value refused at submit is refused here too,
with the same bounds and wording."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tessera.platform.errors import SpecError
from tessera.platform.spec.run_spec import RunSpec, Scheduling, format_duration, validate_name, validate_spec


def updated_scheduling(spec: RunSpec, *, priority: str | None = None, max_duration: Any = None,
                       max_retries: int | None = None, preemptible: bool | None = None,
                       retry_on_system_failure: bool | None = None) -> tuple[RunSpec, list[str]]:
    """(the spec with the given scheduling values, "key: old -> new" for each value that changed).
    None leaves a value as it is; a refused value raises one SpecError line naming the key."""
    changes = {k: v for k, v in (("priority", priority), ("max_duration", max_duration),
                                 ("max_retries", max_retries), ("preemptible", preemptible),
                                 ("retry_on_system_failure", retry_on_system_failure)) if v is not None}
    if not changes:
        raise SpecError("nothing to update: give priority, max_duration, max_retries, preemptible or "
                        "retry_on_system_failure")
    if "max_retries" in changes and isinstance(changes["max_retries"], bool):
        raise SpecError(f"run {spec.name}: scheduling.max_retries: {changes['max_retries']!r} is not a number")
    for key in ("preemptible", "retry_on_system_failure"):
        if key in changes and not isinstance(changes[key], bool):
            raise SpecError(f"run {spec.name}: scheduling.{key}: {changes[key]!r} is not true or false")
    try:
        scheduling = Scheduling.model_validate({**spec.scheduling.model_dump(), **changes})
    except ValidationError as exc:
        problems = "; ".join(f"scheduling.{'.'.join(str(p) for p in e['loc'])}: "
                             f"{str(e['msg']).removeprefix('Value error, ')} (got {e['input']!r})"
                             for e in exc.errors())
        raise SpecError(f"run {spec.name}: {problems}") from None
    described = []
    for key in changes:
        old, new = getattr(spec.scheduling, key), getattr(scheduling, key)
        if old != new:
            show = format_duration if key == "max_duration" else str
            described.append(f"{key}: {show(old)} -> {show(new)}")
    return spec.model_copy(update={"scheduling": scheduling}), described


def cloned_spec(spec: RunSpec, new_name: str, *, cluster: str | None = None, gpus: int | None = None) -> RunSpec:
    """The spec under `new_name`, on `cluster` and with `gpus` per node when given."""
    try:
        validate_name(new_name, "run name")
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    data = spec.model_dump(mode="json")
    data["name"] = new_name
    if cluster is not None:
        data["compute"]["cluster"] = cluster
    if gpus is not None:
        data["compute"]["gpus_per_node"] = gpus
    return validate_spec(data, f"clone {new_name} of run {spec.name}")
