"""`icl/average`: one number over the ICL tasks, as LLM Foundry's eval gauntlet composes it.

Each benchmark's accuracy may have its random baseline subtracted and be rescaled so that 1.0 is perfect,
`(accuracy - baseline) / (1 - baseline)`; a category is the weighted mean of its benchmarks (equal
weights, item counts, or log2 of them); the average is the mean over categories. A category missing one
of its benchmarks is left out, as Foundry leaves it out. Without an `eval_gauntlet` section the average
is the plain mean over every task and shot count.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from tessera.llm.icl.config import GauntletConfig

log = logging.getLogger(__name__)


def _weight(weighting: str, items: float) -> float:
    if weighting == "SAMPLE_SZ":
        return max(items, 1.0)
    if weighting == "LOG_SAMPLE_SZ":
        return max(math.log2(max(items, 1.0)), 1.0)
    return 1.0


def aggregate(scores: Mapping[str, tuple[float, float]], gauntlet: GauntletConfig | None) -> dict[str, float]:
    """`{"icl/average": ..., "icl/gauntlet/<category>": ...}` from `{"<label>/<n>-shot": (accuracy, items)}`."""
    if not scores:
        return {}
    if gauntlet is None:
        return {"icl/average": sum(acc for acc, _ in scores.values()) / len(scores)}
    categories = {c.name: [(b.name, b.num_fewshot, b.random_baseline) for b in c.benchmarks]
                  for c in gauntlet.categories}
    if not categories:  # every task, no baseline: only the weighting applies
        categories = {"all": [(key.rsplit("/", 1)[0], int(key.rsplit("/", 1)[1].removesuffix("-shot")), 0.0)
                              for key in scores]}
    results: dict[str, float] = {}
    for name, benchmarks in categories.items():
        parts = []
        for label, shots, baseline in benchmarks:
            key = f"{label}/{shots}-shot"
            if key not in scores:
                log.warning("eval_gauntlet: no score for %s, so category %s is left out", key, name)
                parts = []
                break
            accuracy, items = scores[key]
            if gauntlet.subtract_random_baseline:
                accuracy -= baseline
                if gauntlet.rescale_accuracy:
                    accuracy /= 1.0 - baseline
            parts.append((accuracy, _weight(gauntlet.weighting, items)))
        if parts:
            total = sum(w for _, w in parts)
            results[name] = sum(a * w for a, w in parts) / total
    metrics = {f"icl/gauntlet/{name}": value for name, value in results.items() if gauntlet.categories}
    for name, members in (gauntlet.averages or {}).items():
        present = [results[m] for m in members if m in results]
        metrics[f"icl/gauntlet/{name}"] = sum(present) / len(present) if present else 0.0
    if results:
        metrics["icl/average"] = sum(results.values()) / len(results)
    return metrics
