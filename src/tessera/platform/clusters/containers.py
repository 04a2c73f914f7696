"""Running a node's launcher inside the run's `image`: podman or docker on the local cluster, Pyxis
(enroot) or Apptainer under srun on Slurm. Either way launch.py itself runs in the container (it needs
only a Python 3), so the prelude (clone, pip install) and the command both happen in the image.

The folders a node needs are mounted at the same path inside (base.container_mounts), so every path
Tessera hands the run (TESSERA_PARAMETERS, TESSERA_HEARTBEAT, secret files) holds in the container too.
Environment variables are passed by name only (`-e NAME`): podman and docker take the value from their
own environment, so no secret is ever on a command line. PATH is not passed: the host's virtual
environment means nothing in the image.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from tessera.platform.clusters.base import LaunchRequest, container_mounts
from tessera.platform.errors import ClusterError

RUNTIMES = ("podman", "docker")
CONTAINER_PYTHON = "python3"
_probed: dict[str, bool] = {}


def _works(runtime: str) -> bool:
    """`runtime info` answers: the docker client alone (no engine to talk to) does not count."""
    if runtime not in _probed:
        try:
            done = subprocess.run([runtime, "info"], capture_output=True, timeout=15)
            _probed[runtime] = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _probed[runtime] = False
    return _probed[runtime]


def local_runtime(config: dict[str, Any]) -> str | None:
    """The container runtime of this host: the cluster's `container_runtime` (podman, docker, or none),
    else the first of podman, docker that is installed and answers."""
    wanted = config.get("container_runtime")
    if wanted == "none":
        return None
    if wanted and wanted not in RUNTIMES:
        raise ClusterError(f"container_runtime {wanted!r} is not one of {', '.join(RUNTIMES)}, none")
    for runtime in (wanted,) if wanted else RUNTIMES:
        if shutil.which(runtime) and _works(runtime):
            return runtime
    return None


def container_name(request: LaunchRequest) -> str:
    return f"tessera-{request.run_name}-r{request.resumption}"


def runtime_argv(runtime: str, request: LaunchRequest, env_names: list[str], python: str) -> list[str]:
    """`podman|docker run` of launch.py in the run's image, for one local node."""
    argv = [runtime, "run", "--rm", "--name", container_name(request), "--network=host", "--ipc=host"]
    for path in container_mounts(request):
        argv += ["-v", f"{path}:{path}"]
    for name in env_names:
        argv += ["-e", name]
    if request.spec.compute.gpus_per_node:
        argv += ["--gpus", "all"] if runtime == "docker" else ["--device", "nvidia.com/gpu=all"]
    workdir = request.workdir or str(request.folder)
    return [*argv, "-w", workdir, str(request.spec.image), python, str(request.folder / "launch.py")]


def pyxis_args(request: LaunchRequest) -> list[str]:
    """srun options that run each task in the image through Pyxis/enroot."""
    mounts = ",".join(f"{p}:{p}" for p in container_mounts(request))
    return [f"--container-image={request.spec.image}", f"--container-mounts={mounts}",
            f"--container-workdir={request.workdir or request.folder}"]


def apptainer_prefix(request: LaunchRequest) -> list[str]:
    """`apptainer exec` of the image (from a registry, docker://) in front of the launcher on each node."""
    argv = ["apptainer", "exec"]   # the host environment goes in (Tessera's variables); PATH is the image's
    if request.spec.compute.gpus_per_node:
        argv.append("--nv")
    for path in container_mounts(request):
        argv += ["--bind", path]
    image = str(request.spec.image)
    return [*argv, image if "://" in image or image.endswith(".sif") else f"docker://{image}"]
