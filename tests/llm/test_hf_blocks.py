"""FSDP units: models say what their blocks are; train/distributed.py finds them for HF models too."""

from __future__ import annotations

from hf_fixtures import tiny_llama
from llm_helpers import small_model

from tessera.llm.hf.config import LoraSpec, PretrainedSpec
from tessera.llm.hf.gpt_to_hf import gpt_to_hf
from tessera.llm.hf.load import load_hf
from tessera.train.parallel import fsdp_units


def test_fsdp_units_are_the_decoder_layers(tmp_path):
    folder = tiny_llama(tmp_path / "llama")
    for lora in (None, LoraSpec(rank=2)):
        model, _ = load_hf(PretrainedSpec(pretrained=str(folder)), lora)
        units = fsdp_units(model)
        assert [type(u).__name__ for u in units] == ["LlamaDecoderLayer"] * 2
        assert units == fsdp_units(model.hf)  # the bare transformers model: via _no_split_modules
    mpt = gpt_to_hf(small_model())  # its blocks live in a ModuleList named `blocks`, not a method
    assert [type(u).__name__ for u in fsdp_units(mpt)] == ["MptBlock"] * 2
    gpt = small_model()
    assert fsdp_units(gpt) == list(gpt.transformer.blocks)
