"""The platform running the real trainer (`tessera train tiny-cpu.yaml ...`, a 1-layer d_model=32 model
for 30 batches) on the local cluster and on the real Slurm cluster: completion, a two-node job over gloo,
kill -9 and resume, a user error at step 0, and a move from local to Slurm mid-run. A resumed or moved
run must end with the same losses and bitwise the same weights as an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from platform_helpers import SlurmCluster, wait_for

from tessera.platform import Platform, RunFailed

torch = pytest.importorskip("torch")

TESSERA = str(Path(sys.executable).with_name("tessera"))
STEPS = 150  # long enough that a move requested after the first checkpoint lands mid-run
TIMEOUT = 90
TINY = ("model.d_model=32 model.n_layers=1 model.max_seq_len=32 global_train_batch_size=4 "
        "device_train_microbatch_size=2 torch_threads=1 "
        "scheduler.t_warmup=4ba optimizer.lr=1e-2 save_interval=10ba eval_interval=1000ba log_interval=1ba "
        f"loggers=[jsonl] data.eval.max_batches=1 max_duration={STEPS}ba")


def write_corpus(root: Path, n_docs: int = 40) -> None:
    rng = random.Random(0)
    words = "def class return import from yield with open read write data model token value index".split()
    root.mkdir(parents=True)
    for i in range(n_docs):
        text = "\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(rng.randint(1, 10)))
        (root / f"doc{i:03d}.txt").write_text(text + "\n")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Byte-tokenized 32-token windows (train + val), prepared once."""
    from tessera.llm.prep import prep

    root = tmp_path_factory.mktemp("tinydata")
    write_corpus(root / "corpus")
    prep(root / "corpus", root / "data", "byte", seq_len=32, val_fraction=0.2)
    return root / "data"


def train_command(data: Path, folder: Path, *extra: str) -> str:
    """`tessera train` working in FOLDER (logs/ there, checkpoints in FOLDER/ckpt)."""
    return (f"cd {folder} && {TESSERA} train tiny-cpu.yaml {TINY} data.train.streams.0.remote={data} "
            f"data.eval.streams.0.remote={data} save_folder={folder}/ckpt " + " ".join(extra))


def losses(folder: Path) -> dict[int, float]:
    """step -> train loss (a later line for a step, written after a resume, wins)."""
    out: dict[int, float] = {}
    for line in (folder / "logs" / "tiny-cpu" / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "train/loss" in row:
            out[row["step"]] = row["train/loss"]
    return out


def final_weights(folder: Path) -> dict:
    final = (folder / "ckpt" / "latest").read_text().strip()
    assert final.endswith(f"-ba{STEPS}"), final
    state = torch.load(folder / "ckpt" / final / "model.pt", map_location="cpu", weights_only=True)
    return state.get("model", state)


def assert_same_run(folder: Path, reference: tuple[dict, dict]) -> None:
    ref_loss, ref_weights = reference
    got = losses(folder)
    assert got == ref_loss, [(s, got.get(s), ref_loss[s]) for s in ref_loss if got.get(s) != ref_loss[s]][:5]
    weights = final_weights(folder)
    assert weights.keys() == ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights)


@pytest.fixture(scope="session")
def reference(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """Losses and final weights of the uninterrupted run, outside the platform."""
    folder = tmp_path_factory.mktemp("reference")
    done = subprocess.run(["bash", "-c", train_command(tiny_data, folder)], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    loss = losses(folder)
    assert sorted(loss) == list(range(1, STEPS + 1)) and loss[STEPS] < loss[1] - 0.5
    return loss, final_weights(folder)


def spec(name: str, command: str, cluster: str = "local", nodes: int = 1, **scheduling) -> dict:
    return {"name": name, "command": command, "compute": {"cluster": cluster, "nodes": nodes},
            "scheduling": {"max_retries": 2, "stop_grace": "20s", **scheduling}}


def first_checkpoint(folder: Path) -> str:
    pointer = folder / "ckpt" / "latest"
    return wait_for(lambda: pointer.exists() and pointer.read_text(), timeout=TIMEOUT,
                    what="a first checkpoint")


# --- the local cluster -----------------------------------------------------------------------------


def test_kill_9_mid_run_resumes_to_the_same_model(platform: Platform, tiny_data: Path, reference,
                                                  tmp_path: Path) -> None:
    platform.create_run(spec("crash", train_command(tiny_data, tmp_path)))
    first_checkpoint(tmp_path)
    beat = wait_for(lambda: platform.get_run("crash").resumptions[0].last_heartbeat, timeout=TIMEOUT,
                    what="a heartbeat")
    os.kill(int(beat["pid"]), signal.SIGKILL)
    run = platform.wait_for_run_status("crash", "COMPLETED", timeout=TIMEOUT)
    assert [r.outcome for r in run.resumptions] == ["crash", "completed"]
    assert run.resumptions[0].exit_code == 137 and run.resumptions[1].cause.startswith("retry after crash")
    assert run.retries_used == 1
    assert_same_run(tmp_path, reference)


def test_an_exception_at_step_0_fails_after_one_attempt(platform: Platform, tiny_data: Path,
                                                        tmp_path: Path) -> None:
    command = train_command(tiny_data, tmp_path, f"data.train.streams.0.remote={tmp_path}/no-such-data")
    platform.create_run(spec("baddata", command))
    with pytest.raises(RunFailed):
        platform.wait_for_run_status("baddata", "COMPLETED", timeout=TIMEOUT)
    run = platform.get_run("baddata")
    assert run.status == "FAILED" and run.failure_kind == "user_error" and run.retries_used == 0
    assert len(run.resumptions) == 1 and run.resumptions[0].exit_code not in (0, None)
    assert run.first_error, "describe should show the first exception"


# --- the Slurm cluster -----------------------------------------------------------------------------


def test_single_node_run_on_slurm_completes(platform: Platform, slurm_cluster: SlurmCluster, tiny_data: Path,
                                            reference, tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    platform.create_run(spec("one", train_command(tiny_data, tmp_path), cluster="slurm"))
    run = platform.wait_for_run_status("one", "COMPLETED", timeout=TIMEOUT)
    [res] = run.resumptions
    assert res.cluster == "slurm" and res.nodes[0] in slurm_cluster.nodes
    assert any(e.kind == "checkpoint" for e in run.events) and res.last_heartbeat["step"] == STEPS
    assert_same_run(tmp_path, reference)


def test_two_node_job_trains_over_gloo(platform: Platform, slurm_cluster: SlurmCluster, tiny_data: Path,
                                       tmp_path: Path) -> None:
    """One `tessera train` per node (RANK = NODE_RANK, WORLD_SIZE 2, MASTER_ADDR 127.0.0.1): a data-parallel
    job over gloo; each rank gets half of the global batch of 4."""
    slurm_cluster.add_to(platform)
    command = train_command(tiny_data, tmp_path)
    platform.create_run(spec("pair", command, cluster="slurm", nodes=2))
    run = platform.wait_for_run_status("pair", "COMPLETED", timeout=TIMEOUT)
    [res] = run.resumptions
    assert len(res.nodes) == 2 and set(res.nodes) <= set(slurm_cluster.nodes)
    final = (tmp_path / "ckpt" / "latest").read_text().strip()
    assert final.endswith(f"-ba{STEPS}") and (tmp_path / "ckpt" / final / "rank1.pt").exists(), final
    loss = losses(tmp_path)
    assert sorted(loss) == list(range(1, STEPS + 1)) and loss[STEPS] < loss[1] - 0.5
    log1 = "\n".join(platform.follow_logs("pair", rank=1, follow=False))
    assert "Traceback" not in log1


def test_move_from_local_to_slurm_mid_run_gives_the_same_run(platform: Platform, slurm_cluster: SlurmCluster,
                                                             tiny_data: Path, reference,
                                                             tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    platform.create_run(spec("mover", train_command(tiny_data, tmp_path)))
    first_checkpoint(tmp_path)
    platform.move_run("mover", "slurm")
    run = platform.wait_for_run_status("mover", "COMPLETED", timeout=TIMEOUT)
    first, second = run.resumptions
    assert (first.cluster, first.outcome) == ("local", "moved")
    assert (second.cluster, second.cause, second.outcome) == ("slurm", "moved from local to slurm",
                                                               "completed")
    events = (Path(first.folder) / "heartbeat.json.events.jsonl").read_text().splitlines()
    moved_at = max(e.get("step", 0) for e in map(json.loads, events) if e["kind"] == "checkpoint")
    assert 0 < moved_at < STEPS, "the move should happen mid-run"
    assert_same_run(tmp_path, reference)     # same global batches, same losses, same weights
