"""In-context-learning evaluation in LLM Foundry's task formats: language modelling, multiple choice,
schema and question answering, few-shot, across ranks, for Tessera's GPT and transformers models.

    items.py     task files (JSONL) into typed items
    prompts.py   few-shot prompts as Foundry builds them, tokenized
    scoring.py   continuation log-likelihoods and greedy answers from `logits(input_ids)`
    runner.py    score prepared tasks on every rank and sum the counts
    gauntlet.py  `icl/average` (random-baseline-rescaled, weighted) as Foundry's eval gauntlet
    callback.py  `ICLEvaluator`, a trainer callback scoring at eval_interval
    config.py    the recipe's `icl_tasks`, `icl_subset_num_batches` and `eval_gauntlet`
"""

from tessera.llm.icl.config import GauntletConfig, ICLSection, ICLTaskConfig
from tessera.llm.icl.items import TaskFileError, load_items
from tessera.llm.icl.prompts import TokenizerView, build_prompts
from tessera.llm.icl.runner import PreparedTask, evaluate_icl, prepare_tasks

__all__ = ["GauntletConfig", "ICLSection", "ICLTaskConfig", "PreparedTask", "TaskFileError", "TokenizerView",
           "build_prompts", "evaluate_icl", "load_items", "prepare_tasks"]
