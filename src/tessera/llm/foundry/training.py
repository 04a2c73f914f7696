"""LLM Foundry's optimizer, scheduler, algorithms, callbacks, loggers and fsdp_config as recipe keys.

Each Foundry name maps onto what Tessera's trainer does (train/config.py): `decoupled_adamw` is
Composer's DecoupledAdamW, the schedulers are Composer's with Composer's defaults (alpha_f 0), the
`gradient_clipping` algorithm is `grad_clip_norm`, and `fsdp_config` is the `parallelism.fsdp` section.
Callbacks whose metric Tessera logs at every log step anyway (speed, learning rate, memory, time left)
are accepted as they are; the rest, and any name Tessera does not know, is refused naming it.
"""

from __future__ import annotations

from typing import Any

from tessera.llm.foundry.errors import refuse, section, unknown, warn

# Each optimizer's defaults where Foundry leaves them (Composer's DecoupledAdamW, torch's AdamW, Foundry's
# DecoupledLionW), written out since Tessera's recipe defaults differ.
_OPTIMIZERS = {"decoupled_adamw": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 1e-5},
               "adamw": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2},
               "decoupled_lionw": {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.0}}
_SCHEDULERS = {"cosine_with_warmup": "cosine_with_warmup", "linear_decay_with_warmup": "linear_with_warmup",
               "constant_with_warmup": "constant_with_warmup"}
# Logged by Tessera at every log step (train/throughput.py, the lr of each optimizer, the progress line's ETA).
_LOGGED_ANYWAY = {"speed_monitor", "lr_monitor", "memory_monitor", "runtime_estimator", "system_metrics_monitor",
                  "optimizer_monitor", "env_logging", "scheduled_gc", "oom_observer", "nan_monitor"}
_FSDP_SHARDING = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "HYBRID_SHARD": "hybrid"}
# fsdp_config keys about how FSDP1 schedules its work or saves: FSDP2 (train/parallel/fsdp.py) decides these.
_FSDP_QUIET = {"limit_all_gathers", "sync_module_states", "use_orig_params", "state_dict_type", "backward_prefetch",
               "forward_prefetch", "verbose", "load_monolith_rank0_only", "activation_checkpointing_reentrant",
               "activation_checkpointing_fn", "save_planner", "load_planner", "auto_wrap", "device_mesh"}


def optimizer(spec: Any) -> dict[str, Any]:
    spec = dict(section(spec, "optimizer"))
    name = spec.pop("name", None)
    if name not in _OPTIMIZERS:
        raise refuse("optimizer.name", f"not implemented (Tessera has {', '.join(_OPTIMIZERS)})", name)
    unknown("optimizer", spec, {*_OPTIMIZERS[name], "amsgrad"} if name != "decoupled_lionw" else _OPTIMIZERS[name])
    if spec.pop("amsgrad", False):
        raise refuse("optimizer.amsgrad", "not implemented", True)
    return {"name": name, **_OPTIMIZERS[name], **spec}


def scheduler(spec: Any) -> dict[str, Any]:
    spec = dict(section(spec, "scheduler"))
    name = spec.pop("name", None)
    if name not in _SCHEDULERS:
        raise refuse("scheduler.name", f"not implemented (Tessera has {', '.join(_SCHEDULERS)})", name)
    unknown("scheduler", spec, {"t_warmup", "alpha_f", "t_max", "scale_warmup", "alpha_i", "alpha"})
    for key, default in (("t_max", "1dur"), ("scale_warmup", False), ("alpha_i", 1.0), ("alpha", 1.0)):
        if spec.get(key, default) != default:
            raise refuse(f"scheduler.{key}", f"only {default} (Composer's default) is implemented", spec[key])
    out = {"name": _SCHEDULERS[name], "t_warmup": spec.get("t_warmup", "0ba")}
    if name != "constant_with_warmup":
        out["alpha_f"] = spec.get("alpha_f", 0.0)  # Composer's default, where Tessera's recipe default is 0.1
    return out


def algorithms(spec: Any, model_name: str) -> dict[str, Any]:
    """`grad_clip_norm` (null without gradient_clipping, as Foundry does not clip then)."""
    spec = section(spec, "algorithms")
    out: dict[str, Any] = {"grad_clip_norm": None}
    for name, settings in spec.items():
        settings = section(settings, f"algorithms.{name}")
        if name == "gradient_clipping":
            unknown("algorithms.gradient_clipping", settings, {"clipping_type", "clipping_threshold"})
            if settings.get("clipping_type", "norm") != "norm":
                raise refuse("algorithms.gradient_clipping.clipping_type", "only norm clipping is implemented",
                             settings["clipping_type"])
            out["grad_clip_norm"] = float(settings.get("clipping_threshold", 1.0))
        elif name == "low_precision_layernorm":
            continue  # LayerNorm in the autocast dtype: Tessera's norms compute in float32 under autocast
        elif name == "alibi" and model_name == "mpt_causal_lm":
            raise refuse("algorithms.alibi", "set model.attn_config.alibi: true instead (Tessera's GPT has ALiBi "
                                             "built in; the algorithm rewrites Hugging Face models)")
        else:
            raise refuse(f"algorithms.{name}", "not implemented (Tessera has gradient_clipping and "
                                               "low_precision_layernorm)")
    return out


def callbacks(spec: Any) -> dict[str, Any]:
    """Recipe keys some callbacks imply (hf_checkpointer's folder and interval when there is no
    save_folder); the monitors need nothing, Tessera logs their metrics."""
    spec = section(spec, "callbacks")
    out: dict[str, Any] = {}
    for name, settings in spec.items():
        if name in _LOGGED_ANYWAY:
            continue
        if name != "hf_checkpointer":
            raise refuse(f"callbacks.{name}", "not implemented (Tessera logs speed, lr, memory and time left "
                                              "itself; other callbacks are not run)")
        settings = section(settings, "callbacks.hf_checkpointer")
        out["hf_checkpointer"] = {k: settings[k] for k in ("save_folder", "save_interval") if k in settings}
        warn("callbacks.hf_checkpointer: Tessera saves its own checkpoints; a Hugging Face folder is made from "
             "one with `tessera llm export SAVE_FOLDER OUT --format hf`")
    return out


def loggers(spec: Any, console: bool) -> list[Any]:
    """Foundry's loggers (wandb, mlflow, tensorboard...) as the recipe's, with the console's progress."""
    spec = section(spec, "loggers")
    out: list[Any] = ["progress"] if console else []
    for name, settings in spec.items():
        settings = section(settings, f"loggers.{name}")
        if name in ("inmemory", "mosaicml"):
            continue  # in-memory (tests) and MosaicML's platform: Tessera's platform reads the run's own logs
        if name == "wandb":
            unknown("loggers.wandb", settings, {"project", "entity", "name", "group", "tags", "log_artifacts",
                                                "rank_zero_only", "init_kwargs"})
            mapped = {"project": settings.get("project"), "entity": settings.get("entity"),
                      "run_name": settings.get("name"), "group": settings.get("group"),
                      "tags": list(settings.get("tags") or [])}
        elif name == "mlflow":
            unknown("loggers.mlflow", settings, {"experiment_name", "tracking_uri", "run_name", "tags",
                                                 "log_system_metrics", "rank_zero_only", "model_registry_prefix",
                                                 "model_registry_uri", "synchronous", "run_group",
                                                 "resume", "logging_buffer_seconds"})
            mapped = {"tracking_uri": settings.get("tracking_uri"), "experiment": settings.get("experiment_name"),
                      "run_name": settings.get("run_name"), "tags": dict(settings.get("tags") or {})}
        elif name == "tensorboard":
            unknown("loggers.tensorboard", settings, {"log_dir", "flush_interval", "rank_zero_only"})
            mapped = {"path": settings.get("log_dir")}
        else:
            raise refuse(f"loggers.{name}", "not one of the loggers Tessera has (wandb, mlflow, tensorboard)")
        out.append({name: {k: v for k, v in mapped.items() if v not in (None, [], {})}})
    return out


def parallelism(spec: Any, precision: str) -> dict[str, Any] | None:
    """fsdp_config as the `parallelism` section (FSDP2); None without one (Tessera's ddp)."""
    if spec is None:
        return None
    spec = section(spec, "fsdp_config")
    unknown("fsdp_config", spec, _FSDP_QUIET | {"sharding_strategy", "mixed_precision", "activation_checkpointing",
                                                "activation_cpu_offload", "cpu_offload",
                                                "data_parallel_shard_degree", "data_parallel_replicate_degree"})
    strategy = str(spec.get("sharding_strategy", "FULL_SHARD")).upper()
    if strategy == "NO_SHARD":
        out: dict[str, Any] = {"data_parallel": "ddp"}
    elif strategy in _FSDP_SHARDING:
        out = {"fsdp": {"sharding": _FSDP_SHARDING[strategy], **_mixed_precision(spec, precision)}}
    else:
        raise refuse("fsdp_config.sharding_strategy", f"not one of {', '.join([*_FSDP_SHARDING, 'NO_SHARD'])}",
                     spec["sharding_strategy"])
    fsdp = out.get("fsdp", {})
    for key, ours in (("data_parallel_replicate_degree", "replicate"), ("data_parallel_shard_degree", "shard")):
        if spec.get(key) not in (None, -1):
            fsdp[ours] = spec[key]
    if spec.get("cpu_offload"):
        fsdp["cpu_offload"] = True
    if spec.get("activation_cpu_offload"):
        raise refuse("fsdp_config.activation_cpu_offload", "not implemented (activation_checkpointing saves "
                                                           "activation memory instead)", True)
    if spec.get("activation_checkpointing"):
        out["activation_checkpointing"] = "full"
    return out


def _mixed_precision(spec: dict[str, Any], precision: str) -> dict[str, Any]:
    """Foundry's FSDP mixed_precision: PURE (compute and reduce in the low precision), DEFAULT (reduce in
    float32), FULL (float32), or a mapping of dtypes."""
    low = {"amp_bf16": "bfloat16", "amp_fp16": "float16"}.get(precision)
    mode = spec.get("mixed_precision", "DEFAULT")
    if isinstance(mode, dict):
        names = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "bfloat16": "bfloat16",
                 "float16": "float16", "float32": "float32"}
        return {ours: names[mode[k]] for k, ours in (("param_dtype", "param_dtype"), ("reduce_dtype", "reduce_dtype"))
                if mode.get(k) in names}
    mode = str(mode).upper()
    if mode not in ("PURE", "DEFAULT", "FULL"):
        raise refuse("fsdp_config.mixed_precision", "not one of PURE, DEFAULT, FULL or a mapping of dtypes", mode)
    if mode == "FULL" or low is None:
        return {"param_dtype": "float32", "reduce_dtype": "float32"} if mode == "FULL" else {}
    return {"param_dtype": low, "reduce_dtype": low if mode == "PURE" else "float32"}
