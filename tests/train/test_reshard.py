"""Sharded checkpoints reshard: saved by 2 FSDP2 gloo ranks, resumed by 1 process and by 3 ranks.

Every rank writes and uploads its own DCP shard (nothing is gathered to rank 0) and rank 0 commits a
manifest listing all of them. The resumed runs continue the global data order exactly (the stream
layer's elastic resume) and the loss curve within float tolerance (reduction order differs between
world sizes); the loaded weights themselves are bitwise the saved ones on any world size. A tiny GPT
saved the same way exports to one safetensors file without any process group.

Multi-process parts: Trainer runs are forked by test_trainer's fork server (trainer_run.py); the
checkpoint-level workers run this file as a script: `python test_reshard.py <role> ...`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import trainer_run as tr
from test_trainer import _env, _free_port, dataset, finish, forker, global_steps  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from tessera.storage import open_store
from tessera.train.checkpoint import CheckpointManager

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
HERE = Path(__file__).resolve()
BASE = {"dropout": 0.0, "global_batch_size": 12, "lanes": 4}  # 12 divides over 1, 2 and 3 ranks
TINY_GPT = {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 64, "max_seq_len": 16}


def spawn_ranks(world: int, *args: str, timeout: float = 120.0) -> None:
    """Run this file with `args` as `world` gloo ranks (RANK/WORLD_SIZE set, as torchrun would)."""
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(HERE), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                                                  WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                                                  LOCAL_WORLD_SIZE=str(world)))
             for rank in range(world)]
    outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} of {world} failed:\n{out[-4000:]}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory, dataset, forker, s3_server, s3_env):  # noqa: F811
    """The reference (2 DDP ranks, 8 batches) and two FSDP2 runs of 2 ranks for 4 batches, each saving
    its sharded checkpoint ep0-ba4: one to a local folder, one to a SeaweedFS bucket."""
    root = tmp_path_factory.mktemp("reshard")
    bucket = f"reshard-{os.getpid()}"
    s3_server.create_bucket(bucket)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_env.items():  # the forked ranks take their environment from os.environ
            mp.setenv(key, value)
        base = {**BASE, "data": dataset}
        runs = {"local": {**base, "out": str(root / "local"), "save_folder": str(root / "ckpt")},
                "s3": {**base, "out": str(root / "s3"), "save_folder": f"s3://{bucket}/runs/tiny/ckpt"}}
        procs = forker({**base, "out": str(root / "ref"), "max_duration": "8ba"}, world=2)
        for cfg in runs.values():
            procs += forker({**cfg, "parallelism": "fsdp", "max_duration": "4ba", "save_interval": "4ba"}, world=2)
        finish(procs)
        yield {"root": root, "runs": runs, "forker": forker}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_each_rank_uploads_its_own_shard_and_the_manifest_lists_all(saved, where):
    store = open_store(saved["runs"][where]["save_folder"])
    assert store.get("latest") == b"ep0-ba4"
    manifest = json.loads(store.get("ep0-ba4/manifest.json"))
    keys = {entry["key"] for entry in manifest["files"]}
    assert manifest["sharded"] and manifest["world_size"] == 2
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "rank0.pt", "rank1.pt"} <= keys
    rank1 = {entry["key"] for entry in json.loads(store.get("ep0-ba4/rank1.done.json"))["files"]}
    assert rank1 == {"dcp/__1_0.distcp", "rank1.pt"}  # rank 1 wrote and uploaded its shard itself
    assert "model.pt" not in keys  # no full copy of the model was gathered to rank 0


def _assert_continues_the_reference(root: Path, out: str, world: int) -> None:
    """Steps 1-4 (2 FSDP ranks) and 5-8 (the resumed world) train the reference's global batches with
    its losses; the final weights match within float tolerance."""
    ref, first, resumed = global_steps(root / "ref", 2), global_steps(out, 2), global_steps(out, world)
    for step in range(1, 9):
        got = first[step] if step <= 4 else resumed[step]
        assert got["ids"] == ref[step]["ids"], f"step {step}: another global batch"
        assert math.isclose(got["loss"], ref[step]["loss"], rel_tol=1e-5), (step, got["loss"], ref[step]["loss"])
    final, expected = torch.load(Path(out) / "final.pt"), torch.load(root / "ref" / "final.pt")
    assert final.keys() == expected.keys()
    for key in final:
        torch.testing.assert_close(final[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)


def test_two_fsdp_ranks_resume_on_one_process(saved):
    """The single process has no process group: DCP reads both ranks' shards into the plain model."""
    cfg = saved["runs"]["local"]
    finish(saved["forker"]({**cfg, "parallelism": "fsdp", "max_duration": "8ba", "autoresume": True}))
    _assert_continues_the_reference(saved["root"], cfg["out"], world=1)


def test_two_fsdp_ranks_resume_on_three_from_s3(saved, s3_env, monkeypatch):
    """3 ranks: uneven shards (32 rows -> 11/11/10, 4 rows -> 2/2/0), a rank that did not exist at save."""
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    cfg = saved["runs"]["s3"]
    finish(saved["forker"]({**cfg, "parallelism": "fsdp", "max_duration": "8ba", "autoresume": True}, world=3))
    _assert_continues_the_reference(saved["root"], cfg["out"], world=3)
    assert [len(tr.read_steps(cfg["out"], r)[8]["ids"]) for r in range(3)] == [4, 4, 4]


def test_the_loaded_weights_are_bitwise_the_saved_ones_on_one_and_three(saved, tmp_path):
    """The full tensors DCP assembles without a process group equal, bit for bit, those 3 FSDP ranks
    gather after loading the same checkpoint into their own (uneven) shards, and those of a single-rank
    process group."""
    url = saved["runs"]["local"]["save_folder"] + "/ep0-ba4"
    alone = CheckpointManager(url).load(url)
    spawn_ranks(1, "load", url, str(tmp_path / "on1.pt"))
    spawn_ranks(3, "load", url, str(tmp_path / "on3.pt"))
    on1, on3 = torch.load(tmp_path / "on1.pt"), torch.load(tmp_path / "on3.pt")
    assert all(torch.equal(on1["model"][key], value) for key, value in on3["model"].items())
    assert sorted(alone["model"]) == sorted(on3["model"])
    for key, value in on3["model"].items():
        assert torch.equal(alone["model"][key], value), key
    steps = {key: s["step"] for key, s in alone["optimizers"][0]["state"].items()}
    assert steps and all(float(v) == 4 for v in steps.values())
    for key, moments in on3["optim"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(alone["optimizers"][0]["state"][key][name], moments[name]), (key, name)


def test_a_tensor_parallel_checkpoint_loads_on_one_process_and_into_three_fsdp_ranks(tmp_path):
    """Another parallelism: 2 ranks split the MLP's layers (column-wise, then row-wise); the checkpoint
    loads bitwise as full tensors alone, and into 3 FSDP2 ranks."""
    url = str(tmp_path / "tp" / "ep0-ba1")
    spawn_ranks(2, "tp", str(tmp_path / "tp"), str(tmp_path / "expected.pt"))
    expected = torch.load(tmp_path / "expected.pt")
    alone = CheckpointManager(url).load(url)
    assert alone["checkpoint"]["world_size"] == 2
    spawn_ranks(3, "load", url, str(tmp_path / "on3.pt"))
    on3 = torch.load(tmp_path / "on3.pt")
    for key, value in expected["model"].items():
        assert torch.equal(alone["model"][key], value) and torch.equal(on3["model"][key], value), key
    for key, moments in expected["optim"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(on3["optim"][key][name], moments[name]), (key, name)


def test_export_of_a_sharded_gpt_checkpoint_is_one_safetensors_file(tmp_path):
    """2 FSDP ranks save a tiny GPT; `tessera llm export` (no process group) writes model.safetensors."""
    from tessera.cli.main import app
    from tessera.llm.export import load_pretrained

    spawn_ranks(2, "gpt", str(tmp_path / "ckpt"), str(tmp_path / "expected.pt"))
    result = CliRunner().invoke(app, ["llm", "export", str(tmp_path / "ckpt"), str(tmp_path / "export")])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["config.json", "model.safetensors"]
    model, _ = load_pretrained(tmp_path / "export")
    expected = torch.load(tmp_path / "expected.pt")
    exported = model.state_dict()
    assert sorted(exported) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(exported[key], value), key


# --- the background writer's share of the CPU ------------------------------------------------------------


def test_the_writer_runs_below_the_loops_priority_with_bounded_uploads(tmp_path, monkeypatch):
    from tessera.train.checkpoint.throttle import default_upload_threads
    from tessera.train.time import Timestamp

    seen = []
    manager = CheckpointManager(tmp_path / "ckpt", on_saved=lambda info: seen.append(
        os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))  # on_saved runs on the save thread
    ts = Timestamp().to_next_batch(1)
    manager.save({"model": tr.MLP().state_dict(), "timestamp": ts.state_dict()}, ts)
    manager.close()
    loop = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen == [min(19, loop + 10)]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_upload_threads() == 1  # 2 cores per rank: uploads on the save thread alone
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert default_upload_threads() == 4


# --- script roles ---------------------------------------------------------------------------------------


def _save_full_state_and_exit(model: torch.nn.Module, opt: torch.optim.Optimizer, out: str) -> None:
    """Rank 0 saves the gathered full model and optimizer state to `out`; then every rank leaves the group."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, [opt], options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save({"model": dict(msd), "optim": dict(osd["state"])}, out)
    dist.barrier()
    dist.destroy_process_group()


def _load_into_fsdp(url: str, out: str) -> None:
    """Load a 2-rank checkpoint into an FSDP2 MLP over every rank (1: a single-rank process group) and
    gather the full state on rank 0."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tessera.train.checkpoint import apply_state

    dist.init_process_group("gloo")
    torch.manual_seed(123)  # other initial weights than the saved run's: the load must replace them all
    model = tr.MLP(dropout=0.0)
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    state = CheckpointManager(url).load(url, model=model, optimizers=[opt])
    assert state["checkpoint"]["rng_derived"] == (dist.get_rank() >= 2)
    apply_state(state, model, [opt], restore_rng=False)
    _save_full_state_and_exit(model, opt, out)


def _save_tensor_parallel(folder: str, expected: str) -> None:
    """2 ranks: the MLP's first layer split column-wise, its last row-wise; one step, then a save."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tessera.train.checkpoint import capture_state
    from tessera.train.time import Timestamp

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = tr.MLP(dropout=0.0)
    parallelize_module(model.net, init_device_mesh("cpu", (2,)), {"0": ColwiseParallel(), "3": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1)  # the same batch on both ranks, as tensor parallelism needs
    batch = {"x": torch.randn(6, tr.FEATURES), "y": torch.randint(0, tr.CLASSES, (6,)), "id": torch.arange(6)}
    model(batch).backward()
    opt.step()
    ts = Timestamp().to_next_batch(6)
    manager = CheckpointManager(folder)
    manager.save(capture_state(model, [opt], timestamp=ts), ts)
    manager.close()
    _save_full_state_and_exit(model, opt, expected)


def _save_gpt(folder: str, expected: str) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tessera.llm.model import GPT, GPTConfig
    from tessera.train.checkpoint import capture_state
    from tessera.train.time import Timestamp

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY_GPT))
    mesh = init_device_mesh("cpu", (2,))
    for block in model.transformer.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ts = Timestamp().to_next_batch(4)
    manager = CheckpointManager(folder)
    manager.save(capture_state(model, timestamp=ts, config={"model": TINY_GPT}), ts)
    manager.close()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(dict(full), expected)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    torch.set_num_threads(1)
    {"load": _load_into_fsdp, "tp": _save_tensor_parallel, "gpt": _save_gpt}[role](*rest)
    # Leave without interpreter teardown: gloo's threads can abort a finished rank ("terminate called
    # without an active exception") when destructors run after the group is gone. Errors above still exit 1.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
