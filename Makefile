# Tessera: every target sets itself up; `make demo` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0+cpu
# The anchors we measure and test against. Installed --no-deps: their pins (torchvision) would drag a
# multi-GB CUDA torch in. Their runtime needs are listed explicitly instead.
ANCHORS := mosaicml-streaming==0.13.0 litdata==0.2.76
ANCHOR_NEEDS := zstd python-snappy Brotli xxhash catalogue tqdm boto3 lightning-utilities filelock requests "transformers<5"

.PHONY: setup test demo demo-finetune bench lint docs clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	@# The CPU torch wheel first, so nothing later resolves a CUDA build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[dev,docs,bench,ray,spark,trackers,postgres,browser]"
	$(BIN)/pip install -q $(ANCHOR_NEEDS)
	$(BIN)/pip install -q --no-deps $(ANCHORS)
	touch $@

setup: $(VENV)/.installed

test: setup
	$(BIN)/python -m pytest tests

demo: setup
	bash examples/demo.sh

# After `make demo` (run first if demo-out/ has no model): LoRA fine-tuning of its GPT on an instruction task.
demo-finetune: setup
	$(BIN)/python examples/finetune_demo.py

bench: setup
	$(BIN)/python benchmarks/storage.py

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports --no-logo

# The guides in docs/ and reference pages built from the docstrings, into site/.
docs: setup
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) demo-out bench-out site
