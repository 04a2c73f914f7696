"""An LLM Foundry train YAML (resolved, resolve.py) as a Tessera recipe tree, key by key.

Every top-level key of Foundry's `TrainConfig` is handled here: mapped onto the recipe key that does the
same (llm/recipe.py validates the result, the single source of validation), accepted because it only
tunes what Tessera decides itself (allocator settings, timeouts, how metadata is logged), or refused in
one line naming it. A key Foundry does not know is refused too, as Foundry refuses it ("Unused
parameters"). Foundry's defaults travel with the translation where Tessera's recipe defaults differ
(precision amp_bf16, microbatch auto, no gradient clipping, save every 1000ba, autoresume when a
run_name and save_folder are set).
"""

from __future__ import annotations

import os
from typing import Any

from tessera.llm.foundry import data, training
from tessera.llm.foundry.errors import refuse, section, warn
from tessera.llm.foundry.hf import hf_model
from tessera.llm.foundry.mpt import mpt_model
from tessera.llm.foundry.paths import model_path, tokenizer_file

# Keys that change nothing Tessera does (its own allocator, timeouts, logging of the config, metadata).
_ACCEPTED = {"variables", "dist_timeout", "expandable_segments", "max_split_size_mb", "cuda_load_lazy",
             "spin_dataloaders", "accumulate_train_batch_on_tokens", "metadata", "flatten_metadata",
             "python_log_level", "log_config", "save_filename", "save_latest_filename", "only_hf_checkpoint",
             "only_composer_checkpoint", "save_overwrite", "n_gpus", "device_train_batch_size",
             "device_train_grad_accum", "compile_config"}
_HANDLED = {"model", "tokenizer", "optimizer", "scheduler", "train_loader", "eval_loader", "eval_loaders",
            "max_duration", "max_seq_len", "seed", "precision", "code_paths", "fsdp_config", "tp_config",
            "eval_interval", "icl_tasks", "eval_gauntlet", "icl_subset_num_batches", "icl_seq_len", "loggers",
            "progress_bar", "log_to_console", "console_log_interval", "callbacks", "algorithms", "save_folder",
            "save_weights_only", "save_interval", "save_num_checkpoints_to_keep", "load_path", "load_weights_only",
            "load_strict_model_weights", "load_ignore_keys", "save_ignore_keys", "train_subset_num_batches",
            "device_train_microbatch_size", "global_train_batch_size", "eval_subset_num_batches", "eval_first",
            "run_name", "autoresume", "profiler", "device_eval_batch_size"}
KNOWN_KEYS = _HANDLED | _ACCEPTED | {"icl_max_seq_len"}  # icl_max_seq_len: older Foundry's icl_seq_len
_PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")


def recipe_tree(cfg: dict[str, Any]) -> dict[str, Any]:
    """The Tessera recipe (a plain tree, not yet validated) of a resolved Foundry train YAML."""
    for key in cfg:
        if key not in KNOWN_KEYS:
            raise refuse(key, "not a key of LLM Foundry's train YAML (Foundry refuses it too: put values you "
                              "interpolate under `variables`)")
    _not_set(cfg)
    seq_len = _required(cfg, "max_seq_len")
    model = section(cfg.get("model"), "model")
    out: dict[str, Any] = {"seed": cfg.get("seed", 17)}
    if cfg.get("run_name"):
        out["run_name"] = cfg["run_name"]
    out.update(_model(model, seq_len))
    out["tokenizer"] = _tokenizer(cfg.get("tokenizer"), model.get("name"))
    out["data"] = _data(cfg, seq_len)
    out["optimizer"] = training.optimizer(_required(cfg, "optimizer"))
    out["scheduler"] = training.scheduler(_required(cfg, "scheduler"))
    out.update(training.algorithms(cfg.get("algorithms"), model.get("name")))
    out.update(_batches_and_time(cfg, evaluates="eval" in out["data"] or bool(cfg.get("icl_tasks"))))
    out.update(_checkpoints(cfg, training.callbacks(cfg.get("callbacks"))))
    out["loggers"] = training.loggers(cfg.get("loggers"), cfg.get("log_to_console", True) or cfg.get("progress_bar"))
    out["log_interval"] = _time(cfg.get("console_log_interval", "1ba"))
    if (parallelism := training.parallelism(cfg.get("fsdp_config"), out["precision"])) is not None:
        out["parallelism"] = parallelism
    out.update(_icl(cfg))
    return out


def _required(cfg: dict[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise refuse(key, "must be set (LLM Foundry requires it too)")
    return cfg[key]


def _not_set(cfg: dict[str, Any]) -> None:
    """Keys Tessera has no counterpart for, accepted only at Foundry's default (what they leave unchanged)."""
    for key, default, why in (
            ("code_paths", None, "Tessera does not import your code"),
            ("tp_config", None, "Foundry's tensor parallelism plans are not read; Tessera's GPT has "
                                "parallelism.tensor_parallel.degree"),
            ("profiler", None, "the torch profiler is not run by Tessera"),
            ("save_weights_only", False, "Tessera's checkpoints always hold the training state"),
            ("load_strict_model_weights", True, "checkpoints load strictly"),
            ("load_ignore_keys", None, "checkpoints load whole"), ("save_ignore_keys", None, "checkpoints save whole"),
            ("train_subset_num_batches", -1, "an epoch is the whole dataset")):
        if cfg.get(key, default) not in (default, None, []):
            raise refuse(key, f"not supported: {why}", cfg[key])


def _model(model: dict[str, Any], seq_len: Any) -> dict[str, Any]:
    name = model.get("name")
    if name == "mpt_causal_lm":
        return {"model": mpt_model(model, seq_len)}
    if name == "hf_causal_lm":
        spec, lora = hf_model(model, seq_len)
        return {"model": spec, **({"lora": lora} if lora else {})}
    if name == "hf_t5":
        raise refuse("model.name", "an encoder-decoder model: Tessera trains decoder-only causal language models",
                     name)
    raise refuse("model.name", "not a model Tessera trains (mpt_causal_lm, hf_causal_lm)", name)


def _tokenizer(spec: Any, model_name: str | None) -> str:
    spec = section(spec, "tokenizer")
    name = _required({"tokenizer.name": spec.get("name")}, "tokenizer.name")
    if name == "tiktoken":
        raise refuse("tokenizer.name", "Tessera reads tokenizers from a transformers tokenizer folder", name)
    kwargs = section(spec.get("kwargs"), "tokenizer.kwargs")
    for key in kwargs:
        if key not in ("model_max_length", "trust_remote_code"):  # the length is max_seq_len's; no code is run
            raise refuse(f"tokenizer.kwargs.{key}", "not supported (Tessera loads the tokenizer as saved)")
    folder = model_path(name, "tokenizer.name")
    return tokenizer_file(folder, "tokenizer.name") if model_name == "mpt_causal_lm" else folder


def _data(cfg: dict[str, Any], seq_len: Any) -> dict[str, Any]:
    out = {"train": data.loader(_required(cfg, "train_loader"), "train_loader", seq_len)}
    evals = cfg.get("eval_loader", cfg.get("eval_loaders"))
    key = "eval_loader" if "eval_loader" in cfg else "eval_loaders"
    if isinstance(evals, list):
        if len(evals) > 1:
            raise refuse(key, "several eval loaders: Tessera evaluates one (mix them into one dataset)")
        evals = evals[0] if evals else None
    if evals is not None:
        spec = data.loader(evals, key, seq_len)
        if cfg.get("device_eval_batch_size") is not None:
            spec["batch_size"] = cfg["device_eval_batch_size"]
        if cfg.get("eval_subset_num_batches", -1) not in (-1, None):
            spec["max_batches"] = cfg["eval_subset_num_batches"]
        out["eval"] = spec
    return out


def _time(value: Any) -> Any:
    """An integer is epochs, as Composer reads max_duration, eval_interval and save_interval."""
    return f"{value}ep" if isinstance(value, int) and not isinstance(value, bool) else value


def _batches_and_time(cfg: dict[str, Any], evaluates: bool) -> dict[str, Any]:
    precision = cfg.get("precision", "amp_bf16")
    if precision not in _PRECISIONS:
        raise refuse("precision", f"not one of {', '.join(_PRECISIONS)}", precision)
    microbatch = cfg.get("device_train_microbatch_size", "auto")
    if isinstance(microbatch, float):
        raise refuse("device_train_microbatch_size", "a fraction of a sample is not supported", microbatch)
    out = {"precision": precision, "global_train_batch_size": _required(cfg, "global_train_batch_size"),
           "device_train_microbatch_size": microbatch, "max_duration": _time(_required(cfg, "max_duration"))}
    if evaluates:
        out["eval_interval"] = _time(cfg.get("eval_interval", 1))
    if cfg.get("eval_first"):
        warn("eval_first: true: Tessera evaluates at eval_interval and at the end, not before the first batch")
    return out


def _checkpoints(cfg: dict[str, Any], implied: dict[str, Any]) -> dict[str, Any]:
    """Saving, loading and autoresume, with Foundry's defaults (save every 1000ba, keep all; autoresume
    on when a run_name and save_folder are set and save_overwrite is not)."""
    save_folder, interval = cfg.get("save_folder"), cfg.get("save_interval", "1000ba")
    hf = implied.get("hf_checkpointer")
    if save_folder is None and hf and hf.get("save_folder"):
        save_folder, interval = hf["save_folder"], hf.get("save_interval", interval)
    out: dict[str, Any] = {}
    if save_folder is not None:
        out.update(save_folder=save_folder, save_interval=_time(interval))
        keep = cfg.get("save_num_checkpoints_to_keep", -1)
        if keep == 0:
            raise refuse("save_num_checkpoints_to_keep", "0 (keep none on disk) is not supported; keep at least 1",
                         keep)
        out["save_num_checkpoints_to_keep"] = None if keep in (-1, None) else keep
    for key in ("load_path", "load_weights_only"):
        if cfg.get(key) is not None:
            out[key] = cfg[key]
    named = cfg.get("run_name") or os.environ.get("RUN_NAME")
    default = bool(named and save_folder is not None and not cfg.get("save_overwrite"))
    out["autoresume"] = bool(cfg.get("autoresume", default) and save_folder is not None)
    if cfg.get("autoresume") and save_folder is None:
        raise refuse("autoresume", "needs save_folder (where the run's checkpoints are)", True)
    return out


def _icl(cfg: dict[str, Any]) -> dict[str, Any]:
    """icl_tasks (inline or a YAML file) and eval_gauntlet, with icl_seq_len as each task's default length."""
    from tessera.llm.icl.config import read_section

    out: dict[str, Any] = {}
    if cfg.get("icl_tasks"):
        try:
            tasks = read_section(cfg["icl_tasks"], "icl_tasks")
        except ValueError as exc:
            raise refuse("icl_tasks", str(exc)) from None
        length = cfg.get("icl_seq_len", cfg.get("icl_max_seq_len"))
        if isinstance(tasks, list):
            tasks = [_icl_task(task, i, length) for i, task in enumerate(tasks)]
        out["icl_tasks"] = tasks
    for key in ("eval_gauntlet", "icl_subset_num_batches"):
        if cfg.get(key) is not None:
            out[key] = cfg[key]
    return out


# The metric Foundry scores each task type with; Tessera scores the same accuracy per type.
_ICL_METRICS = {"language_modeling": "InContextLearningLMAccuracy",
                "multiple_choice": "InContextLearningMultipleChoiceAccuracy",
                "schema": "InContextLearningMultipleChoiceAccuracy",
                "generation_task_with_answers": "InContextLearningGenerationExactMatchAccuracy",
                "question_answering": "InContextLearningGenerationExactMatchAccuracy"}


def _icl_task(task: Any, index: int, length: Any) -> Any:
    """One task with icl_seq_len as its default length; Foundry's metric_names accepted when they name
    the metric Tessera computes for the task type; an empty dataset_uri (a template's) named."""
    if not isinstance(task, dict):
        return task
    key = f"icl_tasks.{index}"
    if not task.get("dataset_uri"):
        raise refuse(f"{key}.dataset_uri", "must be set (the YAML leaves it empty); give the task's JSONL path "
                                           "(icl_tasks=[...] sets the list on the command line)")
    task = dict(task)
    metrics = task.pop("metric_names", None)
    wanted = _ICL_METRICS.get(task.get("icl_task_type"))
    if metrics is not None and list(metrics) != [wanted]:
        raise refuse(f"{key}.metric_names", f"Tessera scores a {task.get('icl_task_type')} task with {wanted} only",
                     ", ".join(map(str, metrics)))
    return {"max_seq_len": length, **task} if length is not None else task
