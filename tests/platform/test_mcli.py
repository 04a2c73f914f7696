"""MCLI's run YAML as it is: translation, errors naming MCLI's keys, integrations run on the node before
the command (real git, real pip), and what `image` does on the local and Slurm clusters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.platform import Platform
from tessera.platform.clusters.base import LaunchRequest
from tessera.platform.clusters.containers import runtime_argv
from tessera.platform.clusters.local import LocalBackend
from tessera.platform.clusters.slurm import BATCH_SCRIPT, SlurmBackend
from tessera.platform.errors import ClusterError, SpecError
from tessera.platform.spec.mcli import is_mcli, to_run_spec
from tessera.platform.spec.run_spec import RESERVED_ENV, load_spec, parse_spec, validate_spec
from tessera.platform.supervision.integrations import node_workdir, prelude_steps

PROBE = "tessera-mcli-probe"

ISSUE_YAML = """\
integrations:
- integration_type: git_repo
  git_repo: {repo}
  git_branch: main
  pip_install: -e .[gpu]
image: mosaicml/pytorch:1.13.1_cu117-python3.10-ubuntu20.04
command: |
  cd llm-foundry/scripts
  composer train/train.py train/yamls/mpt/125m.yaml \\
    data_remote=s3://bucket/path-to-data max_duration=100ba \\
    save_folder=s3://checkpoints/mpt-125m save_interval=20ba
run_name: mpt-125m-r2
gpu_num: 8
gpu_type: a100_40gb
cluster: local  # can be any compute cluster!
"""


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def probe_repo(tmp_path: Path):
    """A local git repository with a script and a tiny installable package; uninstalled afterwards (the
    integration installs it into this environment, as it would into a run's)."""
    repo = tmp_path / "llm-foundry"
    (repo / "src" / "mcliprobe").mkdir(parents=True)
    (repo / "scripts").mkdir()
    (repo / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{PROBE}"\nversion = "0.1.0"\n\n[tool.setuptools.packages.find]\nwhere = ["src"]\n')
    (repo / "src" / "mcliprobe" / "__init__.py").write_text('GREETING = "hello from the probe package"\n')
    (repo / "scripts" / "hello.py").write_text(
        "import sys\nimport mcliprobe\nprint(mcliprobe.GREETING, 'run', sys.argv[1])\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "probe")
    yield repo
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", PROBE], capture_output=True)


def test_the_issues_file_validates_and_converts_without_edits(tmp_path: Path) -> None:
    path = tmp_path / "mpt-125m-r2.yaml"
    path.write_text(ISSUE_YAML.format(repo=f"file://{tmp_path}/llm-foundry"))
    spec = load_spec(path)
    assert (spec.name, spec.compute.cluster, spec.compute.nodes, spec.compute.gpus_per_node) == \
        ("mpt-125m-r2", "local", 1, 8)
    assert spec.compute.gpu_type == "a100_40gb" and spec.image.startswith("mosaicml/pytorch:1.13.1")
    assert spec.command.startswith("cd llm-foundry/scripts\ncomposer train/train.py")
    (repo,) = spec.integrations
    assert (repo.git_branch, repo.pip_install) == ("main", "-e .[gpu]")
    steps = prelude_steps(spec)
    assert steps[0]["argv"] == ["git", "clone", "--branch", "main", "--", f"file://{tmp_path}/llm-foundry",
                                "llm-foundry"]
    assert steps[-1]["argv"][-2:] == ["-e", ".[gpu]"] and steps[-1]["cwd"] == "llm-foundry"
    assert node_workdir(spec) == "{folder}/work-{rank}"
    # MCLI's defaults, not Tessera's: no retries unless the file asks
    assert (spec.scheduling.max_retries, spec.scheduling.retry_on_system_failure) == (0, False)
    # the converted spec is a Tessera spec that reads back the same
    assert validate_spec(json.loads(spec.model_dump_json())) == spec


def test_an_mcli_file_runs_its_integrations_then_the_command_on_the_local_cluster(
        platform: Platform, probe_repo: Path, tmp_path: Path) -> None:
    """The check of the issue: git_repo from a file:// URL, pip_install -e ., the command runs a script
    of the clone that imports the package; image set and no container runtime here."""
    mcli = tmp_path / "mcli.yaml"
    mcli.write_text(f"""\
run_name: mcli-probe
image: mosaicml/pytorch:latest
gpu_num: 0
cluster: local
integrations:
- integration_type: git_repo
  git_repo: file://{probe_repo}
  git_branch: main
  pip_install: -e . --no-deps --no-build-isolation
env_variables:
- key: GREETED
  value: world
parameters: {{lr: 0.5}}
command: |
  cd llm-foundry/scripts
  python hello.py $GREETED
  grep lr $TESSERA_PARAMETERS
  test "$PROBE_SECRET" = probe-secret-value && echo "every secret arrived"
""")
    platform.secrets.create_env("probe-env", {"PROBE_SECRET": "probe-secret-value"})   # MCLI: all secrets
    env = {k: v for k, v in os.environ.items() if k not in ("TESSERA_API_URL", "TESSERA_API_KEY")}
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir()
    tessera = Path(sys.executable).with_name("tessera")
    done = subprocess.run([str(tessera), "run", "submit", "-f", str(mcli), "--follow"],
                          capture_output=True, text=True, env=env, cwd=submit_dir, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "image mosaicml/pytorch:latest requested; no container runtime on this host: running on the host" in out
    assert "tessera: integration git_repo file://" in out and "Cloning into 'llm-foundry'" in out
    assert f"Successfully installed {PROBE}" in out
    assert "hello from the probe package run world" in out and "lr: 0.5" in out
    assert "every secret arrived" in out
    assert out.index("Cloning into") < out.index("hello from the probe package")
    run = platform.get_run("mcli-probe")
    assert run.status == "COMPLETED"
    # cloned into the node's own folder of this resumption, not into the folder the run was submitted from
    assert (Path(run.resumptions[0].folder) / "work-0" / "llm-foundry" / "scripts" / "hello.py").exists()
    assert list(submit_dir.iterdir()) == []


def test_a_failing_integration_fails_the_run_once_with_its_reason(platform: Platform, tmp_path: Path) -> None:
    spec = {"run_name": "mcli-no-repo", "gpu_num": 0, "command": "echo never",
            "scheduling": {"max_retries": 3},
            "integrations": [{"integration_type": "git_repo", "git_repo": f"file://{tmp_path}/missing"}]}
    platform.create_run(spec)
    run = platform.wait_for_run_status("mcli-no-repo", ["FAILED", "COMPLETED"], timeout=60)
    assert run.status == "FAILED" and len(run.resumptions) == 1   # a user error: not retried
    assert run.failure_kind == "user_error"
    assert f"integration git_repo file://{tmp_path}/missing failed" in (run.first_error or "")
    (exit_file,) = Path(run.resumptions[0].folder).glob("node-*.exit")
    body = json.loads(exit_file.read_text())
    assert body["reason"].startswith(f"integration git_repo file://{tmp_path}/missing failed: ")
    assert "never" not in (Path(run.resumptions[0].folder) / "node-0.log").read_text()


@pytest.mark.parametrize(("text", "expected"), [
    ("run_name: a\ncommand: x\ngpu_num: 1\nenvironment: {A: b}\n",
     "mcli.yaml: environment: unknown key (MCLI run YAML; did you mean 'env_variables'?)"),
    ("run_name: a\ncommand: x\ngpu_num: -2\n", "mcli.yaml: gpu_num: -2 is not a whole number >= 0"),
    ("run_name: a\ncommand: x\ngpu_num: eight\n", "mcli.yaml: gpu_num: 'eight' is not a whole number >= 0"),
    ("run_name: a\ncommand: x\ngpu_num: 12\n", "mcli.yaml: gpu_num: 12 GPUs do not fill whole 8-GPU nodes"),
    ("run_name: My_Run\ncommand: x\ngpu_num: 1\n", "mcli.yaml: run_name: run_name 'My_Run' must be"),
    ("run_name: ../up\ncommand: x\ngpu_num: 1\n", "mcli.yaml: run_name: run_name '../up' is refused"),
    ("run_name: a\ncommand: x\ngpu_num: 1\nintegrations:\n- {integration_type: git_repo, git_branch: main}\n",
     "mcli.yaml: integrations[0].git_repo: required"),
    ("run_name: a\ncommand: x\ngpu_num: 1\nintegrations:\n- {integration_type: wandb, project: p}\n",
     "mcli.yaml: integrations[0]: integration_type wandb is not run by Tessera"),
    ("run_name: a\ncommand: x\ngpu_num: 1\nintegrations:\n- {integration_type: git_repo, git_repo: a/b, "
     "path: /etc}\n", "mcli.yaml: integrations[0].path: path '/etc' must be a relative folder"),
    ("run_name: a\ncommand: x\ngpu_num: 1\nscheduling: {priority: urgent}\n",
     "mcli.yaml: scheduling.priority: 'urgent' is not one of lowest, low, medium, high, highest"),
    ("run_name: a\ncommand: x\ngpu_num: 1\ndependent_deployment: {}\n",
     "mcli.yaml: dependent_deployment: not supported: inference deployments"),
    ("run_name: a\ngpu_num: 1\n", "mcli.yaml: command: required"),
])
def test_bad_mcli_files_get_one_line_naming_the_key_and_file(text: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "mcli.yaml")
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


def test_tessera_specs_are_not_taken_for_mcli_and_mcli_keys_map_to_tessera_ones() -> None:
    assert not is_mcli({"name": "a", "command": "x", "compute": {"gpus_per_node": 1}, "env": {"A": "b"},
                        "scheduling": {"preemptible": True, "max_duration": 7200}})
    assert is_mcli({"name": "a", "command": "x", "scheduling": {"priority": "medium"}})
    spec = to_run_spec({"name": "m", "command": "train /mnt/config/parameters.yaml", "metadata": {"team": "red"},
                        "compute": {"cluster": "c1", "gpus": 16, "gpu_type": "h100_80gb", "instance": "oci.bm8"},
                        "scheduling": {"priority": "lowest", "preemptible": True, "max_duration": 1.5,
                                       "retry_on_system_failure": True, "max_retries": 2},
                        "integrations": [{"integration_type": "pip_packages", "packages": ["numpy<3", "rich"],
                                          "upgrade": True}]}, "mcli.yaml")
    assert spec.command == "train $TESSERA_PARAMETERS"   # where MCLI mounts parameters, ours on every cluster
    assert (spec.compute.nodes, spec.compute.gpus_per_node, spec.compute.instance) == (2, 8, "oci.bm8")
    assert (spec.scheduling.priority, spec.scheduling.preemptible, spec.scheduling.max_duration) == ("low", True, 5400)
    assert spec.metadata == {"team": "red"}
    pin, pip = prelude_steps(spec)
    assert pin["name"] == "pip constraints" and pip["argv"][3:] == ["install", "--upgrade", "numpy<3", "rich"]
    assert pip["env"]["PIP_CONSTRAINT"] == "{folder}/pip-constraints-{rank}.txt" and node_workdir(spec) is None


_ENV_NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True).filter(lambda k: k not in RESERVED_ENV)


@given(st.dictionaries(_ENV_NAME, st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
                       max_size=6))
def test_env_variables_as_a_list_or_a_mapping_give_the_same_run(values: dict[str, str]) -> None:
    base = {"run_name": "e", "command": "x", "gpu_num": 0}
    as_list = to_run_spec({**base, "env_variables": [{"key": k, "value": v} for k, v in values.items()]})
    as_map = to_run_spec({**base, "env_variables": values})
    assert as_list == as_map and as_list.env == values


@given(st.floats(min_value=0.001, max_value=24 * 366, allow_nan=False))
def test_max_duration_is_mcli_hours(hours: float) -> None:
    spec = to_run_spec({"run_name": "d", "command": "x", "gpu_num": 0, "scheduling": {"max_duration": hours}})
    assert spec.scheduling.max_duration == pytest.approx(hours * 3600)


def _request(tmp_path: Path, image: str | None, gpus: int = 0) -> LaunchRequest:
    spec = to_run_spec({"run_name": "img", "command": "true", "gpu_num": gpus, "image": image})
    folder = tmp_path / "runs" / "img" / "r0"
    secret = tmp_path / "secrets" / "key"
    return LaunchRequest("id", "img", 0, folder, spec, {"RUN_NAME": "img", "PATH": "/venv/bin"},
                         {"TOKEN": "s3cr3t-value"}, [(secret, "/m/key", "KEY_FILE")], workdir=str(tmp_path))


def test_slurm_uses_pyxis_or_apptainer_for_the_image_and_warns_without_either(tmp_path: Path) -> None:
    request = _request(tmp_path, "nvcr.io/nvidia/pytorch:24.01-py3", gpus=8)
    launch = str(request.folder / "launch.py")
    args, launcher, notes = SlurmBackend("s", {"container": "pyxis"}).launcher(request)
    assert args[0] == "--container-image=nvcr.io/nvidia/pytorch:24.01-py3" and launcher == ["python3", launch]
    assert f"{request.folder.parent}:{request.folder.parent}" in args[1] and not notes
    _, launcher, _ = SlurmBackend("s", {"container": "apptainer"}).launcher(request)
    assert launcher[:3] == ["apptainer", "exec", "--nv"]
    assert launcher[-3:] == ["docker://nvcr.io/nvidia/pytorch:24.01-py3", "python3", launch]
    args, launcher, notes = SlurmBackend("s", {"python": "/opt/py/bin/python"}).launcher(request)
    assert (args, launcher) == ([], ["/opt/py/bin/python", launch])
    assert notes == ["tessera: warning: image nvcr.io/nvidia/pytorch:24.01-py3 requested; no container runtime "
                     "on this host: running on the host"]
    script = BATCH_SCRIPT.format(run_name="img", resumption=0, folder=request.folder, launcher="python3 x")
    assert script.rstrip().endswith(f"--output={request.folder}/node-%t.log python3 x")
    with pytest.raises(ClusterError, match="requires images"):
        SlurmBackend("s", {"require_image": True}).check(request.spec)


def test_local_images_go_to_podman_or_docker_by_name_only_and_can_be_required(tmp_path: Path) -> None:
    request = _request(tmp_path, "python:3.12-slim")
    argv = runtime_argv("podman", request, ["RUN_NAME", "TOKEN", "KEY_FILE"], "python3")
    assert argv[:3] == ["podman", "run", "--rm"] and argv[-3:] == ["python:3.12-slim", "python3",
                                                                    str(request.folder / "launch.py")]
    assert "s3cr3t-value" not in " ".join(argv) and ["-e", "TOKEN"] == argv[argv.index("TOKEN") - 1:][:2]
    assert f"{tmp_path / 'secrets' / 'key'}:{tmp_path / 'secrets' / 'key'}" in argv
    with pytest.raises(ClusterError, match="requires images"):
        LocalBackend("strict", {"require_image": True, "container_runtime": "none"}).check(request.spec)
    LocalBackend("lenient", {"container_runtime": "none"}).check(request.spec)   # runs on the host instead


def test_pods_run_the_prelude_once_before_the_ranks_as_a_shell_script(tmp_path: Path) -> None:
    from tessera.platform.clusters.kubernetes_manifests import build_manifests

    spec = to_run_spec({"run_name": "pod", "command": "python train.py", "gpu_num": 2, "image": "img:1",
                        "integrations": [{"integration_type": "git_repo", "git_repo": "org/repo", "ssh_clone": True}]})
    request = LaunchRequest("id", "pod", 0, tmp_path / "r0", spec, {"RUN_NAME": "pod"},
                            prelude=prelude_steps(spec), node_workdir=node_workdir(spec))
    (job,) = [m for m in build_manifests(request, {}) if m["kind"] == "Job"]
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["bash", "-c"] and command[3:5] == ["tessera-prelude", "torchrun"]
    script = command[2]
    assert "git clone -- git@github.com:org/repo.git repo" in script and script.endswith('exec "$@"')
    assert "GIT_SSH_COMMAND" in script   # MCLI's default host-key policy unless a git-ssh secret set one
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
