"""GPU health: recorded error texts classified, the pre-flight against a fake `nvidia-smi`, and a node whose
pre-flight fails excluded before the automatic restart (local cluster and the virtual Slurm nodes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_nvidia_smi import install, write_scenario
from platform_helpers import SlurmCluster

from tessera.platform import Platform
from tessera.platform.clusters import gpu_preflight
from tessera.platform.clusters.base import JobState, NodeExit
from tessera.platform.spec.run_spec import validate_spec
from tessera.platform.supervision.failures import Evidence, FailureKind, classify
from tessera.platform.supervision.gpu_health import (
    PREFLIGHT_FAULT_EXIT,
    PREFLIGHT_SCRIPT,
    preflight_step,
    read_preflight,
    scan,
)

TEXTS = Path(__file__).with_name("gpu_texts")
NODES = ["n1", "n2"]
TIMEOUT = 60


def _evidence(text: str, rank: int = 1, progress: bool = True, preflight: dict | None = None) -> Evidence:
    exits = [NodeExit(0, "n1", 1 if rank == 0 else 143), NodeExit(1, "n2", 1 if rank == 1 else 143)]
    logs = {0: "", 1: ""}
    logs[rank] = text
    return Evidence(JobState.FAILED, 1, exits, logs, list(NODES), made_progress=progress,
                    preflight=preflight or {})


# file -> (rank whose log holds it, failure kind, GPU fault kind, nodes blamed, excluded at once)
CASES = {
    "xid79_fallen_off_bus": (1, FailureKind.NODE_FAULT, "xid_79", ["n2"], True),
    "gpu_lost_device_handle": (1, FailureKind.NODE_FAULT, "gpu_lost", ["n2"], True),
    "xid48_double_bit_ecc": (1, FailureKind.NODE_FAULT, "xid_48", ["n2"], True),
    "xid63_row_remap_pending": (1, FailureKind.NODE_FAULT, "xid_63", ["n2"], True),
    "xid64_row_remap_failure": (1, FailureKind.NODE_FAULT, "xid_64", ["n2"], True),
    "xid94_contained_ecc": (1, FailureKind.NODE_FAULT, "xid_94", ["n2"], True),
    "xid95_uncontained_ecc": (1, FailureKind.NODE_FAULT, "xid_95", ["n2"], True),
    "cuda_uncorrectable_ecc": (1, FailureKind.NODE_FAULT, "ecc_uncorrectable", ["n2"], True),
    "preflight_fault": (1, FailureKind.NODE_FAULT, "preflight", ["n2"], True),
    "xid_unknown": (1, FailureKind.NODE_FAULT, "xid_154", ["n2"], False),
    # the ranks left waiting report the timeout; the node that did not (n2) is the suspect
    "nccl_watchdog_timeout": (0, FailureKind.NODE_FAULT, "nccl_timeout", ["n2"], False),
    "illegal_memory_access": (1, FailureKind.ERROR, "illegal_memory_access", ["n2"], False),
    # Xid 13/31 beside the illegal access: the program's own fault, no node blamed
    "xid13_graphics_exception": (1, FailureKind.ERROR, None, [], False),
    "xid31_mmu_fault": (1, FailureKind.ERROR, None, [], False),
}


def test_every_recorded_text_has_a_case() -> None:
    assert sorted(p.stem for p in TEXTS.glob("*.txt")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_gpu_errors_are_classified(name: str) -> None:
    rank, kind, gpu_fault, nodes, excluded_now = CASES[name]
    failure = classify(_evidence((TEXTS / f"{name}.txt").read_text(), rank))
    assert (failure.kind, failure.gpu_fault, failure.nodes, failure.hard) == (kind, gpu_fault, nodes, excluded_now), \
        failure.summary
    assert failure.first_error, "the first error must reach `run describe`"


def test_illegal_memory_access_before_progress_is_the_programs() -> None:
    failure = classify(_evidence((TEXTS / "illegal_memory_access.txt").read_text(), progress=False))
    assert failure.kind is FailureKind.USER_ERROR and failure.nodes == []


def test_a_failed_preflight_json_excludes_its_node_whatever_the_logs_say() -> None:
    body = {"rank": 1, "node": "n2", "verdict": "fault", "reason": "GPU 0 has 3 uncorrectable ECC error(s)"}
    failure = classify(_evidence("", preflight={1: body, 0: {"rank": 0, "node": "n1", "verdict": "ok"}}))
    assert (failure.kind, failure.nodes, failure.hard, failure.gpu_fault) == (FailureKind.NODE_FAULT, ["n2"],
                                                                              True, "preflight")
    assert "3 uncorrectable ECC" in failure.summary and failure.system


def test_scan_finds_kernel_xids_in_order() -> None:
    found = scan((TEXTS / "xid13_graphics_exception.txt").read_text())
    assert [f.kind for f in found] == ["xid_13", "xid_45", "illegal_memory_access"]


# --- the pre-flight script against the fake nvidia-smi ------------------------------------------------


def _preflight(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, str(PREFLIGHT_SCRIPT), "--out", str(out), *args],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT)
    body = json.loads((out / "node-0.preflight.json").read_text()) if done.returncode in (0, PREFLIGHT_FAULT_EXIT) \
        else {}
    return done.returncode, body, done.stderr


@pytest.fixture
def fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The environment with a fake `nvidia-smi`/`dmesg` first on PATH; scenarios go to the returned folder."""
    scenarios = tmp_path / "scenarios"
    env = install(tmp_path / "bin", scenarios)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setenv("NODE_RANK", "0")
    return scenarios


FAULTS = {
    "ecc": ({"ecc": 2}, [], "ecc.errors.uncorrected.volatile.total"),
    "retired": ({"retired_pending": "Yes"}, [], "retired_pages.pending"),
    "remap_pending": ({"remap_pending": 1}, [], "remapped_rows.pending"),
    "remap_failure": ({"remap_failure": 1}, [], "remapped_rows.failure"),
    "model": ({"name": "NVIDIA A100-SXM4-80GB"}, [], "is not a a100_40gb"),
    "xid79": ({}, ["NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=python, GPU has fallen off the bus."], "Xid 79"),
}


@pytest.mark.parametrize("case", sorted(FAULTS))
def test_preflight_finds_a_sick_gpu(case: str, fake_gpus: Path, tmp_path: Path) -> None:
    gpu, xids, expected = FAULTS[case]
    write_scenario(fake_gpus, "default", xids=xids, **gpu)
    code, body, stderr = _preflight(tmp_path, "--gpus", "2", "--gpu-type", "a100_40gb", "--no-allreduce")
    assert code == PREFLIGHT_FAULT_EXIT and body["verdict"] == "fault", stderr
    assert expected in body["reason"] and expected in stderr


def test_preflight_passes_healthy_gpus_and_notes_what_it_skipped(fake_gpus: Path, tmp_path: Path) -> None:
    write_scenario(fake_gpus, "default", xids=["NVRM: Xid (PCI:0000:11:00): 13, pid=9, name=python, Graphics "
                                              "Exception"])   # a program's Xid: not the node's fault
    code, body, stderr = _preflight(tmp_path, "--gpus", "2", "--gpu-type", "a100_40gb")
    assert (code, body["verdict"], body["reason"], body["kernel_xids"]) == (0, "ok", None, 1), stderr
    assert [g["name"] for g in body["gpus"]] == ["NVIDIA A100-SXM4-40GB"] * 2
    assert any("all-reduce skipped" in n for n in body["notes"])   # no CUDA on this machine


def test_preflight_counts_and_visibility(fake_gpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_scenario(fake_gpus, "default", gpus=2, ecc=5)      # GPU 1 is sick
    code, body, _ = _preflight(tmp_path, "--gpus", "4", "--no-allreduce")
    assert code == PREFLIGHT_FAULT_EXIT and body["faults"][0] == "2 GPU(s) visible, the run asks for 4"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")          # this node's processes see only the healthy one
    code, body, _ = _preflight(tmp_path, "--gpus", "1", "--no-allreduce")
    assert (code, body["verdict"]) == (0, "ok")


def test_preflight_when_nvidia_smi_fails_or_is_missing(fake_gpus: Path, tmp_path: Path) -> None:
    fake_gpus.mkdir()
    (fake_gpus / "default.json").write_text(json.dumps(
        {"fail": "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"}))
    code, body, _ = _preflight(tmp_path, "--gpus", "1", "--no-allreduce")
    assert code == PREFLIGHT_FAULT_EXIT and "Unable to determine the device handle" in body["reason"]
    code, body, _ = _preflight(tmp_path, "--gpus", "1", "--nvidia-smi", "no-such-nvidia-smi")
    assert code == PREFLIGHT_FAULT_EXIT and body["reason"].startswith("nvidia-smi not found")
    done = subprocess.run([sys.executable, str(PREFLIGHT_SCRIPT), "--gpus", "-1"], capture_output=True, text=True)
    assert done.returncode == 2 and "--gpus must be >= 0" in done.stderr and "Traceback" not in done.stderr


def test_after_reports_only_the_xids_logged_since_the_preflight(fake_gpus: Path, tmp_path: Path) -> None:
    old = "NVRM: Xid (PCI:0000:11:00): 13, pid=9, name=python, old"
    write_scenario(fake_gpus, "default", xids=[old])
    assert _preflight(tmp_path, "--gpus", "2", "--no-allreduce")[0] == 0
    new = "NVRM: Xid (PCI:0000:11:00): 79, pid=9, name=python, GPU has fallen off the bus."
    write_scenario(fake_gpus, "default", xids=[old, new])
    done = subprocess.run([sys.executable, str(PREFLIGHT_SCRIPT), "--after", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and "old" not in done.stderr
    assert [f.kind for f in scan(done.stderr)] == ["xid_79"]


@pytest.mark.parametrize("name,gpu_type,ok", [
    ("NVIDIA A100-SXM4-40GB", "a100_40gb", True), ("NVIDIA A100 80GB PCIe", "a100_80gb", True),
    ("NVIDIA A100-SXM4-80GB", "a100_40gb", False), ("NVIDIA H100 80GB HBM3", "h100_80gb", True),
    ("NVIDIA A100-SXM4-40GB", "a10", False), ("NVIDIA A10", "a10", True), ("Tesla T4", "t4", True),
    ("NVIDIA A100-SXM4-40GB", "tpu_v5", None),
])
def test_gpu_types_map_to_product_names(name: str, gpu_type: str, ok: bool | None) -> None:
    assert gpu_preflight.model_matches(name, gpu_type) is ok


def test_preflight_step_only_for_runs_that_ask_for_gpus() -> None:
    cpu = validate_spec({"name": "cpu", "command": "true"})
    gpu = validate_spec({"name": "gpu", "command": "true", "compute": {"gpus_per_node": 8}})
    assert preflight_step(cpu) is None
    step = preflight_step(gpu)
    assert step is not None and step["name"] == "gpu-preflight" and step["fault_exit"] == PREFLIGHT_FAULT_EXIT
    assert step["argv"][1:4] == ["gpu_preflight.py", "--gpus", "8"]


# --- end to end -------------------------------------------------------------------------------------


def _command(bin_env: dict[str, str], *preflight_args: str) -> str:
    """The pre-flight as the first part of the command, then the 'training': on the virtual Slurm nodes,
    which have no GRES, a spec cannot ask for GPUs, so the launcher's prelude never runs the pre-flight."""
    folder = '"$(dirname "$TESSERA_HEARTBEAT")"'
    return (f"export PATH={bin_env['PATH'].split(':')[0]}:$PATH FAKE_GPU_DIR={bin_env['FAKE_GPU_DIR']}\n"
            f"{sys.executable} {PREFLIGHT_SCRIPT} --out {folder} {' '.join(preflight_args)} || exit $?\n"
            "echo trained on ${SLURMD_NODENAME:-local}\n")


@pytest.mark.parametrize("sick", [False, True])
def test_local_run_asking_for_gpus_runs_the_preflight_first(sick: bool, platform: Platform, fake_gpus: Path) -> None:
    """The launcher's prelude runs the pre-flight before the command. A fault cannot be excluded on the
    one-node local cluster: the run fails at once with the reason, and the command never starts."""
    write_scenario(fake_gpus, "default", gpus=1, **({"ecc": 4} if sick else {}))
    platform.create_run({"name": "gpurun", "command": "echo trained",
                         "compute": {"gpus_per_node": 1, "gpu_type": "a100_40gb"}})
    run = platform.wait_for_run_status("gpurun", "FAILED" if sick else "COMPLETED", timeout=TIMEOUT)
    [res] = run.resumptions
    log = "\n".join(platform.follow_logs("gpurun", follow=False))
    assert read_preflight(Path(res.folder))[0]["verdict"] == ("fault" if sick else "ok")
    if not sick:
        assert "1 GPU(s) healthy" in log and "trained" in log
        return
    assert (res.outcome, res.exit_code) == ("node_fault", PREFLIGHT_FAULT_EXIT) and "trained" not in log
    assert "GPU pre-flight failed" in res.detail and "4 uncorrectable ECC" in res.detail
    assert "no other node" in res.detail and run.failure_kind == "node_fault"
    assert "4 uncorrectable ECC" in (run.first_error or "")


def test_a_gpu_fault_seen_while_running_ends_the_resumption(platform: Platform, fake_gpus: Path) -> None:
    """A node's log shows Xid 79 while the run would hang on (NCCL peers wait up to 10 minutes): the
    supervisor ends the resumption at once and classifies it."""
    write_scenario(fake_gpus, "default", gpus=1)
    xid = "NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=python, GPU has fallen off the bus."
    platform.create_run({"name": "offbus", "command": f"echo '{xid}'; sleep 300",
                         "compute": {"gpus_per_node": 1}, "scheduling": {"stop_grace": "2s"}})
    run = platform.wait_for_run_status("offbus", "FAILED", timeout=TIMEOUT)
    [res] = run.resumptions
    assert res.outcome == "node_fault" and "xid_79" in res.detail
    assert any(e.kind == "gpu_fault" and "GPU has fallen off the bus" in e.message for e in run.events)


def test_a_failed_command_gets_the_kernels_new_xids_into_its_log(platform: Platform, fake_gpus: Path) -> None:
    """The program dies without printing why; the kernel logged Xid 79 meanwhile. The launcher's
    post-mortem step puts that line into the node's log, so the run is blamed on the GPU, not the code."""
    write_scenario(fake_gpus, "default", gpus=1)
    xid = "NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=python, GPU has fallen off the bus."
    scenario = json.dumps({"gpus": json.loads((fake_gpus / "default.json").read_text())["gpus"], "xids": [xid]})
    platform.create_run({"name": "silent", "compute": {"gpus_per_node": 1},
                         "command": f"echo '{scenario}' > {fake_gpus / 'default.json'}; exit 3"})
    run = platform.wait_for_run_status("silent", "FAILED", timeout=TIMEOUT)
    log = "\n".join(platform.follow_logs("silent", follow=False))
    assert "gpu-postmortem" in log and "Xid (PCI:0000:11:00): 79" in log
    assert run.resumptions[0].outcome == "node_fault" and "xid_79" in (run.resumptions[0].detail or "")


def _has_gpus(cluster: SlurmCluster) -> bool:
    """Whether the virtual nodes declare GPUs (GRES), so that a spec may ask for them."""
    return "gpu:" in cluster.run("sinfo", "-N", "-h", "-o", "%G")


def test_slurm_node_failing_preflight_is_excluded_and_the_run_completes(
        platform: Platform, slurm_cluster: SlurmCluster, fake_gpus: Path, tmp_path: Path) -> None:
    """Two nodes; the fake reports an uncorrectable ECC error on the first node to ask it (one of the first
    job's). Its pre-flight fails, the node is excluded, and the run restarts on healthy nodes. With GPUs
    declared on the virtual nodes (GRES) the spec asks for them and the launcher's prelude runs the
    pre-flight; without, the command runs it first."""
    slurm_cluster.add_to(platform)
    write_scenario(fake_gpus, "default")
    write_scenario(fake_gpus, "faulty", ecc=2)
    compute = {"cluster": "slurm", "nodes": 2}
    if _has_gpus(slurm_cluster):
        compute.update(gpus_per_node=2, gpu_type="a100_40gb", procs_per_node=1)
        command = "echo trained on $SLURMD_NODENAME"
    else:
        env = {"PATH": str(tmp_path / "bin"), "FAKE_GPU_DIR": str(fake_gpus)}
        command = _command(env, "--gpus", "2", "--gpu-type", "a100_40gb", "--no-allreduce")
    platform.create_run({"name": "gpuslurm", "command": command, "compute": compute,
                         "scheduling": {"max_retries": 0}})
    run = platform.wait_for_run_status("gpuslurm", "COMPLETED", timeout=TIMEOUT)
    sick = (fake_gpus / "claim").read_text().strip()
    first, second = run.resumptions
    assert sick in first.nodes and first.outcome == "node_fault"
    assert f"GPU pre-flight failed on node {first.nodes.index(sick)} ({sick})" in first.detail
    assert "uncorrectable ECC" in first.detail
    assert sick not in second.nodes and second.outcome == "completed"
    assert platform.db.excluded_nodes("slurm") == [sick] and run.retries_used == 0
    assert any(e.kind == "node_excluded" and sick in e.message for e in run.events)
    assert any(e.kind == "failure" and "[preflight]" in e.message for e in run.events)
    described = platform.describe_run("gpuslurm")
    assert "uncorrectable ECC" in described["resumptions"][0]["detail"]
