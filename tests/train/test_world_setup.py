"""A StreamingDataset reads the same world, and so the same samples in the same order, whether it is built
before or after the trainer's distributed set-up, however the script was started under Slurm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tessera.shards import ShardWriter
from tessera.stream import StreamingDataset
from tessera.train.distributed import env_from_environ, export_env, init_distributed

# What init_distributed may write, and what a shell under Slurm or torchrun carries.
WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SALLOC = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "4", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1",
          "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
          "SLURM_JOB_NODELIST": "n1"}


@pytest.fixture
def world_env(monkeypatch: pytest.MonkeyPatch):
    """No world variables from the shell running pytest; whatever a test (or init_distributed) sets is
    undone afterwards (set first so that monkeypatch restores them even when they were absent)."""
    for name in [*WORLD_VARS, *(n for n in os.environ if n.startswith("SLURM_"))]:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("world") / "ds"
    with ShardWriter(out, {"id": "int"}, size_limit=200) as writer:
        for i in range(96):
            writer.write({"id": i})
    return out


def sample_order(data: Path) -> list[int]:
    ds = StreamingDataset(local=str(data), batch_size=4, shuffle=True, shuffle_seed=7, shuffle_block_size=32)
    return [int(s["id"]) for s in ds]


def test_under_salloc_the_order_is_the_same_before_and_after_trainer_setup(world_env, data):
    single = sample_order(data)
    for name, value in SALLOC.items():  # a shell in a 4-task allocation, no srun: one process
        world_env.setenv(name, value)
    before = sample_order(data)
    env = init_distributed()  # what the Trainer does first
    assert (env.rank, env.world_size) == (0, 1)
    assert sample_order(data) == before == single
    assert sorted(before) == list(range(96))


def test_under_srun_the_order_is_the_same_before_and_after_trainer_setup(world_env, data):
    for name, value in {**SALLOC, "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}.items():
        world_env.setenv(name, value)  # task 1 of a 4-task srun step
    before = sample_order(data)
    env = env_from_environ()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 4, 1, 4)
    export_env(env)  # what init_distributed writes before it joins the process group
    assert sample_order(data) == before
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        world_env.delenv(name)  # the same rank started by torchrun instead of srun
    assert sample_order(data) == before
    world_env.setenv("RANK", "0")
    world_env.setenv("LOCAL_RANK", "0")
    rank0 = sample_order(data)
    assert rank0 != before and len(rank0) == len(before) == 24 and not set(rank0) & set(before)
