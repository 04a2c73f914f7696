"""A recipe's keys for fine-tuning data: `data.train.path` (and `data.eval.path`) with their options.

    data:
      train:
        path: chat.jsonl            # JSONL or Parquet, a folder of them, or s3://...
        format: auto                # chat | instruction | text | auto (read off each record's keys)
        loss_on: all_assistant      # | last_assistant | all
        pack: true                  # several examples per row, attention kept inside each
        on_bad_row: error           # | skip (count bad rows; a run with nothing left still fails)
        shuffle: true

The file is prepared once into a local MDS cache (`cache.py`) and streamed like `streams` are, with
the same determinism and resume; `path` and `streams` exclude each other. These fields are mixed into the
recipe's loader sections (llm/recipe.py), so they are checked, listed by `tessera train --list-keys` and
documented here, in one place.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from tessera.llm.finetune.examples import Format, LossOn, Truncation
from tessera.llm.finetune.reader import DEFAULT_MAX_RECORD_BYTES
from tessera.shards.sizes import parse_size

OnBadRow = Literal["error", "skip"]
_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class ExampleOptions(BaseModel):
    """How records become rows: the options of `tessera llm prep --format ...` and of a recipe's `path`,
    checked here and nowhere else."""

    format: Format = Field("auto", description="Record form: chat (messages), instruction (prompt, response), "
                                               "text, or auto (read off each record's keys).")
    loss_on: LossOn = Field("all_assistant", description="Tokens that carry loss: every assistant reply "
                                                         "(instruction: the response), the last one, or all.")
    truncation: Truncation = Field("prompt_first", description="Examples longer than max_seq_len: cut the "
                                                               "prompt side first, or drop them.")
    pack: bool = Field(True, description="Pack several examples per row (attention kept inside each); "
                                         "false: one example per row, padded.")
    text_field: str = Field("text", description="The field of text records.")
    on_bad_row: OnBadRow = Field("error", description="A row that is not a valid record (bad JSON, not UTF-8, "
                                                      "null content...): error (stop, naming file and line) or "
                                                      "skip (count it; nothing left is still an error).")
    max_record_bytes: int = Field(DEFAULT_MAX_RECORD_BYTES, ge=1,
                                  description="A record (JSONL line) longer than this is a bad row, never read "
                                              "whole (bytes, or '64mb').")
    preprocessing_fn: str | None = Field(None, description="module.path:function applied to each record before it "
                                                           "is read (LLM Foundry's preprocessing_fn): it returns "
                                                           "{prompt, response} or {messages}; the module must be "
                                                           "importable (PYTHONPATH); an error in it makes a bad row.")

    @field_validator("preprocessing_fn")
    @classmethod
    def _function_path(cls, value: str | None) -> str | None:
        if value is not None and not _FUNCTION.fullmatch(value):
            raise ValueError(f"preprocessing_fn {value!r} must look like module.path:function")
        return value

    @field_validator("max_record_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value


class ExampleSource(ExampleOptions):
    """Fine-tuning examples to prepare and stream (instead of `streams` of prepared MDS)."""

    path: str | None = Field(None, description="Fine-tuning examples: a JSONL (.jsonl, .jsonl.gz) or Parquet file "
                                               "or folder, local or s3://...; prepared once into prep_cache "
                                               "(excludes streams).")
    prep_cache: str | None = Field(None, description="Local folder of prepared examples; None: "
                                                     "$XDG_CACHE_HOME/tessera/finetune (~/.cache/...).")

    def example_options(self) -> ExampleOptions:
        return ExampleOptions(**self.model_dump(include=set(ExampleOptions.model_fields)))

    @model_validator(mode="after")
    def _path_or_streams(self) -> Any:
        streams = getattr(self, "streams", None)
        if self.path and streams:
            raise ValueError("set either path (fine-tuning examples, prepared on the fly) or streams (prepared "
                             "MDS datasets), not both (to replace a recipe's streams by a path, add streams=[])")
        if not self.path and streams is not None and not streams:
            raise ValueError("streams: set the datasets to stream (streams: [{remote: ...}]) or, for "
                             "fine-tuning examples, path: FILE.jsonl")
        return self
