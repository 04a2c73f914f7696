"""docs/getting-started.md, every ```bash block in order, in a temp folder, against a SeaweedFS of this
module's own holding the bucket `s3://tessera` (the block that starts the reader's server is marked skip:
this test provides the server and the variables that block sets)."""

from __future__ import annotations

from pathlib import Path

from doc_blocks import ROOT, bash_blocks, run_block, shell_env

GUIDE = ROOT / "docs" / "getting-started.md"


def test_the_guide_runs_from_jsonl_to_an_exported_model(private_s3_server, tmp_path: Path) -> None:
    blocks = bash_blocks(GUIDE.read_text())
    skipped = [b for b in blocks if b.skipped]
    assert len(skipped) == 1 and "s3server.py" in skipped[0].code  # only the server start is not run
    private_s3_server.create_bucket("tessera")
    env = shell_env(private_s3_server.env(), tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    outputs = [run_block(block, work, env, "docs/getting-started.md") for block in blocks if not block.skipped]
    text = "\n".join(outputs)
    assert "ok: 1 shards" in text                               # verify
    assert "ep0-ba60/manifest.json" in text and "latest" in text  # checkpoints in the bucket
    assert "perplexity" in text and "exported" in text
    assert (work / "tokenizer.json").exists()
