"""A tiny real training run for the Trainer tests: MDS shards -> StreamingDataset(shuffle=True) ->
StreamingDataLoader -> an MLP with dropout -> Trainer. Importable (in-process tests) and runnable as a
script, alone or under `tessera launch` / torchrun: `python trainer_run.py '<json config>'`.

Every rank appends one JSON line per step to `<out>/rank{R}.jsonl`: the step, the logged global loss,
the microbatch size, this rank's sample ids and the pid. Rank 0 writes the final weights to
`<out>/final.pt`. A line for the same step may appear twice in a killed-and-resumed run (the batches
between the checkpoint and the kill are trained again); the last one counts.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import fork_server
import numpy as np
import torch

from tessera.shards import ShardWriter
from tessera.stream import StreamingDataLoader, StreamingDataset
from tessera.train import Callback, CosineWithWarmup, SimulatedOutOfMemory, Trainer

COLUMNS = {"id": "int", "x": "ndarray:float32:8", "y": "int"}
FEATURES, CLASSES = 8, 4


def sample(i: int) -> dict[str, Any]:
    x = np.sin(np.arange(FEATURES, dtype=np.float32) * (i + 1) * 0.37).astype(np.float32)
    return {"id": i, "x": x, "y": int(i * 7 % CLASSES)}


def write_dataset(out: str | Path, n: int = 96, size_limit: int = 600) -> None:
    with ShardWriter(out, COLUMNS, size_limit=size_limit) as writer:
        for i in range(n):
            writer.write(sample(i))


class MLP(torch.nn.Module):
    """Returns the mean cross-entropy (train) or {"loss", "accuracy"} (eval); raises a simulated OOM when
    a microbatch is larger than `oom_above` on a rank listed in `oom_ranks`."""

    flops_per_token = 6 * (FEATURES * 32 + 32 * CLASSES)

    def __init__(self, oom_above: int | None = None, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                                       torch.nn.Linear(32, CLASSES))
        self.oom_above = oom_above
        self.seen: list[int] = []

    def forward(self, batch: dict[str, Any]) -> Any:
        if self.oom_above is not None and len(batch["x"]) > self.oom_above:
            raise SimulatedOutOfMemory(f"simulated: a microbatch of {len(batch['x'])} does not fit")
        logits = self.net(batch["x"])
        loss = torch.nn.functional.cross_entropy(logits, batch["y"])
        if not self.training:
            return {"loss": loss, "accuracy": (logits.argmax(-1) == batch["y"]).float().mean()}
        self.seen += batch["id"].tolist()
        return loss


class Recorder(Callback):
    def __init__(self, out: Path, rank: int, kill_at: int | None, kill_after_commit: bool = False) -> None:
        self.path = out / f"rank{rank}.jsonl"
        self.kill_at, self.kill_after_commit = kill_at, kill_after_commit
        self.evals: list[dict[str, Any]] = []
        self.saved: list[str] = []

    def on_batch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        model = getattr(trainer.model, "module", trainer.model)
        ids = sorted(set(model.seen))
        model.seen.clear()
        line = {"step": trainer.timestamp.batch, "loss": metrics.get("train/loss"), "ids": ids, "pid": os.getpid(),
                "microbatch": trainer.microbatch.current, "lr": metrics.get("lr/opt0")}
        with open(self.path, "a") as out:
            out.write(json.dumps(line) + "\n")
        if trainer.timestamp.batch == self.kill_at:
            if self.kill_after_commit and trainer.checkpoints is not None:
                trainer.checkpoints.wait()
            os.kill(os.getpid(), signal.SIGKILL)

    def on_eval_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        self.evals.append({"step": trainer.timestamp.batch, **metrics})

    def on_checkpoint_saved(self, trainer: Trainer, info: Any) -> None:
        self.saved.append(info.name)


def build(cfg: dict[str, Any]) -> tuple[Trainer, Recorder]:
    """A Trainer from a JSON-able config (see the keys read below)."""
    out = Path(cfg["out"])
    out.mkdir(parents=True, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    gbs = cfg.get("global_batch_size", 8)
    dataset = StreamingDataset(local=cfg["data"], shuffle=True, batch_size=gbs // world, shuffle_seed=7,
                               num_canonical_nodes=cfg.get("lanes", 4))
    loader = StreamingDataLoader(dataset, batch_size=gbs // world)
    eval_loader = None
    if cfg.get("eval_interval"):
        eval_ds = StreamingDataset(local=cfg["data"], shuffle=False, batch_size=gbs // world)
        eval_loader = StreamingDataLoader(eval_ds, batch_size=gbs // world)
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    oom_ranks = cfg.get("oom_ranks", [rank])
    model = MLP(oom_above=cfg.get("oom_above") if rank in oom_ranks else None, dropout=cfg.get("dropout", 0.1))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.get("lr", 3e-2))
    recorder = Recorder(out, rank, cfg.get("kill_at"), cfg.get("kill_after_commit", False))
    trainer = Trainer(model=model, optimizers=opt, train_dataloader=loader, max_duration=cfg["max_duration"],
                      schedulers=CosineWithWarmup(warmup="2ba", duration="16ba", alpha_f=0.1),
                      run_name=cfg.get("run_name", "tiny"), save_folder=cfg.get("save_folder"),
                      save_interval=cfg.get("save_interval"), autoresume=cfg.get("autoresume", False),
                      save_num_checkpoints_to_keep=cfg.get("keep"),
                      eval_dataloader=eval_loader, eval_interval=cfg.get("eval_interval"),
                      precision=cfg.get("precision", "fp32"), grad_clip_norm=cfg.get("grad_clip_norm", 1.0),
                      device_train_microbatch_size=cfg.get("microbatch"), global_batch_size=gbs,
                      loggers=cfg.get("loggers", []), log_dir=str(out / "logs"), callbacks=[recorder],
                      seed=cfg.get("seed", 1), num_tokens_fn=lambda b: b["x"].numel(),
                      parallelism=cfg.get("parallelism", "ddp"))
    if cfg.get("kill_in_save") and trainer.checkpoints is not None:
        kill_inside_saves(type(trainer.checkpoints.store), **cfg["kill_in_save"])
    return trainer, recorder


def kill_inside_saves(store_cls: type, name: str, when: str) -> None:
    """SIGKILL this process from inside the save of checkpoint `name`, on the background save thread:
    `when="upload"` once the first of its files is uploaded (no manifest yet), `when="pointer"` once its
    manifest is written, just before `latest` would point at it. Patches the store class, so only for
    forked children (never in the test process)."""
    put, put_file = store_cls.put, store_cls.put_file

    def put_file_then_kill(self, key, path):
        put_file(self, key, path)
        if when == "upload" and f"/{name}/" in self.url_for(key):
            os.kill(os.getpid(), signal.SIGKILL)

    def kill_before_pointer(self, key, data):
        if when == "pointer" and key.rsplit("/", 1)[-1] == "latest" and bytes(data) == name.encode():
            os.kill(os.getpid(), signal.SIGKILL)
        put(self, key, data)

    store_cls.put_file, store_cls.put = put_file_then_kill, kill_before_pointer


def run(cfg: dict[str, Any]) -> Trainer:
    trainer, _ = build(cfg)
    trainer.fit()
    trainer.close()
    model = getattr(trainer.model, "module", trainer.model)
    # full_tensor() is a collective under FSDP: every rank gathers, rank 0 writes.
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    if trainer.rank == 0:
        torch.save(state, Path(cfg["out"]) / "final.pt")
    return trainer


def read_steps(out: str | Path, rank: int = 0) -> dict[int, dict[str, Any]]:
    """step -> the last line logged for it by `rank`."""
    steps: dict[int, dict[str, Any]] = {}
    path = Path(out) / f"rank{rank}.jsonl"
    for line in path.read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record
    return steps


def _run_child(cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    run(cfg)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def serve() -> None:
    """A fork server (`--serve`, see tests/fork_server.py): torch and tessera are imported once; each stdin
    line {"cfg", "env", "log", "rc"} forks a child that runs `cfg`, and its exit status goes to `rc`. No
    torch op runs in the server, so children start without thread pools."""
    import torch._dynamo  # noqa: F401  (optimizers import it on first use: pay once, here)
    import torch.distributed.checkpoint  # noqa: F401

    fork_server.serve(lambda cmd: _run_child(cmd["cfg"]), rc_path=lambda cmd: cmd["rc"])


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        _run_child(json.loads(sys.argv[1]))
