"""ICL end to end with real models: Tessera's GPT and a tiny random transformers Llama, in one process
and on 2 gloo ranks, from `tessera llm eval --icl-tasks` and during `tessera train`."""

from __future__ import annotations

import gc
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import yaml
from llm_helpers import small_model
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.icl import ICLSection, evaluate_icl, prepare_tasks
from tessera.llm.tokenizer import ByteTokenizer

runner = CliRunner()
TASKS = [{"label": kind, "dataset_uri": f"tiny_{kind}", "icl_task_type": t, "num_fewshot": [0, 1]}
         for kind, t in (("lm", "language_modeling"), ("mc", "multiple_choice"), ("schema", "schema"),
                         ("qa", "question_answering"))]


def section(batch_size: int = 4, shots: list[int] | None = None, **extra) -> ICLSection:
    tasks = [{**t, "batch_size": batch_size, **({"num_fewshot": shots} if shots else {})} for t in TASKS]
    return ICLSection.model_validate({"icl_tasks": tasks, **extra})


def check_metrics(metrics: dict[str, float], shots: tuple[int, ...] = (0, 1)) -> None:
    keys = {f"icl/{t['label']}/{n}-shot" for t in TASKS for n in shots}
    assert keys | {"icl/average"} == set(metrics)
    assert all(0.0 <= metrics[k] <= 1.0 for k in keys)


def test_tiny_gpt_scores_the_same_in_any_batch_size():
    """Padding never changes a score: rows are right-padded in a causal model."""
    model, tok = small_model(max_seq_len=128), ByteTokenizer()
    runs = [evaluate_icl(prepare_tasks(section(bs).icl_tasks, tok, 128), model, tok) for bs in (1, 5)]
    check_metrics(runs[0])
    assert runs[0] == runs[1]


def test_a_tiny_gpt_that_memorised_the_answers_picks_them():
    """Trained on each multiple-choice query followed by its gold choice (loss on the choice only), the
    model's scores pick the gold choices it did not pick untrained."""
    tok = ByteTokenizer()
    task = prepare_tasks(ICLSection.model_validate({"icl_tasks": [{**TASKS[1], "num_fewshot": [0]}]}).icl_tasks,
                         tok, 64)[0]
    rows = [(p.contexts[p.gold], p.continuations[p.gold]) for p in task.prompts]
    width = max(len(c) + len(k) for c, k in rows)
    tokens, labels = torch.full((len(rows), width), tok.eos_id), torch.full((len(rows), width), -100)
    for i, (context, choice) in enumerate(rows):
        tokens[i, :len(context) + len(choice)] = torch.tensor(context + choice)
        labels[i, len(context):len(context) + len(choice)] = torch.tensor(choice)
    model = small_model(max_seq_len=64).train()
    before = evaluate_icl([task], model, tok)["icl/mc/0-shot"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = model({"tokens": tokens, "labels": labels})
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert before < 0.5 and evaluate_icl([task], model, tok)["icl/mc/0-shot"] >= 0.95


def test_tiny_hf_llama_scores_through_the_adapter_and_bare(tmp_path):
    pytest.importorskip("transformers")
    from hf_fixtures import tiny_llama

    from tessera.llm.hf.adapter import HFCausalLM
    from tessera.llm.hf.load import load_hf_model, load_hf_tokenizer

    folder = tiny_llama(tmp_path / "llama")
    bare, tok = load_hf_model(folder).eval(), load_hf_tokenizer(folder)
    tasks = prepare_tasks(section(3, shots=[1]).icl_tasks, tok, 256)
    wrapped = evaluate_icl(tasks, HFCausalLM(bare), tok)
    check_metrics(wrapped, shots=(1,))
    assert evaluate_icl(tasks, bare, tok) == wrapped
    assert evaluate_icl(prepare_tasks(section(1, shots=[1]).icl_tasks, tok, 256), bare, tok) == wrapped


def join(rank: int, port: int) -> None:
    """This process as `rank` of a 2-process job on this machine (one torch thread: 2 shared cores)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)


def on_two_ranks(fn, out: Path) -> list:
    """Run fn(rank, port, out) in 2 processes; what each wrote to out/rank<r>.json."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(fn, args=(port, str(out)), nprocs=2)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _rank(rank: int, port: int, out: str) -> None:
    join(rank, port)
    from tessera.train.distributed import init_distributed

    env = init_distributed(torch.device("cpu"))
    model, tok = small_model(max_seq_len=128), ByteTokenizer()
    tasks = prepare_tasks(section(3, icl_subset_num_batches=None).icl_tasks, tok, 128)
    shared = evaluate_icl(tasks, model, tok, rank=env.rank, world_size=env.world_size)
    # as the two ranks of one tensor-parallel group: the same items on both, counted once
    replicated = evaluate_icl(tasks, model, tok, rank=0, world_size=1, replicas=2)
    Path(out, f"rank{rank}.json").write_text(json.dumps([shared, replicated]))
    torch.distributed.destroy_process_group()


def test_two_gloo_ranks_share_the_items_and_agree(tmp_path):
    a, b = on_two_ranks(_rank, tmp_path)
    model, tok = small_model(max_seq_len=128), ByteTokenizer()
    alone = evaluate_icl(prepare_tasks(section(3).icl_tasks, tok, 128), model, tok)
    assert a == b
    assert a[0] == pytest.approx(alone, abs=1e-12) and a[1] == pytest.approx(alone, abs=1e-12)


def write_tasks(path: Path, **extra) -> Path:
    path.write_text(yaml.safe_dump({"icl_tasks": TASKS, **extra}))
    return path


def test_cli_eval_icl_tasks_on_an_export_and_a_transformers_folder(tmp_path, monkeypatch):
    from tessera.llm.export import save_pretrained

    monkeypatch.chdir(tmp_path)
    tasks = write_tasks(tmp_path / "tasks.yaml", icl_subset_num_batches=2)
    save_pretrained(small_model(max_seq_len=128), tmp_path / "export", tokenizer=ByteTokenizer())
    res = runner.invoke(app, ["llm", "eval", str(tmp_path / "export"), "--icl-tasks", str(tasks), "--json"])
    assert res.exit_code == 0, res.output
    check_metrics(json.loads(res.stdout)["icl"])
    text = runner.invoke(app, ["llm", "eval", str(tmp_path / "export"), "--icl-tasks", str(tasks)])
    assert text.exit_code == 0 and "icl/mc/1-shot:" in text.stdout and "icl/average:" in text.stdout
    if pytest.importorskip("transformers"):
        from hf_fixtures import tiny_llama

        folder = tiny_llama(tmp_path / "llama")
        res = runner.invoke(app, ["llm", "eval", str(folder), "--hf", "--icl-tasks", str(tasks), "--json"])
        assert res.exit_code == 0, res.output
        check_metrics(json.loads(res.stdout)["icl"])


def test_cli_eval_bad_task_file_is_one_line_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"icl_tasks": [{**TASKS[0], "icl_task_type": "cloze"}]}))
    res = runner.invoke(app, ["llm", "eval", "unused", "--icl-tasks", str(bad)])
    assert res.exit_code == 1
    assert "icl_tasks.0.icl_task_type" in res.output and len(res.output.strip().splitlines()) == 1


TINY = ["model.d_model=32", "model.n_layers=1", "model.max_seq_len=32", "global_train_batch_size=4",
        "device_train_microbatch_size=4", "torch_threads=1", "log_interval=1ba", "loggers=[jsonl]",
        "data.eval.max_batches=1", "max_duration=6ba", "eval_interval=4ba", "save_folder=null", "autoresume=false"]


def train_args(prepped: Path, *extra: str) -> list[str]:
    return ["train", "tiny-cpu.yaml", *TINY, f"data.train.streams.0.remote={prepped}",
            f"data.eval.streams.0.remote={prepped}", *extra]


def test_tessera_train_logs_icl_metrics_at_eval_interval_and_at_the_end(tmp_path, prepped, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tasks = write_tasks(tmp_path / "tasks.yaml")
    gauntlet = ("eval_gauntlet={categories: [{name: choices, benchmarks: [{name: mc, num_fewshot: 0, "
                "random_baseline: 0.25}, {name: schema, num_fewshot: 0, random_baseline: 0.5}]}]}")
    res = runner.invoke(app, train_args(prepped, f"icl_tasks={tasks}", "icl_subset_num_batches=1", gauntlet,
                                        "loggers=[progress, jsonl]"))
    assert res.exit_code == 0, res.output
    assert "[icl] step 4 | lm/0-shot " in res.output and "[icl] step 6 |" in res.output
    rows = [json.loads(line) for line in (tmp_path / "logs" / "tiny-cpu" / "metrics.jsonl").read_text().splitlines()]
    icl = {row["step"]: row for row in rows if "icl/average" in row}
    assert sorted(icl) == [4, 6]
    for row in icl.values():
        assert {"icl/lm/0-shot", "icl/qa/1-shot", "icl/gauntlet/choices"} <= set(row)
        assert -1.0 <= row["icl/average"] <= 1.0


@pytest.mark.parametrize(("override", "code", "key"), [
    ("icl_tasks=[{label: x, dataset_uri: tiny_mc, icl_task_type: mc}]", 2, "icl_tasks.0.icl_task_type"),
    ("icl_tasks=[{label: x, dataset_uri: tiny_mc, icl_task_type: multiple_choice, num_fewshots: 1}]", 2,
     "icl_tasks.0.num_fewshot"),
    ("icl_tasks=[{label: x, dataset_uri: nowhere.jsonl, icl_task_type: schema}]", 1, "icl_tasks.0.dataset_uri"),
    ("icl_tasks=[{label: x, dataset_uri: tiny_mc, icl_task_type: schema}]", 1, "icl_tasks.0.dataset_uri"),
])
def test_bad_icl_task_config_is_one_line_naming_the_key(tmp_path, prepped, monkeypatch, override, code, key):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, train_args(prepped, override))
    assert res.exit_code == code, res.output
    assert key in res.output and len(res.output.strip().splitlines()) == 1, res.output


def _ddp_rank(rank: int, port: int, out: str) -> None:
    """A DDP Trainer with the ICL callback: both ranks must hold the same scores at the same batches."""
    join(rank, port)
    from tessera.llm.icl.callback import ICLEvaluator
    from tessera.train import Trainer

    model, tok = small_model(max_seq_len=64), ByteTokenizer()
    tokens = torch.randint(0, 256, (12, 2, 33), generator=torch.Generator().manual_seed(rank))
    icl = ICLEvaluator(prepare_tasks(section(4, shots=[1]).icl_tasks[:2], tok, 64), tok, "2ba", subset_num_batches=1)
    trainer = Trainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                      train_dataloader=[{"tokens": t} for t in tokens[:3]], callbacks=[icl], max_duration="3ba",
                      loggers=[], device="cpu", parallelism="ddp")
    trainer.fit()
    trainer.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps([(b, {k: v for k, v in m.items() if k != "icl/seconds"})
                                                        for b, m in icl.history]))
    # The DDP wrapper goes first: freed after destroy_process_group, its reducer would hold the last
    # reference to the gloo group and join gloo's thread while holding the GIL that thread waits for.
    del trainer, icl
    gc.collect()
    torch.distributed.destroy_process_group()


def test_the_callback_scores_alike_on_two_ddp_ranks(tmp_path):
    a, b = on_two_ranks(_ddp_rank, tmp_path)
    assert a == b and [batch for batch, _ in a] == [2, 3]
    assert {"icl/lm/1-shot", "icl/mc/1-shot", "icl/average"} <= set(a[0][1])
