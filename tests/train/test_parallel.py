"""Parallelism as a setting (train/parallel/): FSDP full / grad-op / hybrid sharding and tensor parallelism
(Tessera's GPT, a tiny Hugging Face Llama) on 2 real gloo processes give the losses of one process;
activation checkpointing changes no loss or gradient; the plan resolves, prints, and refuses what cannot
run in one line naming the key.

The 2-process runs share one process group: this file is also the worker (`python test_parallel.py OUT
CASES`), which trains every case in turn, so the ranks pay torch's start-up once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

STEPS, GLOBAL_BATCH, SEQ = 3, 4, 12
SRC = str(Path(__file__).resolve().parents[2] / "src")


# --- the run every case trains: a tiny model, the same global batches, 3 steps ----------------------------------


def tiny_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        from tessera.llm.hf.adapter import HFCausalLM

        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        config._attn_implementation = "sdpa"
        return HFCausalLM(LlamaForCausalLM(config))
    from tessera.llm.model import GPT, GPTConfig

    attn = "rope" if kind == "gpt-rope" else "alibi"
    return GPT(GPTConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=64, max_seq_len=SEQ, attn=attn))


class Rows:
    """The global batch of each step, this data-parallel rank's rows of it."""

    def __init__(self, dp_rank: int, dp_world: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.data = torch.randint(0, 64, (STEPS, GLOBAL_BATCH, SEQ), generator=g)
        self.batch_size = GLOBAL_BATCH // dp_world
        self.start = dp_rank * self.batch_size

    def __iter__(self) -> Any:
        for step in self.data:
            yield {"tokens": step[self.start:self.start + self.batch_size]}

    def __len__(self) -> int:
        return STEPS


def train_losses(kind: str, parallelism: Any, rank: int = 0, world: int = 1) -> tuple[list[float], int]:
    """The logged loss of each step, and how many parameter elements this rank holds after parallelize."""
    from tessera.train import Callback, Trainer

    losses: list[float] = []

    class Record(Callback):
        def on_batch_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
            losses.append(metrics["train/loss"])

    tp = (parallelism or {}).get("tensor_parallel", {}).get("degree", 1) if isinstance(parallelism, dict) else 1
    model = tiny_model(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = Trainer(model, opt, train_dataloader=Rows(rank // tp, world // tp), max_duration=f"{STEPS}ba",
                      loggers=[], device="cpu", parallelism=parallelism, grad_clip_norm=1.0, callbacks=[Record()])
    held = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in trainer.model.parameters())
    trainer.fit()
    trainer.close()
    return losses, held


def worker(out: str, cases: str) -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = {}
    for name, (kind, parallelism) in json.loads(cases).items():
        results[name] = train_losses(kind, parallelism, rank, world)
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def run_processes(tmp_path: Path, cases: dict[str, Any], world: int = 2) -> dict[str, list[float]]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "TORCHELASTIC"))}
    out = tmp_path / "losses.json"
    procs = []
    for rank in range(world):
        env = {**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}
        procs.append(subprocess.Popen([sys.executable, __file__, str(out), json.dumps(cases)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        output, _ = proc.communicate(timeout=280)
        assert proc.returncode == 0, output[-4000:]
    return json.loads(out.read_text())


CASES = {
    "full_shard": ("gpt", {"fsdp": {"sharding": "full_shard"}}),
    "shard_grad_op": ("gpt", {"fsdp": {"sharding": "shard_grad_op"}}),
    "hybrid_1x2": ("gpt", {"fsdp": {"sharding": "hybrid"}}),                    # defaults: 1 node x 2 processes
    "hybrid_2x1": ("gpt", {"fsdp": {"sharding": "hybrid", "replicate": 2, "shard": 1}}),
    "tp_gpt_alibi": ("gpt", {"data_parallel": "none", "tensor_parallel": {"degree": 2}}),
    "tp_gpt_rope_no_sp": ("gpt-rope", {"data_parallel": "none",
                                       "tensor_parallel": {"degree": 2, "sequence_parallel": False}}),
    "tp_llama": ("llama", {"data_parallel": "none", "tensor_parallel": {"degree": 2}}),
    "fsdp_ac_selective": ("gpt", {"fsdp": {"sharding": "full_shard"}, "activation_checkpointing": "selective"}),
    "fsdp_cpu_offload": ("gpt", {"fsdp": {"sharding": "full_shard", "cpu_offload": True}}),
    "fsdp_bf16_params": ("gpt", {"fsdp": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}),
}
TOLERANCE = {"fsdp_bf16_params": 2e-3}  # blocks compute in bfloat16


def test_two_processes_match_one(tmp_path: Path) -> None:
    """Each sharding and tensor-parallel layout on 2 gloo processes trains the losses of 1 process (steps 2
    and 3 also check the updates), while each rank holds only part of the parameters."""
    got = run_processes(tmp_path, CASES)
    references = {kind: train_losses(kind, None) for kind in {kind for kind, _ in CASES.values()}}
    for name, (kind, _) in CASES.items():
        (losses, held), (expected, whole) = got[name], references[kind]
        assert losses == pytest.approx(expected, rel=TOLERANCE.get(name, 2e-4)), (name, losses, expected)
        if name != "hybrid_2x1":  # 2 replicas of 1 shard: each holds everything
            assert held < whole, (name, held, whole)


def test_fsdp_with_tensor_parallel_on_a_2x2_mesh(tmp_path: Path) -> None:
    """4 processes: FSDP over dp_shard (2) x tensor parallelism over tp (2), GPT and a tiny Llama."""
    cases = {"fsdp_tp_gpt": ("gpt", {"fsdp": {"sharding": "full_shard"}, "tensor_parallel": {"degree": 2}}),
             "fsdp_tp_llama": ("llama", {"fsdp": {"sharding": "full_shard"}, "tensor_parallel": {"degree": 2}})}
    got = run_processes(tmp_path, cases, world=4)
    for name, (kind, _) in cases.items():
        (losses, held), (expected, whole) = got[name], train_losses(kind, None)
        assert losses == pytest.approx(expected, rel=2e-4), (name, losses, expected)
        assert held < whole / 2, (name, held, whole)


# --- one process ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "every_n", "selective"])
def test_activation_checkpointing_keeps_losses_and_gradients(mode: str) -> None:
    from tessera.train.parallel import parallelize, resolve_plan

    batch = {"tokens": Rows(0, 1).data[0]}
    plain = tiny_model("gpt")
    loss = plain(batch)
    loss.backward()
    model = parallelize(tiny_model("gpt"), resolve_plan({"activation_checkpointing": {"mode": mode, "n": 2}}),
                        torch.device("cpu"))
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]  # same names
    again = model(batch)
    again.backward()
    assert torch.equal(loss, again)
    for (name, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_pure_bf16_trains_bfloat16_weights_and_state() -> None:
    from tessera.train import Trainer

    model = tiny_model("gpt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = Trainer(model, opt, train_dataloader=Rows(0, 1), max_duration="2ba", loggers=[], device="cpu",
                      precision="pure_bf16", grad_clip_norm=1.0)
    trainer.fit()
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert opt.param_groups[0]["params"][0] is next(trainer.model.parameters())  # the optimizer kept its params
    assert {state["exp_avg"].dtype for state in opt.state.values()} == {torch.bfloat16}


def test_the_plan_for_a_world() -> None:
    from tessera.train.parallel import resolve_plan

    plan = resolve_plan({"fsdp": {"sharding": "hybrid", "param_dtype": "bfloat16", "reduce_dtype": "float32"},
                         "tensor_parallel": {"degree": 2}}, world_size=16, local_world_size=8, device_type="cuda")
    assert plan.mesh_dims == ("dp_replicate", "dp_shard", "tp") and plan.mesh_shape == (2, 4, 2)
    assert plan.dp_degree == 8 and plan.compile  # compile: auto is on for CUDA
    described = plan.describe("transformer.blocks.0..31")
    assert described["fsdp"]["param_dtype"] == "bfloat16" and "transformer.blocks.0..31" in described["fsdp"]["wrapped"]
    one = resolve_plan("fsdp", world_size=1)
    assert one.data_parallel == "none" and not one.mesh_dims and not one.compile  # nothing to shard, CPU
    assert resolve_plan("fsdp", world_size=4).mesh_shape == (4,)
    sgo = resolve_plan({"fsdp": {"sharding": "shard_grad_op"}}, world_size=2)
    assert not sgo.reshard_after_forward


@pytest.mark.parametrize(("settings", "world", "key"), [
    ({"tensor_parallel": {"degree": 3}}, 2, "parallelism.tensor_parallel.degree"),
    ({"fsdp": {"sharding": "hybrid"}}, 1, "parallelism.fsdp.sharding"),
    ({"fsdp": {"sharding": "hybrid", "replicate": 3}}, 4, "parallelism.fsdp.replicate"),
    ({"fsdp": {"shard": 2}}, 4, "parallelism.fsdp.replicate"),
    ({"tensor_parallel": {"degree": 2}}, 4, "parallelism.data_parallel"),
    ({"float8": True}, 1, "parallelism.float8"),
])
def test_a_plan_that_cannot_run_names_its_key(settings: dict[str, Any], world: int, key: str) -> None:
    from tessera.train.parallel import ParallelismError, resolve_plan

    with pytest.raises(ParallelismError, match=key.replace(".", r"\.")):
        resolve_plan(settings, world_size=world)


def test_tensor_parallel_refuses_what_it_cannot_split() -> None:
    from tessera.llm.hf.config import LoraSpec
    from tessera.llm.hf.lora import add_lora
    from tessera.train.parallel.tensor_parallel import apply_tensor_parallel

    with pytest.raises(ValueError, match="LoRA adapters are not split yet"):  # checked before any mesh is used
        apply_tensor_parallel(add_lora(tiny_model("llama"), LoraSpec()), tp_mesh=None)
    with pytest.raises(ValueError, match="has no tensor-parallel plan"):
        apply_tensor_parallel(torch.nn.Sequential(torch.nn.Linear(2, 2)), tp_mesh=None)


def test_shorthands_and_sections_parse() -> None:
    from tessera.train.config import TrainerConfig

    for value, mode in (("ddp", "ddp"), ("fsdp", "fsdp"), (None, "none"), ({"fsdp": {"sharding": "hybrid"}}, "fsdp")):
        assert TrainerConfig.of({"max_duration": "1ba", "parallelism": value}).parallelism.data_parallel == mode
    with pytest.raises(ValueError, match="unknown key 'parallelism.fsdp.shardng'"):
        TrainerConfig.of({"max_duration": "1ba", "parallelism": {"fsdp": {"shardng": "hybrid"}}})
    with pytest.raises(ValueError, match="parallelism.data_parallel=fsdp"):
        TrainerConfig.of({"max_duration": "1ba", "parallelism": {"data_parallel": "ddp", "fsdp": {"cpu_offload": True}}})


def test_print_config_shows_the_plan_and_bad_settings_exit_2() -> None:
    import yaml
    from typer.testing import CliRunner

    from tessera.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", "-n", "2", "parallelism.fsdp.sharding=full_shard",
                              "--print-config"])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(res.stdout)["parallelism"]["data_parallel"] == "fsdp"  # still a loadable recipe
    plan = yaml.safe_load("\n".join(line[2:] for line in res.stdout.splitlines() if line.startswith("# ")
                                    and not line.startswith("# resolved")))["parallel_plan"]
    assert plan["mesh"] == {"dims": ["dp_shard"], "shape": [2]} and plan["data_parallel"] == "full_shard"
    assert plan["fsdp"]["wrapped"] == "each of transformer.blocks.0..3, then the root"
    res = runner.invoke(app, ["train", "mpt-7b.yaml", "-n", "16", "--print-config", "--json", "save_folder=s3://b/c",
                              "data.train.streams.0.remote=s3://b/d", "data.eval.streams.0.remote=s3://b/d"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)["parallel_plan"]
    assert plan["fsdp"]["param_dtype"] == "bfloat16" and plan["fsdp"]["reduce_dtype"] == "float32"
    for args, key in ((["-n", "2", "parallelism.tensor_parallel.degree=3"], "parallelism.tensor_parallel.degree"),
                      (["parallelism.fsdp.sharding=hybrid"], "parallelism.fsdp.sharding")):
        res = runner.invoke(app, ["train", "tiny-cpu.yaml", *args, "--print-config"])
        assert res.exit_code == 2 and key in res.output and len(res.output.strip().splitlines()) == 1, res.output


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
    # no interpreter teardown after the work is done: gloo's threads can abort a finished rank
    # ("terminate called without an active exception") when destructors run after the group is gone
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
