"""docs/finetuning.md, every ```bash block in order, in a temp folder, against a SeaweedFS of this module's
own holding the bucket `s3://tessera`. Not run: the hub download, the reader's server start (this test
provides the server and its variables) and the GPU-only recipes."""

from __future__ import annotations

from pathlib import Path

from doc_blocks import ROOT, bash_blocks, run_block, shell_env

GUIDE = ROOT / "docs" / "finetuning.md"


def test_the_guide_runs_from_a_model_folder_to_loaded_exports(private_s3_server, tmp_path: Path) -> None:
    blocks = bash_blocks(GUIDE.read_text())
    skipped = [b.code for b in blocks if b.skipped]
    assert len(skipped) == 5
    assert "hf download" in skipped[0] and "s3server.py" in skipped[1]
    assert all("llama-8b.yaml" in code for code in skipped[2:])  # only the GPU recipes besides
    private_s3_server.create_bucket("tessera")
    env = shell_env({**private_s3_server.env(), "XDG_CACHE_HOME": str(tmp_path / "cache"),
                     "TESSERA_MODEL_CACHE": str(tmp_path / "models")}, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    outputs = [run_block(block, work, env, "docs/finetuning.md") for block in blocks if not block.skipped]
    text = "\n".join(outputs)
    assert "resumed from" in text and "-ba60" in text
    assert "merged: '" in text and "base + adapter: '" in text
    assert (work / "sft-merged" / "model.safetensors").exists()
    assert (work / "sft-adapter" / "adapter_model.safetensors").exists()
    assert "adapter_model.safetensors" in outputs[-1]  # the adapter exported into the bucket
