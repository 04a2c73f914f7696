"""Hugging Face interop: load transformers models (local or from a bucket), LoRA/QLoRA through peft, and
export to the transformers format, all behind the model contract the trainer already uses.

    config.py   the recipe's `model.pretrained` and `lora` sections (typed)
    cache.py    s3:// model folders downloaded once per node
    adapter.py  `HFCausalLM`: `model(batch) -> loss` around a transformers causal LM
    load.py     folder -> (HFCausalLM, tokenizer), LoRA and 4-bit base on request
    lora.py     add and merge LoRA adapters (HF models and Tessera's GPT)
    export.py   a checkpoint -> a transformers folder (merged) or a peft adapter folder
    gpt_to_hf.py  Tessera's GPT as the transformers architecture with the same maths (MPT, GPT-NeoX)
"""
