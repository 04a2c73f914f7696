"""Leaving a distributed run is one sequence (docs/training.md, "Stopping a run"): `Trainer.close()` joins
the checkpoint thread and ends the trainer's own gloo groups (the checkpoint manager's, the count group)
there, and `distributed.destroy()` then leaves the default group. Two real ranks on gloo count their
threads by name (/proc) after each step of it: a group left to destructors at interpreter exit would
still have its threads running after close(). (The default group's threads outlive destroy() whatever
the trainer does: torch's DDP keeps a reference to the group in C++ once a model was wrapped.)

The ranks run this file as a script: `python test_shutdown.py OUT_DIR DATA_DIR` with torchrun's variables.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve()
TESTS = HERE.parents[1]
GLOO = ("pt_gloo_runloop", "gloo_tcp_loop")  # a gloo group's worker threads and its transport's event loop


def threads() -> Counter[str]:
    """This process's threads by name (the kernel's, so C++ threads count too)."""
    tasks = Path("/proc/self/task")
    return Counter((task / "comm").read_text().strip() for task in tasks.iterdir())


def gloo_threads() -> int:
    counts = threads()
    return sum(counts[name] for name in GLOO)


def _rank(out: Path, data: str) -> None:
    """One rank: the default group alone, then a run with checkpoints, then close(), then destroy()."""
    import torch
    import trainer_run

    from tessera.train import distributed

    distributed.init_distributed()
    distributed.barrier()  # gloo names its threads once they have run
    seen = {"default group": gloo_threads()}
    trainer, _ = trainer_run.build({"data": data, "out": str(out), "max_duration": "2ba", "global_batch_size": 8,
                                    "save_folder": str(out / "ckpt"), "save_interval": "1ba"})
    trainer.fit()
    seen["fitted"] = gloo_threads()
    trainer.close()
    # a group's threads end as its destructor joins them: on a loaded machine one may still be leaving
    # when close() returns; one left to the interpreter's exit would still be here after seconds
    deadline = time.monotonic() + 10
    while gloo_threads() > seen["default group"] and time.monotonic() < deadline:
        time.sleep(0.05)
    seen["closed"] = gloo_threads()
    seen["save threads after close"] = sum(n for name, n in threads().items() if name.startswith("tessera-ckpt"))
    del trainer
    distributed.destroy()
    seen["default group left"] = not torch.distributed.is_initialized()
    (out / f"threads{os.environ['RANK']}.json").write_text(json.dumps(seen))


def test_close_ends_the_trainers_groups_and_destroy_the_default_one(tmp_path: Path) -> None:
    import trainer_run

    trainer_run.write_dataset(tmp_path / "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS / "train"), str(TESTS), env.get("PYTHONPATH", "")]),
               WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1")
    ranks = [subprocess.Popen([sys.executable, str(HERE), str(tmp_path), str(tmp_path / "data")],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for rank in ranks:
        output = rank.communicate(timeout=120)[0]
        assert rank.returncode == 0, output[-3000:]
    for r in range(2):
        seen = json.loads((tmp_path / f"threads{r}.json").read_text())
        one_group = seen["default group"]
        assert one_group > 0
        # the run adds the checkpoint manager's group and the count group; close() ends both
        assert seen == {"default group": one_group, "fitted": 3 * one_group, "closed": one_group,
                        "save threads after close": 0, "default group left": True}, seen


if __name__ == "__main__":
    _rank(Path(sys.argv[1]), sys.argv[2])
