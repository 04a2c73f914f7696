"""The prelude as a shell script, for pods (Kubernetes runs the image's own entrypoint, not launch.py).

Each node is a pod with a file system of its own, so the node's working folder is /tmp/tessera/work and
the steps run in it one after the other; the first that fails prints the same `error: <step> failed`
line launch.py prints and ends the pod with its exit code. Steps that need files beside the launcher
(the GPU pre-flight) are left out: pods get GPU health from the device plugin instead.
"""

from __future__ import annotations

import shlex
from typing import Any

POD_FOLDER = "/tmp/tessera"


def _fill(text: str) -> str:
    return text.replace("{python}", "python").replace("{folder}", POD_FOLDER).replace("{rank}", "0")


def prelude_script(steps: list[dict[str, Any]], node_workdir: str | None) -> str:
    """Shell lines that run `steps` (launch.json's prelude) and leave the shell in the node's folder."""
    steps = [s for s in steps if not s.get("files")]
    if not steps:
        return ""
    workdir = shlex.quote(_fill(node_workdir or POD_FOLDER + "/work"))
    lines = [f"mkdir -p {workdir} && cd {workdir} || exit 1"]
    for step in steps:
        name = shlex.quote(step["name"])
        defaults = [f'[ -n "${{{k}:-}}" ] || export {k}={shlex.quote(_fill(v))}'
                    for k, v in (step.get("env_default") or {}).items()]
        env = [f"{k}={shlex.quote(_fill(v))}" for k, v in (step.get("env") or {}).items()]
        argv = " ".join(shlex.quote(_fill(a)) for a in step["argv"])
        cwd = shlex.quote(step.get("cwd") or ".")
        lines += defaults
        lines.append(f"echo tessera: {name}; (cd {cwd} && env {' '.join(env)} {argv}) "
                     f"|| {{ c=$?; echo \"error: \"{name}\" failed (exit $c)\"; exit $c; }}")
    return "\n".join(lines) + "\n"
