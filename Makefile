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

.PHONY: setup test demo demo-finetune bench lint docs docs-screenshots clean

# Each step of `make setup` says what it installs and how far it is; pip shows its download bars for the
# large steps (the environment grows to ~3.3 GB, most of it torch, Ray and Spark). No commas in a STEP's text.
STEP = @echo "==> setup [$(1)/5] $(2)"

$(BIN)/python:
	$(call STEP,1,a virtual environment in $(VENV) with the newest pip)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	@# The CPU torch wheel first, so nothing later resolves a CUDA build.
	$(call STEP,2,torch CPU build $(TORCH_PIN): ~200 MB to download and ~750 MB installed)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --progress-bar on "$(TORCH_PIN)"
	$(call STEP,3,Tessera and its extras: dev docs bench ray spark trackers postgres browser (~2.5 GB))
	$(BIN)/pip install --progress-bar on -e ".[dev,docs,bench,ray,spark,trackers,postgres,browser]"
	$(call STEP,4,what the benchmark anchors need at run time: zstd boto3 transformers and 8 more)
	$(BIN)/pip install -q $(ANCHOR_NEEDS)
	$(call STEP,5,the anchors we measure against: $(ANCHORS))
	$(BIN)/pip install -q --no-deps $(ANCHORS)
	@touch $@
	@echo "==> setup done: $(VENV) ($$(du -sh $(VENV) | cut -f1))"

setup: $(VENV)/.installed

# Two workers, a test file each at a time (its module fixtures made once): most tests wait on processes,
# servers and daemons, so two keep the 2-core CI machine busy (~12 minutes instead of ~18 one at a time).
# One test alone: .venv/bin/python -m pytest tests/PATH::NAME (no workers).
test: setup
	$(BIN)/python -m pytest tests -n 2 --dist loadfile

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

# docs/console.png from a real server and a real CPU training run, photographed by headless Chromium.
docs-screenshots: setup
	$(BIN)/python scripts/docs_screenshots.py

clean:
	rm -rf $(VENV) demo-out bench-out site
