"""LLM Foundry's `train_loader` / `eval_loader` as the recipe's `data.train` / `data.eval` sections.

    train_loader: {name: text, dataset: {local: ./c4, remote: null, split: train, shuffle: true}, num_workers: 8}
    -> data.train: {streams: [{local: ./c4, split: train}], shuffle: true, num_workers: 8}

- `name: text`: MDS shards streamed as Streaming streams; a `tokens` column is read as it is, a `text`
  column is tokenized on the fly with the run's tokenizer (truncated to max_seq_len and padded, the
  padding left out of the loss), as Foundry's text dataloader does.
- `name: finetuning`: prompt/response (or chat) examples, from `hf_name` (a local or bucket JSONL /
  Parquet file or folder, or `json` with `hf_kwargs.data_files`/`data_dir`) or from MDS `streams` /
  `local` / `remote`, prepared into Tessera's cache and packed when `packing_ratio` is set. The loss
  follows `target_prompts` / `target_responses`; a `preprocessing_fn` (module:function) is applied to each
  record first, as Foundry applies it.
Loader settings that only tune how batches are fetched (pin_memory, prefetch_factor, drop_last...) have
no counterpart to set; settings that would change which samples a batch holds are refused unless Tessera
does the same.
"""

from __future__ import annotations

from typing import Any

from tessera.llm.foundry.errors import refuse, section, unknown
from tessera.llm.foundry.paths import checked_url, dataset_path, split_of

_LOADER_KEYS = {"name", "dataset", "drop_last", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                "timeout", "label"}
_STREAM_KEYS = {"remote", "local", "split", "proportion", "repeat", "choose", "download_retry", "download_timeout",
                "validate_hash", "keep_zip"}
# StreamingDataset's keys that change nothing Tessera would do differently (fetching, caching, logging).
_QUIET = {"predownload", "partition_algo", "shuffle_algo", "sampling_granularity", "allow_unsafe_types",
          "eos_token_id", "bos_token_id", "batch_size", "stream_name", "stream_config", "sampling_method",
          "batching_method", "epoch_size", "replication"}
_DATASET_KEYS = _STREAM_KEYS | _QUIET | {"streams", "shuffle", "shuffle_seed", "num_canonical_nodes",
                                         "shuffle_block_size", "cache_limit", "max_seq_len", "token_encoding_type"}
_FINETUNE_KEYS = _DATASET_KEYS | {"hf_name", "hf_kwargs", "preprocessing_fn", "decoder_only_format",
                                  "packing_ratio", "allow_pad_trimming", "target_prompts", "target_responses",
                                  "safe_load", "max_leftover_bins_to_keep"}
_HF_BUILDERS = ("json", "jsonl", "parquet")


def loader(spec: Any, key: str, max_seq_len: Any) -> dict[str, Any]:
    """The recipe's loader section for one Foundry loader."""
    spec = section(spec, key)
    unknown(key, spec, _LOADER_KEYS)
    name = spec.get("name")
    dataset = section(spec.get("dataset"), f"{key}.dataset")
    where = f"{key}.dataset"
    if dataset.get("max_seq_len") not in (None, max_seq_len):
        raise refuse(f"{where}.max_seq_len", f"differs from max_seq_len ({max_seq_len}): Tessera reads windows "
                                             "of the model's length", dataset["max_seq_len"])
    _same_samples(dataset, where)
    if name == "text":
        unknown(where, dataset, _DATASET_KEYS)
        out = {"streams": _streams(dataset, where)}
    elif name == "finetuning":
        unknown(where, dataset, _FINETUNE_KEYS)
        out = _finetuning(dataset, where)
    else:
        raise refuse(f"{key}.name", "not one of LLM Foundry's dataloaders Tessera reads (text, finetuning)", name)
    for option in ("shuffle_seed", "num_canonical_nodes", "shuffle_block_size", "cache_limit", "token_encoding_type"):
        if dataset.get(option) is not None:
            out[option] = dataset[option]
    out["shuffle"] = bool(dataset.get("shuffle", False))  # Streaming's default: in order
    if spec.get("num_workers") is not None:
        out["num_workers"] = spec["num_workers"]
    return out


def _same_samples(dataset: dict[str, Any], where: str) -> None:
    """Keys that would change which samples an epoch holds, refused unless they keep Streaming's default."""
    for key, default in (("sampling_method", "balanced"), ("batching_method", "random"), ("epoch_size", None),
                         ("replication", None)):
        if dataset.get(key, default) not in (default, None):
            raise refuse(f"{where}.{key}", f"only {default or 'unset'} is implemented", dataset[key])


def _streams(dataset: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Streaming's `streams: {name: {...}}` (or one stream from the dataset's own local/remote/split)."""
    streams = section(dataset.get("streams"), f"{where}.streams")
    if streams and (dataset.get("local") is not None or dataset.get("remote") is not None):
        raise refuse(f"{where}.streams", "give either streams or local/remote, not both (Streaming refuses both)")
    items = streams.items() if streams else [(None, dataset)]
    out = []
    for name, stream in items:
        at = f"{where}.streams.{name}" if name is not None else where
        stream = section(stream, at)
        if name is not None:
            unknown(at, stream, _STREAM_KEYS)
        entry = {k: stream[k] for k in _STREAM_KEYS if stream.get(k) is not None}
        if stream.get("split") is None and dataset.get("split") is not None:
            entry["split"] = dataset["split"]  # Streaming: a stream without a split takes the dataset's
        for side in ("remote", "local"):
            if entry.get(side) is not None:
                entry[side] = checked_url(entry[side], f"{at}.{side}")
        if entry.get("remote") is None and entry.get("local") is None:
            raise refuse(f"{at}.local", "set local (a folder of MDS shards) or remote (a bucket path)")
        out.append(entry)
    return out


def _finetuning(dataset: dict[str, Any], where: str) -> dict[str, Any]:
    """Fine-tuning examples: `path` (prepared into Tessera's cache) and how rows are made from them."""
    if dataset.get("decoder_only_format", True) is False:
        raise refuse(f"{where}.decoder_only_format", "encoder-decoder examples: Tessera trains decoder-only "
                                                     "causal language models", False)
    out: dict[str, Any] = {"path": _examples_path(dataset, where), "format": "auto", "truncation": "prompt_first",
                           "pack": dataset.get("packing_ratio") is not None, "loss_on": _loss_on(dataset, where)}
    if dataset.get("preprocessing_fn") is not None:  # the user's module:function, applied to each record
        out["preprocessing_fn"] = dataset["preprocessing_fn"]
    return out


def _examples_path(dataset: dict[str, Any], where: str) -> str:
    """Where the examples are: hf_name (a path, or a builder over hf_kwargs' files) or one MDS stream."""
    split = dataset.get("split")
    if dataset.get("hf_name") is None:
        streams = _streams(dataset, where)
        if len(streams) > 1 or set(streams[0]) & {"proportion", "repeat", "choose"}:
            raise refuse(f"{where}.streams", "fine-tuning examples are read from one stream (mix them into one "
                                             "dataset first)")
        stream = streams[0]
        return split_of(stream.get("remote") or stream["local"], stream.get("split"), f"{where}.remote")
    name = dataset["hf_name"]
    kwargs = section(dataset.get("hf_kwargs"), f"{where}.hf_kwargs")
    if name not in _HF_BUILDERS:
        unknown(f"{where}.hf_kwargs", kwargs, set())
        return split_of(dataset_path(name, f"{where}.hf_name"), split, f"{where}.hf_name")
    unknown(f"{where}.hf_kwargs", kwargs, {"data_files", "data_dir"})
    files = kwargs.get("data_files")
    if isinstance(files, dict):  # {split: file(s)}
        if split not in files:
            raise refuse(f"{where}.hf_kwargs.data_files", f"has no split '{split}' (it has {', '.join(files)})")
        files = files[split]
    if isinstance(files, list):
        if len(files) != 1:
            raise refuse(f"{where}.hf_kwargs.data_files", "give one file or folder (Tessera reads a folder of "
                                                          "JSONL or Parquet files as one input)")
        files = files[0]
    if files is not None:
        return dataset_path(files, f"{where}.hf_kwargs.data_files")
    if kwargs.get("data_dir") is None:
        raise refuse(f"{where}.hf_kwargs", f"hf_name={name} needs data_files or data_dir")
    folder = dataset_path(kwargs["data_dir"], f"{where}.hf_kwargs.data_dir")
    return split_of(folder, split, f"{where}.hf_kwargs.data_dir")


def _loss_on(dataset: dict[str, Any], where: str) -> str:
    """Foundry's target_prompts (none) and target_responses (last) as Tessera's loss_on."""
    prompts, responses = dataset.get("target_prompts", "none"), dataset.get("target_responses", "last")
    if str(prompts).lower() == "all":
        return "all"
    if str(prompts).lower() != "none":
        raise refuse(f"{where}.target_prompts", "only none or all are implemented", prompts)
    if str(responses).lower() not in ("last", "all"):
        raise refuse(f"{where}.target_responses", "only last or all are implemented", responses)
    return "all_assistant" if str(responses).lower() == "all" else "last_assistant"
