"""`tessera run describe` (and `cluster describe`) as a person reads it: YAML-like sections, as `kubectl
describe` prints them, from the same dictionary `--json` prints whole.

Sections: the run (state, owner, times, first error), its spec, compute, scheduling, every resumption with
its cause and outcome, where its checkpoints and logs are, and its latest events. A value that is not set
is left out, or said in words (`no limit`), so neither Python's `None` nor a `dict`'s repr ever shows;
a multi-line command keeps its lines, as a YAML block does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tessera.cli.output import clean, long_time
from tessera.platform.spec.run_spec import format_duration

EVENTS_SHOWN = 20  # the newest events; `--json` has them all
INDENT = "  "


def scalar(value: Any) -> str:
    """One value as text: yes/no for booleans, `a, b` for a list of plain values."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(scalar(v) for v in value)
    return str(value)


def _is_set(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def mapping(pairs: Mapping[str, Any] | Iterable[tuple[str, Any]], depth: int = 0) -> list[str]:
    """`key: value` lines, values aligned; nested mappings and lists of mappings as indented blocks, a
    multi-line string as a `|` block; keys whose value is not set are left out."""
    items = [(k, v) for k, v in (pairs.items() if isinstance(pairs, Mapping) else pairs) if _is_set(v)]
    pad = INDENT * depth
    width = max((len(str(k)) for k, v in items if _inline(v)), default=0) + 1
    lines = []
    for key, value in items:
        label = f"{pad}{key}:"
        if _inline(value):
            lines.append(f"{label:<{len(pad) + width}} {scalar(value)}")
        elif isinstance(value, Mapping):
            lines += [label, *mapping(value, depth + 1)]
        elif isinstance(value, str):
            lines += [f"{label} |", *(f"{pad}{INDENT}{line}" for line in value.strip("\n").splitlines())]
        else:  # a list of mappings: YAML's `- ` items
            lines.append(label)
            for item in value:
                block = mapping(item, depth + 2) if isinstance(item, Mapping) else [pad + INDENT * 2 + scalar(item)]
                lines += [f"{pad}{INDENT}- {block[0].lstrip()}", *block[1:]] if block else []
    return lines


def _inline(value: Any) -> bool:
    """Whether `value` fits after its key on one line (not a mapping, a list of mappings or lines)."""
    if isinstance(value, Mapping):
        return False
    if isinstance(value, str):
        return "\n" not in value.strip()
    return not (isinstance(value, list | tuple) and any(isinstance(v, Mapping) for v in value))


def _duration(seconds: float | None, unset: str = "no limit") -> str:
    return format_duration(seconds) if seconds else unset


def _ran(start: float | None, end: float | None) -> str:
    return f" (after {format_duration(round(end - start))})" if start and end and end >= start else ""


def describe_run(info: Mapping[str, Any]) -> str:
    """The text of `tessera run describe` for `describe_run`'s dictionary."""
    spec, sched = info.get("spec") or {}, (info.get("spec") or {}).get("scheduling") or {}
    resumptions = info.get("resumptions") or []
    failure = info.get("first_error")
    if failure and info.get("failure_kind"):
        failure = f"{failure} ({info['failure_kind']})"
    supervisor = info.get("supervisor") or {}
    head = mapping([
        ("name", info.get("name")), ("id", info.get("id")), ("status", info.get("status")),
        ("cluster", info.get("cluster")), ("user", info.get("user")),
        ("created", long_time(info.get("created"))),
        ("ended", info.get("ended") and long_time(info["ended"]) + _ran(info.get("created"), info["ended"])),
        ("first error", failure),
        ("supervisor", supervisor.get("replica") and f"replica {supervisor['replica']}"),  # its lease: --json
        ("folder", info.get("folder"))])
    sections = [head, ["spec:", *mapping(_spec(spec), 1)],
                ["compute:", *mapping({k.replace("_", " "): v for k, v in (spec.get("compute") or {}).items()}, 1)],
                ["scheduling:", *mapping(_scheduling(sched, info.get("retries_used")), 1)],
                ["resumptions:", *(_resumption(r) for r in resumptions)] if resumptions
                else ["resumptions: none yet"],
                ["checkpoints:", *mapping(_checkpoints(info), 1)],
                ["logs:", *mapping(_logs(info), 1)],
                _events(info.get("events") or [])]
    return "\n".join("\n".join(lines) for lines in sections if lines) + "\n"


def _spec(spec: Mapping[str, Any]) -> list[tuple[str, Any]]:
    integrations = [i.get("integration_type", "?") for i in spec.get("integrations") or []]
    return [("command", spec.get("command")), ("image", spec.get("image")),
            ("secrets", "all of the team's" if spec.get("all_secrets") else spec.get("secrets")),
            ("env", spec.get("env")), ("parameters", spec.get("parameters")),
            ("integrations", integrations), ("metadata", spec.get("metadata"))]


def _scheduling(sched: Mapping[str, Any], used: int | None) -> list[tuple[str, Any]]:
    retries = sched.get("max_retries")
    return [("priority", sched.get("priority")),
            ("max retries", None if retries is None else f"{retries} ({used or 0} used)"),
            ("retry on system failure", sched.get("retry_on_system_failure")),
            ("max duration", _duration(sched.get("max_duration"))),
            ("hang timeout", _duration(sched.get("hang_timeout"), "none")),
            ("stop grace", _duration(sched.get("stop_grace"), "none")),
            ("preemptible", sched.get("preemptible"))]


def _resumption(r: Mapping[str, Any]) -> str:
    """`  - #1 preempted, on hpc` and its details under it."""
    outcome = r.get("outcome") or r.get("status")
    if r.get("detail"):
        outcome = f"{outcome}: {r['detail']}"
    step = (r.get("last_heartbeat") or {}).get("step")
    if step is not None:
        outcome = f"{outcome} (step {step})"
    job = r.get("job_id") and f"{r['job_id']}" + (f" on {', '.join(r['nodes'])}" if r.get("nodes") else "")
    details = mapping([("cause", r.get("cause")), ("status", r.get("status")), ("job", job),
                       ("submitted", r.get("submitted") and long_time(r["submitted"])),
                       ("started", r.get("start") and long_time(r["start"])),
                       ("ended", r.get("end") and long_time(r["end"]) + _ran(r.get("start"), r["end"])),
                       ("exit code", r.get("exit_code")), ("outcome", outcome), ("folder", r.get("folder"))], 2)
    return "\n".join([f"{INDENT}- #{r.get('index')} on {r.get('cluster')}", *details])


def _checkpoints(info: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The newest checkpoint the run reported (its heartbeat, else its checkpoint events) and how many."""
    reported = [e for e in info.get("events") or [] if e.get("kind") == "checkpoint"]
    beats = [r.get("last_heartbeat") or {} for r in info.get("resumptions") or []]
    latest = next((b["last_checkpoint"] for b in reversed(beats) if b.get("last_checkpoint")), None)
    if latest is None and reported:
        latest = reported[-1].get("message")
    if latest is None:
        return [("latest", "none reported (the run's save_folder holds any it wrote)")]
    return [("latest", latest), ("reported", f"{len(reported)} checkpoint event(s)")]


def _logs(info: Mapping[str, Any]) -> list[tuple[str, Any]]:
    resumptions = info.get("resumptions") or []
    folder = next((r["folder"] for r in reversed(resumptions) if r.get("folder")), None)
    return [("folder", folder and f"{folder} (node-<rank>.log)"),
            ("command", f"tessera run logs {info.get('name')} [-f] [--resumption N] [--rank R]")]


def _events(events: list[Mapping[str, Any]]) -> list[str]:
    if not events:
        return []
    shown = events[-EVENTS_SHOWN:]
    width = max(len(str(e.get("kind"))) for e in shown)
    earlier = len(events) - len(shown)
    title = f"events (the newest {len(shown)} of {len(events)}; all with --json):" if earlier else "events:"
    return [title, *(f"{INDENT}- {long_time(e.get('time'))}  {str(e.get('kind')):<{width}}  {clean(e.get('message'))}"
                     for e in shown)]


def describe_cluster(info: Mapping[str, Any]) -> str:
    """The settings part of `tessera cluster describe` (its nodes are a list of their own)."""
    return "\n".join(mapping({k: v for k, v in info.items() if k != "nodes" or not isinstance(v, list)})) + "\n"
