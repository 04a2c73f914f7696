"""The `icl_tasks` and `eval_gauntlet` sections of a recipe (or of `tessera llm eval --icl-tasks FILE`).

Keys and defaults are LLM Foundry's, so a Foundry `tasks.yaml` reads as it is:

    icl_tasks:
    - label: lambada
      dataset_uri: s3://bucket/eval/lambada.jsonl   # a local path, a URL, or a task shipped with Tessera
      num_fewshot: [0, 3]
      icl_task_type: language_modeling             # | multiple_choice | schema | question_answering
      continuation_delimiter: " "
    icl_subset_num_batches: 4                       # score at most this many batches of each task
    eval_gauntlet: {subtract_random_baseline: true, rescale_accuracy: true, categories: [...]}

Foundry's own name for question answering, `generation_task_with_answers`, is accepted too. Either
section may also be the path of a YAML file holding it (as Foundry allows), read when validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tessera.syntax_errors import yaml_error

TaskType = Literal["language_modeling", "multiple_choice", "schema", "question_answering"]
FOUNDRY_TASK_TYPES = {"generation_task_with_answers": "question_answering"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ICLTaskConfig(_Strict):
    """One in-context-learning task, scored at each `num_fewshot`; logged as `icl/<label>/<n>-shot`."""

    label: str = Field(min_length=1, description="The task's name in the logged metrics.")
    dataset_uri: str = Field(min_length=1, description="JSONL items: a path, s3://..., or a shipped task name.")
    num_fewshot: list[int] = Field(default_factory=lambda: [0], description="Solved examples before each item.")
    icl_task_type: TaskType = Field(description="language_modeling | multiple_choice | schema | "
                                                "question_answering.")
    continuation_delimiter: str = Field(" ", description="Between an example's context and its answer.")
    example_delimiter: str = Field("\n", description="Between examples.")
    prompt_string: str = Field("", description="Text before the first example (instructions).")
    question_prelimiter: str = Field("", description="Text before each example's context.")
    fewshot_random_seed: int = Field(1234, description="Seed of the few-shot example choice.")
    max_seq_len: int | None = Field(None, ge=2, description="Longest prompt + answer; None: the model's.")
    batch_size: int = Field(4, ge=1, description="Items per forward pass (per rank).")
    early_stopping_criteria: list[str] | None = Field(None, description="question_answering: the answer "
                                                                        "ends at the first of these (and at "
                                                                        "a newline).")
    do_normalization: bool = Field(True, description="question_answering: compare lower-cased answers "
                                                     "without punctuation and articles.")
    cot_delimiter: str = Field("", description="question_answering: the answer follows the last of these.")
    max_new_tokens: int | None = Field(None, ge=1, description="question_answering: tokens generated; None: "
                                                               "the longest answer's.")
    has_categories: bool = Field(False, description="Score each item \"category\" apart (icl/<label>/<n>-shot/"
                                                    "<category>); the task's score is their mean.")

    @field_validator("icl_task_type", mode="before")
    @classmethod
    def _foundry_name(cls, value: Any) -> Any:
        return FOUNDRY_TASK_TYPES.get(value, value) if isinstance(value, str) else value

    @field_validator("num_fewshot", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) else value

    @field_validator("num_fewshot")
    @classmethod
    def _non_negative(cls, value: list[int]) -> list[int]:
        if not value or any(n < 0 for n in value):
            raise ValueError(f"must be a non-empty list of counts >= 0, got {value}")
        return value


class GauntletBenchmark(_Strict):
    name: str = Field(description="A task label.")
    num_fewshot: int = Field(ge=0, description="Which of the task's few-shot scores counts.")
    random_baseline: float = Field(0.0, ge=0.0, lt=1.0, description="Accuracy of guessing.")


class GauntletCategory(_Strict):
    name: str = Field(description="Logged as icl/gauntlet/<name>.")
    benchmarks: list[GauntletBenchmark] = Field(min_length=1)


class GauntletConfig(_Strict):
    """How `icl/average` combines the tasks. Without categories, every task and shot count weighs the
    same; with them (Foundry's shape) each category is a weighted mean of its benchmarks, logged as
    `icl/gauntlet/<category>`, and the average is over the categories."""

    weighting: Literal["EQUAL", "SAMPLE_SZ", "LOG_SAMPLE_SZ"] = Field(
        "EQUAL", description="Benchmarks weigh equally, by item count, or by log2 of it.")
    subtract_random_baseline: bool = Field(True, description="Score accuracy above guessing.")
    rescale_accuracy: bool = Field(True, description="Divide by (1 - random_baseline) so 1.0 is perfect.")
    categories: list[GauntletCategory] = Field(default_factory=list)
    averages: dict[str, list[str]] | None = Field(None, description="Named means over categories.")

    @model_validator(mode="after")
    def _rescale_needs_subtract(self) -> GauntletConfig:
        if self.rescale_accuracy and not self.subtract_random_baseline:
            raise ValueError("rescale_accuracy needs subtract_random_baseline: true")
        return self


def read_section(value: Any, key: str) -> Any:
    """A section given as the path of a YAML file: the file's `key` (or its whole content)."""
    if not isinstance(value, str):
        return value
    path = Path(value)
    if not path.is_file():
        raise ValueError(f"{value}: no such file (give the {key} section itself or a YAML file holding it)")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(yaml_error(exc, text, value)) from None
    return data.get(key, data) if isinstance(data, dict) else data


class ICLSection(_Strict):
    """The ICL keys of a recipe, apart from the rest so `tessera llm eval --icl-tasks` reads the same."""

    icl_tasks: list[ICLTaskConfig] = Field(default_factory=list, description="In-context-learning tasks "
                                                                             "scored at eval_interval.")
    icl_subset_num_batches: int | None = Field(None, ge=1, description="Score at most this many batches "
                                                                       "of each ICL task.")
    eval_gauntlet: GauntletConfig | None = Field(None, description="How icl/average combines the tasks.")

    @field_validator("icl_tasks", mode="before")
    @classmethod
    def _tasks_file(cls, value: Any) -> Any:
        return read_section(value, "icl_tasks")

    @field_validator("eval_gauntlet", mode="before")
    @classmethod
    def _gauntlet_file(cls, value: Any) -> Any:
        return read_section(value, "eval_gauntlet")

    @model_validator(mode="after")
    def _unique_labels(self) -> ICLSection:
        labels = [t.label for t in self.icl_tasks]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"icl_tasks: label {twice[0]!r} is used twice; labels name the logged metrics")
        return self
