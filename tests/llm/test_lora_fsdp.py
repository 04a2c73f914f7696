"""LoRA on a Hugging Face model under FSDP2 (two CPU ranks, gloo): the decoder layers are the sharded units,
the sharded checkpoint holds only the adapters, the run resumes from it, and export reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from hf_fixtures import tiny_llama, write_chat_jsonl

BIN = Path(sys.executable).parent


def train(tmp_path: Path, base: Path, steps: int) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([str(BIN / "torchrun"), "--nproc-per-node", "2", "--no-python", str(BIN / "tessera"),
                           "train", "finetune-lora-tiny.yaml", f"model.pretrained={base}",
                           f"data.train.path={tmp_path / 'chat.jsonl'}", f"save_folder={tmp_path / 'ck'}",
                           f"max_duration={steps}ba", "save_interval=2ba", "parallelism=fsdp", "loggers=[jsonl]",
                           "torch_threads=1", "log_interval=1ba"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_lora_fsdp_two_ranks_resume_and_export(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    base = tiny_llama(tmp_path / "base", seed=6)
    write_chat_jsonl(tmp_path / "chat.jsonl", 100)
    train(tmp_path, base, 2)
    keys = dcp.FileSystemReader(str(tmp_path / "ck" / "ep0-ba2" / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)
    assert "resumed from" in train(tmp_path, base, 4)
    assert (tmp_path / "ck" / "latest").read_text().strip().endswith("ba4")

    from tessera.llm.hf.export import export_hf

    export_hf(tmp_path / "ck", tmp_path / "out")
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    before = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    moved = [k for k, v in tuned.state_dict().items() if not torch.equal(v, before.state_dict()[k])]
    assert any("q_proj" in k for k in moved) and not any("embed_tokens" in k or "norm" in k for k in moved)
