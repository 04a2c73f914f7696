"""What each node runs before the command: the run's prelude.

A step is a plain dict, written into launch.json and run by launch.py (which imports nothing from
Tessera) in order, each one's output in the node's log:

    {"name": "integration git_repo mosaicml/llm-foundry",   # named in the log and in a failure's reason
     "argv": ["git", "clone", ...],                         # no shell; "{python}", "{folder}", "{rank}"
                                                            # are filled in on the node
     "cwd": ".",          # relative to the node's working folder; absent: the resumption folder
     "env": {...}, "env_default": {...},                    # set / set unless already set
     "lock": True,        # one node at a time (nodes may share one Python environment)
     "show": "...",       # what the log shows instead of argv (a long inline script)
     "files": {...}, "fault_exit": N}                       # GPU pre-flight: copied files; node-fault code

The first failing step ends the node: node-R.exit gets {"reason": "integration git_repo X failed: ...",
...} and the log an `error:` line, which the failure classifier reports as the run's error (nothing
made progress, so it is not retried).

pip installs go to the run's Python (`{python} -m pip`: the launcher's interpreter, i.e. the environment
that submitted the run, or the image's) with PIP_CONSTRAINT pinning what is installed of torch, its
companions and NVIDIA's libraries, so a repository's requirements cannot swap the torch build silently:
pip fails with a conflict instead. Runs with a git_repo integration start each node in a fresh folder,
`<resumption folder>/work-R`, where the repositories are cloned (as MCLI starts each node in a fresh
container); other runs keep the folder they were submitted from.
"""

from __future__ import annotations

import shlex
from typing import Any

from tessera.platform.spec.run_spec import (
    AptPackagesIntegration,
    GitRepoIntegration,
    PipPackagesIntegration,
    RunSpec,
)
from tessera.platform.supervision.gpu_health import postmortem_step, preflight_step

NODE_WORKDIR = "{folder}/work-{rank}"
CONSTRAINTS = "{folder}/pip-constraints-{rank}.txt"
# Distributions whose installed version a pip step may not change (name patterns, lower case).
PINNED = r"^(torch|torchvision|torchaudio|triton|pytorch-triton.*|nvidia-.*)$"
_PIN_SCRIPT = (
    "import importlib.metadata as m, re, sys\n"
    f"keep = re.compile({PINNED!r})\n"
    "pins = sorted({f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions()\n"
    "               if d.metadata['Name'] and keep.match(d.metadata['Name'].lower())})\n"
    "open(sys.argv[1], 'w').write(''.join(p + '\\n' for p in pins))\n"
    "print('pip may not change: ' + (', '.join(pins) or 'nothing installed to pin'))\n")
_PIP_ENV = {"PIP_CONSTRAINT": CONSTRAINTS, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def clone_url(integration: GitRepoIntegration) -> str:
    """MCLI's org/repo on `host` (https, or ssh with ssh_clone), or a URL/path given as it is."""
    repo = integration.git_repo
    if "://" in repo or repo.startswith(("git@", "/")):
        return repo
    if integration.ssh_clone:
        return f"git@{integration.host}:{repo}.git"
    return f"https://{integration.host}/{repo}.git"


def clone_folder(integration: GitRepoIntegration) -> str:
    """Where the repository lands, relative to the node's working folder: `path`, else its name."""
    if integration.path:
        return integration.path
    name = integration.git_repo.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    return name.removesuffix(".git") or "repo"


def _pip(name: str, args: list[str], cwd: str) -> dict[str, Any]:
    return {"name": name, "argv": ["{python}", "-m", "pip", "install", *args], "cwd": cwd, "env": dict(_PIP_ENV),
            "lock": True}


def _git_steps(integration: GitRepoIntegration) -> list[dict[str, Any]]:
    name = f"integration git_repo {integration.git_repo}"
    target = clone_folder(integration)
    clone = ["git", "clone"]
    if integration.git_clone_recursive:
        clone.append("--recursive")
    if integration.git_branch and not integration.git_commit:   # MCLI: a commit wins over a branch
        clone += ["--branch", integration.git_branch]
    env = {"GIT_TERMINAL_PROMPT": "0"}   # a private repository without credentials fails, never waits
    # A git-ssh secret sets GIT_SSH_COMMAND (with its key); without one, MCLI's host-key policy.
    defaults = {"GIT_SSH_COMMAND": "ssh -o StrictHostKeyChecking=accept-new"} if integration.ssh_clone else {}
    steps = [{"name": name, "argv": [*clone, "--", clone_url(integration), target], "cwd": ".", "env": env,
              "env_default": defaults}]
    if integration.git_commit:
        steps.append({"name": name, "argv": ["git", "-C", target, "checkout", "--detach", integration.git_commit],
                      "cwd": ".", "env": env})
    if integration.pip_install:
        steps.append(_pip(name, shlex.split(integration.pip_install), target))
    return steps


def prelude_steps(spec: RunSpec) -> list[dict[str, Any]]:
    """The integrations' steps, in the order the spec lists them (the pin step before the first pip)."""
    steps: list[dict[str, Any]] = []
    for integration in spec.integrations:
        if isinstance(integration, GitRepoIntegration):
            steps += _git_steps(integration)
        elif isinstance(integration, PipPackagesIntegration):
            args = [arg for package in integration.packages for arg in shlex.split(package)]
            steps.append(_pip("integration pip_packages", ["--upgrade", *args] if integration.upgrade else args, "."))
        elif isinstance(integration, AptPackagesIntegration):
            env = {"DEBIAN_FRONTEND": "noninteractive"}
            steps += [{"name": "integration apt_packages", "argv": ["apt-get", "update"], "cwd": ".", "env": env,
                       "lock": True},
                      {"name": "integration apt_packages", "argv": ["apt-get", "install", "-y", "--",
                                                                    *integration.packages],
                       "cwd": ".", "env": env, "lock": True}]
    first_pip = next((i for i, s in enumerate(steps) if s["argv"][:3] == ["{python}", "-m", "pip"]), None)
    if first_pip is not None:
        steps.insert(first_pip, {"name": "pip constraints", "argv": ["{python}", "-c", _PIN_SCRIPT, CONSTRAINTS],
                                 "cwd": ".", "show": f"{{python}} -c <pin {PINNED}> {CONSTRAINTS}"})
    return steps


def node_prelude(spec: RunSpec) -> list[dict[str, Any]]:
    """Everything a node runs before the command: the GPU pre-flight first (a sick GPU is found in
    seconds, before minutes of cloning and installing), then the integrations."""
    preflight = preflight_step(spec)
    return ([preflight] if preflight else []) + prelude_steps(spec)


def node_postmortem(spec: RunSpec) -> list[dict[str, Any]]:
    """What a node runs after its command failed: the kernel's GPU Xid lines since the pre-flight go into
    the node's log, where the failure classifier reads them."""
    step = postmortem_step(spec)
    return [step] if step else []


def node_workdir(spec: RunSpec) -> str | None:
    """The node's working folder (a template launch.py fills in), or None for the submitting folder."""
    return NODE_WORKDIR if any(isinstance(i, GitRepoIntegration) for i in spec.integrations) else None
