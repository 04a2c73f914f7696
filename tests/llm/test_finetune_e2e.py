"""Fine-tuning end to end: a tiny random Llama saved with transformers (a chat tokenizer built locally)
and a few hundred chat examples -> `tessera train finetune-lora-tiny.yaml` -> `tessera llm export
--format hf` (merged) and `--adapter-only` -> transformers and peft load them, and plain transformers code
finds the fine-tuned model's loss on the examples below the base model's. The commands run in this
process (the guide's test, tests/docs/test_finetuning_guide.py, runs the same as separate processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_fixtures import chat_tokenizer, tiny_llama, write_chat_jsonl
from typer.testing import CliRunner

from tessera.cli.main import app


def tessera(*args: str) -> None:
    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 0, f"tessera {' '.join(args)} exited {done.exit_code}:\n{done.output[-3000:]}"


def assistant_loss(model, tokenizer, examples: list[dict]) -> float:
    """Mean next-token loss on the assistant replies, with transformers alone (the template's mask)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for example in examples:
            encoded = tokenizer.apply_chat_template(example["messages"], return_dict=True,
                                                    return_assistant_tokens_mask=True)
            ids = torch.tensor([encoded["input_ids"]])
            mask = torch.tensor([encoded["assistant_masks"]], dtype=torch.bool)
            labels = ids.masked_fill(~mask, -100)
            n = int(mask[:, 1:].sum())
            total += model(input_ids=ids, labels=labels).loss.item() * n
            count += n
    return total / count


def test_finetune_lora_then_export_merged_and_adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import peft
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tiny_llama(tmp_path / "base", seed=0, tokenizer=chat_tokenizer())
    examples = write_chat_jsonl(tmp_path / "chat.jsonl", 300)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.chdir(tmp_path)
    save = tmp_path / "runs" / "ckpt"
    tessera("train", "finetune-lora-tiny.yaml", f"model.pretrained={base}", f"data.train.path={tmp_path / 'chat.jsonl'}",
            f"save_folder={save}", "max_duration=40ba")
    tessera("llm", "export", str(save), str(tmp_path / "out"), "--format", "hf")
    tessera("llm", "export", str(save), str(tmp_path / "out2"), "--format", "hf", "--adapter-only")

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    before = AutoModelForCausalLM.from_pretrained(base, local_files_only=True).eval()
    adapted = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, local_files_only=True),
                                             tmp_path / "out2").eval()
    sample = examples[:100]
    base_loss = assistant_loss(before, tokenizer, sample)
    tuned_loss = assistant_loss(merged, tokenizer, sample)
    assert tuned_loss < base_loss - 0.1, (tuned_loss, base_loss)
    assert abs(assistant_loss(adapted, tokenizer, sample) - tuned_loss) < 1e-3
