"""`make demo-finetune`: the GPT that `make demo` pre-trained learns an instruction task with LoRA.

1. the base: `make demo`'s checkpoint (the quickstart runs first if demo-out/ has none), exported with
   `tessera llm export` as a model folder
2. the task, from the same local corpus: Python function signature -> the first line of its docstring,
   pairs extracted with `ast` from the standard library; training pairs from the packages the model was
   pre-trained on, held-out pairs from modules it never saw; `{"prompt", "response"}` JSONL
3. before: the held-out loss on the responses and greedy generations for a few held-out prompts
4. tessera train finetune-lora-tiny.yaml model.pretrained=./base data.train.path=train.jsonl ...
5. after: the same loss and generations, from the LoRA checkpoint (adapters merged on load)

Everything lands in demo-out/finetune/. Deterministic: the pairs are sorted, the split is by module, the
run has a fixed seed and generation is greedy.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "demo-out"
OUT = DEMO / "finetune"
TESSERA = str(Path(sys.executable).with_name("tessera"))
PRETRAINED = DEMO / "bucket" / "runs" / "tiny-cpu" / "checkpoints"
TRAIN_PACKAGES = ["json", "email", "http", "logging", "concurrent", "importlib", "collections", "asyncio", "xml",
                  "urllib", "unittest"]  # the quickstart's corpus
HELD_OUT = ["argparse", "difflib", "textwrap", "shutil", "tarfile", "calendar", "configparser", "pathlib",
            "inspect", "tempfile", "pprint", "string", "fractions", "statistics"]  # not in that corpus
STEPS = 150
SHOWN = 4  # held-out prompts generated before and after


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def run(cmd: list[str], cwd: Path) -> None:
    print("$ " + " ".join(c if " " not in c else repr(c) for c in cmd).replace(TESSERA, "tessera"), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def sources(names: list[str]) -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for name in names:
        if (stdlib / name).is_dir():
            files += sorted((stdlib / name).rglob("*.py"))
        elif (stdlib / f"{name}.py").is_file():
            files.append(stdlib / f"{name}.py")
    return files


def pairs(files: list[Path]) -> list[dict[str, str]]:
    """{"prompt": 'def name(args):\\n    \"\"\"', "response": 'First docstring line.\"\"\"'} of every public
    function with a one-line summary of 12-90 characters; sorted, duplicates dropped."""
    found = set()
    for file in files:
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            summary = doc.strip().split("\n")[0].strip() if doc else ""
            if not 12 <= len(summary) <= 90:
                continue
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            signature = f"def {node.name}({ast.unparse(node.args)}){returns}:"
            if len(signature) <= 100:
                found.add((f'{signature}\n    """', f'{summary}"""'))
    return [{"prompt": p, "response": r} for p, r in sorted(found)]


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def response_loss(model: torch.nn.Module, tok, rows: list[dict[str, str]]) -> float:
    """Mean next-token loss on the responses and their EOS, the prompt as context (as training scores)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            prompt, response = tok.encode(row["prompt"]), tok.encode(row["response"]) + [tok.eos_id]
            ids = torch.tensor([prompt + response])
            logits = model(ids[:, :-1])[0, len(prompt) - 1:]
            total += torch.nn.functional.cross_entropy(logits.float(), ids[0, len(prompt):], reduction="sum").item()
            count += len(response)
    return total / count


def completions(model: torch.nn.Module, tok, rows: list[dict[str, str]]) -> list[str]:
    from tessera.llm.generate import generate

    out = []
    for row in rows:
        new = generate(model, tok.encode(row["prompt"]), 32, greedy=True, eos_id=tok.eos_id)
        text = tok.decode([t for t in new if t != tok.eos_id])
        out.append(text.replace("\n", "\\n")[:80])  # a line break shown as \n
    return out


def main() -> None:
    from tessera.llm.export import load_model
    from tessera.llm.hf.export import load_checkpoint_model

    t_start = time.time()
    if not (PRETRAINED / "latest").exists():
        say("0. no pre-trained model in demo-out/ yet: running `make demo`'s quickstart first")
        subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], check=True)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    say("1. the base model: the quickstart's GPT, exported as a model folder")
    run([TESSERA, "llm", "export", "./bucket/runs/tiny-cpu/checkpoints", "./finetune/base"], DEMO)

    say("2. an instruction task from the corpus: function signature -> the first line of its docstring")
    train, held_out = pairs(sources(TRAIN_PACKAGES)), pairs(sources(HELD_OUT))
    write_jsonl(OUT / "train.jsonl", train)
    write_jsonl(OUT / "heldout.jsonl", held_out)
    print(f"{len(train)} training pairs (the pre-training packages), {len(held_out)} held-out pairs "
          f"({', '.join(HELD_OUT[:5])}, ...: modules the model never saw); one of them:")
    print(json.dumps(train[len(train) // 2]))
    shown = held_out[:: max(len(held_out) // SHOWN, 1)][:SHOWN]

    say("3. before fine-tuning: held-out loss and greedy generations")
    base, tok = load_model(OUT / "base")
    base.eval()
    loss_before = response_loss(base, tok, held_out)
    before = completions(base, tok, shown)
    print(f"held-out loss on the responses: {loss_before:.3f}")

    say(f"4. LoRA fine-tuning, {STEPS} batches (the base frozen; checkpoints hold only the adapters)")
    ckpt = "./runs/docstrings/checkpoints"
    # model.pretrained is stored in the checkpoints and read again on export: an absolute path keeps it valid
    run([TESSERA, "train", "finetune-lora-tiny.yaml", f"model.pretrained={OUT / 'base'}", "data.train.path=train.jsonl",
         "data.train.format=instruction", "run_name=docstrings", f"save_folder={ckpt}", f"max_duration={STEPS}ba",
         "optimizer.lr=5e-3", "save_interval=75ba", "log_interval=25ba", "log_dir=./logs/{run_name}"], OUT)

    say("5. after: the same held-out loss and prompts")
    tuned, _ = load_checkpoint_model(OUT / ckpt)
    loss_after = response_loss(tuned, tok, held_out)
    after = completions(tuned, tok, shown)
    for row, b, a in zip(shown, before, after, strict=True):
        print(f"\n{row['prompt']}\n  reference  {row['response']}\n  before     {b}\n  after      {a}")
    first = shown[0]["prompt"]
    run([TESSERA, "llm", "generate", ckpt, "--prompt", first, "--greedy", "--max-new-tokens", "32"], OUT)
    print(f"""
  pairs       {OUT}/train.jsonl ({len(train)}), {OUT}/heldout.jsonl ({len(held_out)})
  base        {OUT}/base (fingerprinted in the run: resume and export refuse it if it changes)
  checkpoints {OUT}/runs/docstrings/checkpoints (LoRA adapters only)
  held-out    loss on the responses {loss_before:.3f} before -> {loss_after:.3f} after
  export      tessera llm export {OUT}/runs/docstrings/checkpoints OUT   (adapters merged into the GPT)
  total time  {time.time() - t_start:.0f} s""")


if __name__ == "__main__":
    main()
