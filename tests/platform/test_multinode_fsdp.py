"""Multi-node FSDP as users run it: examples/slurm/train-multinode.sbatch on the virtual Slurm cluster.

3 nodes x 2 ranks (srun starts one torchrun per node, c10d rendezvous on the first node) train the tiny
MLP of tests/train/trainer_run.py with FSDP2 on gloo and save sharded checkpoints every 2 batches. Once
a checkpoint is committed, one node goes down (Slurm ends the job: NODE_FAIL). The same template,
resubmitted on the 2 remaining nodes (2 x 2 ranks, the failed node excluded), autoresumes from the
6-rank sharded checkpoint: the global data order is exactly the uninterrupted run's, the losses and
final weights equal it within float tolerance.

The job's command is this file run as a script (`python test_multinode_fsdp.py train CFG.json`): the
trainer_run.py run, with a short pause per step so that the node fails mid-run.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from platform_helpers import SlurmCluster, free_port_block, wait_for

from tessera.storage import open_store

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
TESTS = ROOT / "tests"
TEMPLATE = ROOT / "examples" / "slurm" / "train-multinode.sbatch"
STEPS, GLOBAL_BATCH = 12, 12   # 12 divides over 6, 4 and 1 ranks; 8 batches per epoch (96 samples)
TIMEOUT = 90


def _trainer_run():
    """tests/train/trainer_run.py (and the fork_server it imports from tests/)."""
    for path in (TESTS / "train", TESTS):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import trainer_run

    return trainer_run


def _env(**extra: str) -> dict[str, str]:
    """This environment for the job, without another world's variables, with the venv's torchrun first."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "TORCHELASTIC"))}
    path = os.pathsep.join([str(ROOT / "src"), str(TESTS / "train"), str(TESTS), env.get("PYTHONPATH", "")])
    env.update(PYTHONPATH=path.rstrip(os.pathsep), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
               OMP_NUM_THREADS="1", **extra)
    return env


def _submit(cluster: SlurmCluster, folder: Path, name: str, cfg: dict, nodes: int, exclude: str | None = None) -> str:
    """sbatch the multi-node template (minus its GPU line: these nodes have none) for `cfg`; the job id."""
    script = folder / "train-multinode.sbatch"
    script.write_text("".join(line for line in TEMPLATE.read_text().splitlines(keepends=True)
                              if not line.startswith("#SBATCH --gpus-per-node")))
    cfg_path = folder / f"{name}.json"
    cfg_path.write_text(json.dumps(cfg))
    args = ["sbatch", "--parsable", f"--job-name={name}", f"--nodes={nodes}", "--cpus-per-task=2", "--mem=3000",
            "--time=5", "--no-requeue", f"--output={folder / name}.out", f"--chdir={folder}"]
    args += [f"--exclude={exclude}"] if exclude else []
    env = _env(SLURM_CONF=str(cluster.conf), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port_block(1)),
               NPROC_PER_NODE="2", RUN_NAME="multinode")
    done = subprocess.run([*args, str(script), str(HERE), "train", str(cfg_path)], env=env, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip().split(";")[0]


def _state(cluster: SlurmCluster, job: str) -> str:
    shown = cluster.run("scontrol", "show", "job", "-o", job, check=False)
    match = re.search(r"JobState=(\S+)", shown)
    return match[1] if match else "UNKNOWN"


def _wait_done(cluster: SlurmCluster, job: str, log: Path) -> str:
    finished = ("COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY")

    def done() -> str | None:
        state = _state(cluster, job)
        return state if state in finished else None

    try:
        return wait_for(done, timeout=TIMEOUT, what=f"job {job} to end")
    except AssertionError:
        cluster.run("scancel", job, check=False)
        raise AssertionError(f"job {job} still {_state(cluster, job)}:\n{_tail(log)}") from None


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else "(no output)"


def _processes_of(out: Path) -> list[int]:
    """Pids of processes whose command line names `out`'s config (a job's ranks that may outlive it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(out).encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def _global_ids(out: Path, world: int, steps: range) -> dict[int, tuple[list[int], float]]:
    """step -> (the sorted sample ids of all `world` ranks, rank 0's logged global loss)."""
    tr = _trainer_run()
    ranks = [tr.read_steps(out, rank) for rank in range(world)]
    return {step: (sorted(i for r in ranks for i in r[step]["ids"]), ranks[0][step]["loss"]) for step in steps}


def test_a_node_fails_and_the_run_resumes_on_the_others(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    tr = _trainer_run()
    tr.write_dataset(tmp_path / "data")
    base = {"data": str(tmp_path / "data"), "dropout": 0.0, "global_batch_size": GLOBAL_BATCH, "lanes": 4,
            "max_duration": f"{STEPS}ba"}
    # The uninterrupted run, one process, meanwhile.
    ref_cfg = tmp_path / "ref.json"
    ref_cfg.write_text(json.dumps({**base, "out": str(tmp_path / "ref")}))
    reference = subprocess.Popen([sys.executable, str(HERE), "train", str(ref_cfg)], env=_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpt = tmp_path / "ckpt"
    run = {**base, "parallelism": "fsdp", "save_folder": str(ckpt), "save_interval": "2ba", "autoresume": True}
    victim = slurm_cluster.nodes[-1]
    first = _submit(slurm_cluster, tmp_path, "three", {**run, "out": str(tmp_path / "three"), "step_pause": 0.5},
                    nodes=3)
    try:
        wait_for(lambda: (ckpt / "latest").exists() or _state(slurm_cluster, first) not in ("PENDING", "RUNNING"),
                 timeout=TIMEOUT, what="the first committed checkpoint")
        assert _state(slurm_cluster, first) == "RUNNING", _tail(tmp_path / "three.out")
        slurm_cluster.run("scontrol", "update", f"nodename={victim}", "state=down", "reason=tessera-multinode-test")
        assert _wait_done(slurm_cluster, first, tmp_path / "three.out") == "NODE_FAIL"
        # Slurm ended the job; make sure none of its ranks outlives it before the resubmission.
        wait_for(lambda: not _processes_of(tmp_path / "three.json"), timeout=30, what="the failed job's ranks to exit")
        second = _submit(slurm_cluster, tmp_path, "two", {**run, "out": str(tmp_path / "two")}, nodes=2,
                         exclude=victim)
        assert _wait_done(slurm_cluster, second, tmp_path / "two.out") == "COMPLETED", _tail(tmp_path / "two.out")
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={victim}", "state=resume", check=False)
    assert reference.wait(timeout=TIMEOUT) == 0, reference.communicate()[0][-3000:]

    # The resumed job started after the checkpoint it loaded: a 6-rank sharded one, committed before the fault.
    resumed_at = min(tr.read_steps(tmp_path / "two", 0)) - 1
    assert resumed_at >= 2 and resumed_at % 2 == 0 and resumed_at < STEPS
    manifest = json.loads(open_store(ckpt).get(f"ep0-ba{resumed_at}/manifest.json"))
    assert manifest["world_size"] == 6
    assert {f"dcp/__{rank}_0.distcp" for rank in range(6)} <= {entry["key"] for entry in manifest["files"]}
    assert not (tmp_path / "two" / "rank4.jsonl").exists()  # 2 nodes x 2 ranks

    ref = _global_ids(tmp_path / "ref", 1, range(1, STEPS + 1))
    got = {**_global_ids(tmp_path / "three", 6, range(1, resumed_at + 1)),
           **_global_ids(tmp_path / "two", 4, range(resumed_at + 1, STEPS + 1))}
    for step in range(1, STEPS + 1):
        assert got[step][0] == ref[step][0], f"step {step}: another global batch"
        assert math.isclose(got[step][1], ref[step][1], rel_tol=1e-4), (step, got[step][1], ref[step][1])
    final, expected = torch.load(tmp_path / "two" / "final.pt"), torch.load(tmp_path / "ref" / "final.pt")
    for key in expected:
        torch.testing.assert_close(final[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)


def _train(cfg_path: str) -> None:
    """The job's command: trainer_run.py's run of `cfg`, pausing `step_pause` seconds after each step."""
    from tessera.train import Callback

    tr = _trainer_run()
    cfg = json.loads(Path(cfg_path).read_text())
    pause, build = cfg.pop("step_pause", 0.0), tr.build

    class Pause(Callback):
        def on_batch_end(self, trainer, metrics) -> None:
            time.sleep(pause)

    def build_with_pause(config: dict):
        trainer, recorder = build(config)
        trainer.callbacks.append(Pause())
        return trainer, recorder

    tr.build = build_with_pause
    tr._run_child(cfg)


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:
        _train(sys.argv[2])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} train CFG.json")
