"""An LLM Foundry train YAML as Foundry reads it: command-line overrides merged in, then `${...}` resolved.

    tree = resolved(yaml_tree, ["variables.data_local=./c4", "max_duration=3ba"], "mpt-125m.yaml")

Foundry's `train_from_yaml` loads the file with OmegaConf, merges `OmegaConf.from_cli(args)` (dotted
`key.path=value`, the value parsed as YAML) and resolves interpolations only then, so an override of
`variables.max_seq_len` reaches every `${variables.max_seq_len}`. The same library does the same here.
Foundry clears OmegaConf's `oc.env` resolver, so `${oc.env:...}` is refused as it is there, and a
value still `???` (OmegaConf's "must be set") names every such key with an override to copy.
"""

from __future__ import annotations

import re
from typing import Any

from tessera.llm.foundry.errors import FoundryError, refuse
from tessera.llm.recipe_required import must_be_set_message, unset_keys

# A Foundry train YAML has these at the top (a Tessera recipe has `data` and a `tokenizer` string).
_MARKERS = ("train_loader", "variables", "eval_loader", "fsdp_config", "algorithms", "callbacks")
FOUNDRY_MODELS = ("mpt_causal_lm", "hf_causal_lm", "hf_t5", "hf_prefix_lm", "openai_causal_lm",
                  "openai_chat", "fmapi_causal_lm", "fmapi_chat")
_RESOLVER = re.compile(r"\$\{\s*[\w.\-]+\s*:")


def is_foundry(tree: Any) -> bool:
    """Whether a parsed YAML is LLM Foundry's train YAML rather than a Tessera recipe."""
    if not isinstance(tree, dict) or "data" in tree:
        return False
    model = tree.get("model")
    named = isinstance(model, dict) and model.get("name") in FOUNDRY_MODELS
    return named or isinstance(tree.get("tokenizer"), dict) or any(key in tree for key in _MARKERS)


def resolved(tree: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The YAML with the overrides merged and every `${...}` resolved, as plain values."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
            raise FoundryError(f"override {item!r} must look like key.path=value (Foundry's dotted form)")
    _no_resolvers(tree, "")
    try:
        config = OmegaConf.create(tree)
        for item in overrides:  # one at a time, so a refusal names the override
            cli = OmegaConf.from_dotlist([item])
            _no_resolvers(OmegaConf.to_container(cli, resolve=False), "")
            try:
                config = OmegaConf.merge(config, cli)
            except (TypeError, ValueError):  # OmegaConf's "Cannot merge incompatible container types"
                raise FoundryError(f"override {item!r}: it sets part of a list, which OmegaConf (and so LLM Foundry) "
                                   "cannot merge; set the whole list (key=[...])") from None
        plain = OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as exc:
        raise FoundryError(_one_line(exc)) from None
    assert isinstance(plain, dict)
    if unset := unset_keys(plain):
        raise FoundryError(must_be_set_message(unset))
    return plain


def _no_resolvers(tree: Any, where: str) -> None:
    """`${oc.env:X}` and other resolvers are refused: Foundry clears `oc.env` before it loads a YAML."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            _no_resolvers(value, f"{where}.{key}" if where else str(key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            _no_resolvers(value, f"{where}.{index}")
    elif isinstance(tree, str) and _RESOLVER.search(tree):
        raise refuse(where, "resolvers such as ${oc.env:NAME} are not resolved (LLM Foundry clears oc.env too); "
                            "pass the value as an override instead", tree)


def _one_line(exc: Exception) -> str:
    """OmegaConf's message (several lines: the problem, full_key, object_type) as `key: problem`."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    key = getattr(exc, "full_key", None)
    return f"{key}: {first}" if key else first


def anchored_keys(text: str) -> set[str]:
    """Top-level keys whose value carries a YAML anchor (`dataset: &hf_dataset`), read from the events."""
    import yaml

    found: set[str] = set()
    depth, key, expect_key = 0, "", True
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if depth == 1 and not expect_key:
                    if event.anchor:
                        found.add(key)
                    expect_key = True
                depth += 1
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)) and depth == 1:
                if expect_key:
                    key, expect_key = str(getattr(event, "value", "")), False
                else:
                    if getattr(event, "anchor", None) and isinstance(event, yaml.ScalarEvent):
                        found.add(key)
                    expect_key = True
    except yaml.YAMLError:
        return set()
    return found
