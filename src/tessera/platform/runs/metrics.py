"""A run's metrics: what the trainer reports for the console's plots and `Platform.run_metrics`.

Every resumption gets `TESSERA_METRICS=<resumption folder>/metrics.jsonl` (submission.py); a trainer that
sees it appends one JSON object per log line on rank 0 ({"step": n, "loss/train": x, "lr": y, ...}). The
supervisor ships each resumption's file, in order, to the run's one metrics chain in the artifacts store
(shipping.py), so a resumed run's curve continues, and any replica reads it. Readers page through the
chain by chunk: `after` is the `next` of the previous answer, so a poll returns only the rows it has not
seen. Rows pass through the same `Redactor` as the logs (already when shipped, and again when read, for a
secret created since): a run may write a secret into its metrics as into its log, so whoever reads a
run's metrics sees its strings masked as its log lines are.
"""

from __future__ import annotations

import json
from typing import Any

from tessera.platform.runs.artifacts import ArtifactStore
from tessera.platform.secrets.redaction import Redactor

METRICS_FILE = "metrics.jsonl"
READ_LIMIT = 1 << 20   # bytes per call: a long run's metrics are read in pages, never all at once


def read_metrics(artifacts: ArtifactStore, run_id: str, redact: Redactor, after: int = 0,
                 limit: int = READ_LIMIT) -> tuple[list[dict[str, Any]], int]:
    """(rows after position `after`, masked by `redact`; the position to pass next time). Lines that are
    not JSON objects are skipped, as is a line longer than a chunk (it was shipped in pieces)."""
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"metrics position must be an integer >= 0 (the `next` of an earlier answer), "
                         f"got {after!r}")
    chunks, _ = artifacts.metrics_chain(run_id).read(after, limit)
    rows = []
    for chunk in chunks:
        for line in chunk.payload.split(b"\n"):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(redact.json(row))
    return rows, after + len(chunks)
