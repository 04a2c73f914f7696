"""The README's command block, run as written against a local SeaweedFS holding the bucket `s3://tessera`
(what `python tests/s3server.py`, the server docs/getting-started.md starts, creates).

One change, and only to the duration: the mpt-125m run is shrunk (1 layer, 2 batches of 2, fp32) by
overrides appended to the README's command, so the test checks every path and key the README gives,
not the 125M-parameter GPU run itself."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
from doc_blocks import ROOT, bash_blocks, run_block, shell_env

README = ROOT / "README.md"
MARKER = "<!-- docs-test: tests/docs/test_readme.py"
TRAIN = ("tessera train mpt-125m.yaml data.train.streams.0.remote=s3://tessera/tokens "
         "data.eval.streams.0.remote=s3://tessera/tokens \\\n    "
         "save_folder=s3://tessera/runs/{run_name}/checkpoints optimizer.lr=3e-4")
SHRINK = ("model.n_layers=1 model.d_model=64 model.n_heads=2 model.vocab_size=8192 precision=fp32 "
          "global_train_batch_size=2 device_train_microbatch_size=2 max_duration=2ba eval_interval=2ba "
          "save_interval=2ba data.eval.max_batches=1 data.train.num_workers=0")


def readme_block():
    text = README.read_text()
    assert MARKER in text, "the README lost the marker of its tested command block"
    after = text.index(MARKER)
    (block, *_) = [b for b in bash_blocks(text) if text.index(b.code) > after]
    return block


def test_the_readme_commands_block_runs_as_written(private_s3_server, tmp_path: Path) -> None:
    block = readme_block()
    assert TRAIN in block.code  # the command the shrink is appended to is the README's, verbatim
    _, _, tail = block.code.partition(TRAIN)
    shrunk = block.code.replace(TRAIN + tail.split("\n", 1)[0], TRAIN + " " + SHRINK + tail.split("\n", 1)[0])
    private_s3_server.create_bucket("tessera")

    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "notes.txt").write_text("any files\n")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    shutil.copytree(stdlib / "email", work / "texts", ignore=shutil.ignore_patterns("__pycache__"))
    with (work / "corpus.jsonl").open("w") as out:
        for path in sorted((work / "texts").glob("*.py")):
            out.write(json.dumps({"text": path.read_text()}) + "\n")

    env = shell_env(private_s3_server.env(), tmp_path)
    output = run_block(type(block)(shrunk, block.line, False), work, env, "README.md")
    assert "ok:" in output  # data verify
    listing = run_block(type(block)("tessera storage ls s3://tessera/runs\n", 0, False), work, env, "check")
    assert "mpt-125m/checkpoints/latest" in listing, listing


@pytest.mark.parametrize("name", ["mpt-125m.yaml", "tiny-cpu.yaml"])
def test_the_recipes_the_readme_names_exist(name: str) -> None:
    assert (ROOT / "src" / "tessera" / "llm" / "recipes" / name).exists()
