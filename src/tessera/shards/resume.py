"""What `convert --mode resume` finds before it writes anything: a write of this input to continue, a
conversion of it that is already complete, or nothing of it to resume.

A journal (index.partial.json) means a write is in flight. When it records the inputs it was converting
(`convert` records them, see provenance.py), they must be this command's inputs, byte for byte as far as
names, sizes and digests tell; a journal in the "committing" state is then finished here (its commit
is idempotent) and the conversion is complete. Without a journal, a committed index.json is complete for
this input when its provenance names every input of this command: an index is only committed once every
row of its write was stored. Anything else has nothing of this input to resume, and is refused rather
than appended to: appending is what made a second resume store every row twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tessera.shards.index import INDEX_BASENAME, DatasetIndex
from tessera.shards.provenance import PROVENANCE_KEY, InputId, NotResumable, Provenance
from tessera.shards.session import JOURNAL_BASENAME, plan_session, read_committed, read_journal
from tessera.storage import Store

AFTERWARDS = "pass mode='append' to add this input's rows to it, or mode='overwrite' to replace it"


@dataclass(frozen=True)
class Finished:
    """A conversion that needs nothing more: `how` is "complete" (nothing was written) or "committed"
    (the interrupted commit of its index.json was finished)."""

    index: DatasetIndex
    how: str


def _describe(item: Any) -> str:
    if not isinstance(item, dict):
        return "none"
    return f"{item.get('name')} (size {item.get('size')}, digest {item.get('head')})"


def _same_inputs(store: Store, recorded: Any, inputs: Sequence[InputId]) -> None:
    given = [item.to_json() for item in inputs]
    if recorded == given:
        return
    recorded = recorded if isinstance(recorded, list) else []
    k = next(k for k in range(max(len(recorded), len(given)))
             if k >= len(recorded) or k >= len(given) or recorded[k] != given[k])
    was = _describe(recorded[k]) if k < len(recorded) else "none"
    now = _describe(given[k]) if k < len(given) else "none"
    raise NotResumable(f"{store.url}: the interrupted write ({JOURNAL_BASENAME}) was converting other input: "
                       f"its input {k + 1} was {was}, this command's is {now}; resume with the same input and "
                       "options, or pass mode='overwrite' to start over")


def check_resume(store: Store, inputs: Sequence[InputId]) -> Finished | None:
    """Finished when the conversion of `inputs` into `store` needs nothing more; None when a write is to
    be continued (or started: the store holds nothing); NotResumable when there is nothing to resume."""
    found = read_journal(store)
    if found is not None:
        _, meta = found
        if "inputs" not in meta:  # a write that recorded no inputs: continued by its sample count
            return None
        _same_inputs(store, meta["inputs"], inputs)
        if meta.get("state") != "committing":
            return None
        plan_session(store, "resume")  # redoes the interrupted (idempotent) commit
        index = read_committed(store)
        return Finished(index, "committed") if index is not None else None
    index = read_committed(store)
    if index is None:
        return None
    what = f"{store.url} holds a committed dataset ({index.num_samples:,} samples in {len(index.shards)} shards)"
    prov = Provenance.from_extensions(index.extensions, store.url_for(INDEX_BASENAME))
    if prov is None:
        raise NotResumable(f"{what} and no interrupted write, and its index records no conversion "
                           f"({PROVENANCE_KEY} is absent): there is nothing to resume; {AFTERWARDS}")
    missing = [str(item) for item in inputs if item not in prov.inputs]
    if missing:
        raise NotResumable(f"{what} and no interrupted write, converted from other inputs: {len(missing)} of "
                           f"this command's {len(inputs)} inputs are not among them (first: {missing[0]}): "
                           f"there is nothing to resume; {AFTERWARDS}")
    return Finished(index, "complete")
