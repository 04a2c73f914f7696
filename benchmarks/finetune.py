"""LoRA fine-tuning: Tessera's Trainer against a plain transformers + peft loop, and packing against
padding, on this CPU.

    .venv/bin/python benchmarks/finetune.py [--rounds 3] [--warmup 3] [--steps 15] [--threads 1]

1. Step time. A tiny Llama (d_model 256, 4 layers, 4 heads, MLP 688, vocab 8192: ~6M parameters) saved
   with transformers, LoRA rank 8 on every linear projection (peft's "all-linear", alpha 16, no dropout),
   AdamW (lr 1e-3), gradient clipping at 1.0, fp32, batches of 8 x 257 random tokens (256 trained
   positions), the same batches on both sides:

       tessera   `tessera.train.Trainer` on `HFCausalLM` + `add_lora` (what `tessera train
                 finetune-lora-tiny.yaml` builds), logging every 5 batches to a JSONL file, no checkpoints
       plain     the loop a user writes: `peft.get_peft_model`, logits of tokens[:, :-1], cross-entropy
                 against tokens[:, 1:], backward, clip_grad_norm_, step, zero_grad

   Both start from the same weights (the saved folder; the adapters drawn after the same seed): the loss
   at the Trainer's first logged step is printed for both and must agree. Each round runs both (the order
   alternates), `--warmup` steps then `--steps` timed ones; a step's time is the wall time between the
   ends of consecutive steps. Reported: median step time over every timed step of every round, and Tessera's overhead in %.

2. Packing vs padding. 2,000 chat examples of variable length (a user turn of 2-20 words, a reply of
   1-15 words: about 40-250 byte tokens with ChatML's markers, the byte tokenizer) prepared as `tessera
   train` prepares `data.train.path` (packed rows, or one example per padded row, of 256), then the same
   model and LoRA in the Trainer: padding share of the rows (prep's summary), median step time, and per second the
   examples and the real (non-padding) tokens trained.

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tessera.llm.hf.adapter import HFCausalLM
from tessera.llm.hf.config import LoraSpec
from tessera.llm.hf.load import load_hf_model
from tessera.llm.hf.lora import add_lora
from tessera.train import Callback, Trainer

VOCAB, SEQ, BATCH, LR = 8192, 256, 8, 1e-3
LORA = LoraSpec(rank=8, alpha=16, dropout=0.0)
WORDS = ("the a of to in is for on and that this with from by as at be it an or are was were not have has "
         "data model token value index list dict set tuple string number file read write open close parse "
         "return yield class function method module package import error raise test check").split()


def save_base(folder: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=256, pad_token_id=None)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def tessera_model(base: Path) -> HFCausalLM:
    model = HFCausalLM(load_hf_model(base), SEQ)
    torch.manual_seed(1)  # the adapters' initial values
    return add_lora(model, LORA)


def plain_model(base: Path) -> Any:
    import peft

    hf = load_hf_model(base)
    torch.manual_seed(1)
    return peft.get_peft_model(hf, LORA.peft_config(hf=True))


class StepClock(Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []
        self.first_log: tuple[int, float] | None = None  # (step, loss) of the first logged loss

    def on_batch_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        self.ends.append(time.perf_counter())
        if self.first_log is None and "train/loss" in metrics:
            self.first_log = (trainer.timestamp.batch, metrics["train/loss"])


def run_trainer(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]], steps: int, threads: int,
                log_dir: Path) -> tuple[list[float], tuple[int, float] | None]:
    """Step times of `steps` batches through the Trainer (and the first logged step and loss)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    clock = StepClock()
    trainer = Trainer(model, opt, train_dataloader=batches, max_duration=f"{steps}ba", log_interval="5ba",
                      loggers=["jsonl"], log_dir=str(log_dir), grad_clip_norm=1.0, precision="fp32",
                      device="cpu", eval_interval="100000ba", callbacks=[clock])
    torch.set_num_threads(threads)  # the Trainer drops to one thread under load; both sides get the same
    start = time.perf_counter()
    trainer.fit()
    trainer.close()
    return [b - a for a, b in zip([start, *clock.ends], clock.ends, strict=False)], clock.first_log


def run_plain(model: Any, batches: list[dict[str, torch.Tensor]], steps: int, threads: int,
              ) -> tuple[list[float], list[float]]:
    """Step times and the losses of every step (read after the timed part of each step)."""
    torch.set_num_threads(threads)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    model.train()
    ends, losses = [], []
    start = time.perf_counter()
    for i in range(steps):
        tokens = batches[i % len(batches)]["tokens"]
        logits = model(input_ids=tokens[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
        losses.append(loss.detach())
    return [b - a for a, b in zip([start, *ends], ends, strict=False)], [float(x) for x in losses]


def step_time(args: argparse.Namespace, base: Path, work: Path) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(2)
    total = args.warmup + args.steps
    batches = [{"tokens": torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)} for _ in range(total)]
    times: dict[str, list[float]] = {"tessera": [], "plain": []}
    logged, plain_losses = None, []
    for r in range(args.rounds):
        for side in (("tessera", "plain") if r % 2 == 0 else ("plain", "tessera")):
            if side == "tessera":
                steps, logged = run_trainer(tessera_model(base), batches, total, args.threads, work / f"logs{r}")
            else:
                steps, plain_losses = run_plain(plain_model(base), batches, total, args.threads)
            times[side] += steps[args.warmup:]
            print(f"  round {r + 1} {side:8s} median {statistics.median(steps[args.warmup:]) * 1e3:7.1f} ms/step",
                  flush=True)
    med = {side: statistics.median(values) for side, values in times.items()}
    return {"tessera_ms": med["tessera"] * 1e3, "plain_ms": med["plain"] * 1e3,
            "tessera_mean_ms": statistics.fmean(times["tessera"]) * 1e3,
            "plain_mean_ms": statistics.fmean(times["plain"]) * 1e3,
            "overhead_pct": (med["tessera"] / med["plain"] - 1) * 100,
            "loss_step": logged[0], "loss_tessera": logged[1], "loss_plain": plain_losses[logged[0] - 1],
            "timed_steps_per_side": len(times["tessera"])}


def chat_jsonl(path: Path, n: int) -> None:
    rng = random.Random(3)
    with open(path, "w") as f:
        for _ in range(n):
            user = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 20)))
            reply = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 15)))
            f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                             {"role": "assistant", "content": reply}]}) + "\n")


def packing(args: argparse.Namespace, base: Path, work: Path) -> dict[str, Any]:
    from tessera.llm.recipe import LoaderSpec
    from tessera.llm.tokenizer import load_tokenizer
    from tessera.llm.train_run import build_loader

    data = work / "chat.jsonl"
    chat_jsonl(data, 2000)
    out = {}
    for pack in (True, False):
        spec = LoaderSpec(path=str(data), format="chat", pack=pack, shuffle=False, prep_cache=str(work / "prep"))
        loader = build_loader(spec, BATCH, SEQ, load_tokenizer("byte"))
        summary = loader.prep_summary
        total = args.warmup + args.steps
        batches = []
        for batch in loader:
            batches.append(batch)
            if len(batches) == total:
                break
        steps, _ = run_trainer(tessera_model(base), batches, total, args.threads, work / f"logs-pack{pack}")
        step = statistics.median(steps[args.warmup:])
        rows = sum(summary["rows"].values())
        real = (1 - summary["padding_share"]) * BATCH * SEQ
        out["packed" if pack else "padded"] = {
            "rows": rows, "examples": summary["examples"], "padding_share": summary["padding_share"],
            "step_ms": step * 1e3, "real_tokens_per_s": real / step,
            "examples_per_s": summary["examples"] / rows * BATCH / step}
        print(f"  {'packed' if pack else 'padded'}: {rows} rows, median {step * 1e3:.1f} ms/step", flush=True)
    out["packed_speedup_examples"] = out["packed"]["examples_per_s"] / out["padded"]["examples_per_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides (2 threads on "
                        "cores that other jobs share run up to 10x slower, and unevenly)")
    args = parser.parse_args()
    import transformers

    with tempfile.TemporaryDirectory(prefix="tessera-bench-finetune-") as tmp:
        work = Path(tmp)
        base = save_base(work / "base")
        print("1. LoRA step time, Tessera's Trainer vs a plain transformers + peft loop", flush=True)
        steps = step_time(args, base, work)
        print("2. packing vs padding (Tessera's Trainer, the same chat examples)", flush=True)
        packed = packing(args, base, work)
    print(f"""
| LoRA step (d256, 4 layers, 8 x 256) | median ms/step | mean ms/step |
|---|---|---|
| Tessera Trainer | {steps['tessera_ms']:.1f} | {steps['tessera_mean_ms']:.1f} |
| transformers + peft loop | {steps['plain_ms']:.1f} | {steps['plain_mean_ms']:.1f} |
| Tessera's overhead | {steps['overhead_pct']:+.1f}% | |

loss after {steps['loss_step']} steps: Tessera {steps['loss_tessera']:.6f}, plain {steps['loss_plain']:.6f}

| rows of 256 | rows | padding | ms/step | examples/s | real tokens/s |
|---|---|---|---|---|---|""")
    for name in ("packed", "padded"):
        p = packed[name]
        print(f"| {name} | {p['rows']} | {p['padding_share']:.1%} | {p['step_ms']:.1f} | {p['examples_per_s']:.1f} | "
              f"{p['real_tokens_per_s']:,.0f} |")
    print(f"\npacking trains {packed['packed_speedup_examples']:.2f}x the examples per second")
    print(json.dumps({"step_time": steps, "packing": packed, "threads": args.threads, "rounds": args.rounds,
                      "torch": torch.__version__, "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
