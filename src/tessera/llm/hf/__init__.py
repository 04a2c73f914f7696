"""Fine-tuning Hugging Face models (and Tessera's GPT) with the trainer Tessera already has.

    tessera train finetune-lora-tiny.yaml model.pretrained=./my-model data.train.path=chat.jsonl
    tessera llm export runs/finetune-lora-tiny/checkpoints out --format hf            # LoRA merged
    tessera llm export runs/finetune-lora-tiny/checkpoints adapter --format hf --adapter-only

A recipe's `model.pretrained` names a transformers folder (local or s3://; transformers never reaches a
model hub) or a Tessera GPT export/checkpoint; a `lora` section trains LoRA adapters only (omit it to
fine-tune every weight). The model keeps the trainer's contract (`model(batch) -> loss`), so gradient
accumulation, autocast, DDP/FSDP2, checkpoints and autoresume are the ones every run uses. With LoRA the
checkpoints hold only the adapters and their optimizer state; the frozen base is read again from
`model.pretrained` on resume and on export, which check first that its files are the ones the run
started from (fingerprint.py). `lora.quantize_base: 4bit` (QLoRA, bitsandbytes) runs on
CUDA GPUs only: on a CPU it stops with a one-line error before anything is loaded.

    config.py     the recipe's `model.pretrained` and `lora` sections (typed)
    cache.py      s3:// model folders downloaded once per node
    adapter.py    `HFCausalLM`: `model(batch) -> loss` around a transformers causal LM (packed rows too)
    load.py       folder -> (model, tokenizer), LoRA and the 4-bit base on request
    lora.py       add and merge LoRA adapters (HF models and Tessera's GPT)
    export.py     a checkpoint -> a transformers folder (merged) or a peft adapter folder
    fingerprint.py  the base model's files hashed at the start of a run; resume and export refuse a changed base
    gpt_to_hf.py  Tessera's GPT as the transformers architecture with the same maths (MPT, GPT-NeoX)
    mpt.py        the reverse: an MPT config and weights (LLM Foundry's, transformers') as the GPT's, or refused
    composer.py   a Composer checkpoint of an MPT (a Foundry run): weights, optimizer, timestamp, tokenizer
    composer_start.py  that checkpoint as a Tessera checkpoint, so `load_path` continues a Composer run
    mpt_load.py   `load_gpt`: the GPT from any source (Composer file, MPT folder, Tessera export/checkpoint)
"""
