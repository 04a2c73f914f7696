"""Which input rows each shard of a converted dataset holds: `tessera_provenance` in index.json.

`convert` records, for every shard it writes, the rows of its input that the shard holds. That record
lets `--mode resume` continue after exactly the last row an interrupted write stored (and refuse an input
that changed), recognise a conversion that already completed, and lets `verify` flag source rows stored
twice. It sits at the top level of index.json (shard entries must keep exactly their keys; MosaicML's
readers ignore top-level keys, see MDS.md) and in the write journal, which is an index too:

    "tessera_provenance": {"version": 1,
        "inputs": [{"name": "a.jsonl", "size": 1234567, "head": "9f1c0e2a7b3d4c5e"}, ...],
        "shards": {"shard.00000.mds": [[0, 0, 2499]], "shard.00001.mds": [[0, 2500, 4999], [1, 0, 11]]}}

An input is named relative to the converted path (a file's own name; a folder's files by their path below
it) with its size in bytes and a digest of its first 64 KiB; a text or image folder is one input whose
size is its number of files and whose digest is of their names. So the same input is recognised wherever
it lives (a local copy, a bucket), and one that changed is not. A row is the n-th sample read from an
input, from 0 (blank JSONL lines do not count; a folder's rows are its files in order). A segment
`[input, first, last]` says the shard holds rows first..last of that input, in that order.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tessera.shards.errors import DatasetExists, IndexFormatError
from tessera.shards.index import MAX_TOTAL_SAMPLES, ShardEntry
from tessera.shards.inputs import input_size, is_url, read_range

if TYPE_CHECKING:
    from tessera.shards.sources import Chunk

PROVENANCE_KEY = "tessera_provenance"
HEAD_BYTES = 64 << 10  # bytes of a file input that its digest covers
FOLDER_KINDS = ("text", "images")  # chunk kinds whose input is the whole folder (one row per file)
Segment = tuple[int, int, int]  # (input, first row, stop row): rows first..stop-1


class NotResumable(DatasetExists):
    """`mode="resume"` has nothing of this input to continue: another input's write, or a dataset that
    records no conversion of it."""


@dataclass(frozen=True)
class InputId:
    """One input as provenance names it: relative name, size (bytes, or files of a folder), digest."""

    name: str
    size: int
    head: str

    def to_json(self) -> dict[str, Any]:
        return {"head": self.head, "name": self.name, "size": self.size}

    def __str__(self) -> str:
        return self.name


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _relative(root: str, path: str) -> str:
    """`path` named relative to the converted `root` (a file given alone: its own name)."""
    base = root.rstrip("/")
    if path == root or path == base:
        return base.rpartition("/")[2] if is_url(base) else os.path.basename(os.path.abspath(base))
    if is_url(path):
        return path[len(base) + 1:] if path.startswith(base + "/") else path.rpartition("/")[2]
    return os.path.relpath(path, root).replace(os.sep, "/")


def input_ids(root: str, chunks: Sequence[Chunk]) -> tuple[list[InputId], list[int]]:
    """The inputs of a conversion in order, and the input of each chunk (an index into them)."""
    order: dict[str, int] = {}
    per_chunk = [order.setdefault(chunk.path, len(order)) for chunk in chunks]
    ids = []
    for path in order:
        if chunks[per_chunk.index(order[path])].kind in FOLDER_KINDS:
            names = [_relative(path, f) for chunk in chunks if chunk.path == path for f in chunk.files]
            ids.append(InputId(_relative(root, path), len(names), _digest("\n".join(names).encode())))
        else:
            size = input_size(path)
            ids.append(InputId(_relative(root, path), size, _digest(read_range(path, 0, min(size, HEAD_BYTES)))))
    return ids, per_chunk


def _bad(label: str, detail: str) -> IndexFormatError:
    return IndexFormatError(label, f"{PROVENANCE_KEY}: {detail}")


def _row(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOTAL_SAMPLES


def _parse_input(obj: Any, label: str, i: int) -> InputId:
    if not isinstance(obj, dict) or set(obj) != {"head", "name", "size"} or not isinstance(obj["name"], str) \
            or not isinstance(obj["head"], str) or not _row(obj["size"]):
        raise _bad(label, f"inputs[{i}] must be {{name: str, size: int >= 0, head: str}}, got {str(obj)[:80]}")
    return InputId(obj["name"], obj["size"], obj["head"])


def _parse_segments(basename: Any, segments: Any, inputs: int, label: str) -> list[Segment]:
    if not isinstance(basename, str) or not isinstance(segments, list):
        raise _bad(label, f"shards must map basenames to lists of [input, first, last], got {str(basename)[:80]}")
    out = []
    for seg in segments:
        if not (isinstance(seg, list) and len(seg) == 3 and all(_row(v) for v in seg) and seg[0] < inputs
                and seg[1] <= seg[2]):
            raise _bad(label, f"{basename}: segment {str(seg)[:80]} is not [input, first, last] with an input "
                       f"below {inputs} and first <= last")
        out.append((seg[0], seg[1], seg[2] + 1))
    return out


@dataclass
class Provenance:
    """The inputs of a dataset's conversions and, per shard (by raw basename), the rows it holds."""

    inputs: list[InputId] = field(default_factory=list)
    shards: dict[str, list[Segment]] = field(default_factory=dict)

    @classmethod
    def from_extensions(cls, extensions: Mapping[str, Any], label: str) -> Provenance | None:
        """The provenance of an index's (or journal's) extensions, None if it records none;
        IndexFormatError naming `label` if it is malformed (index.json is untrusted input)."""
        obj = extensions.get(PROVENANCE_KEY)
        if obj is None:
            return None
        if not isinstance(obj, dict) or obj.get("version") != 1 or not isinstance(obj.get("inputs"), list) \
                or not isinstance(obj.get("shards"), dict):
            raise _bad(label, "expected {version: 1, inputs: [...], shards: {...}}")
        inputs = [_parse_input(item, label, i) for i, item in enumerate(obj["inputs"])]
        shards = {name: _parse_segments(name, segs, len(inputs), label) for name, segs in obj["shards"].items()}
        return cls(inputs, shards)

    def to_json(self, basenames: Sequence[str]) -> dict[str, Any]:
        """The record of the shards named (those of the index it goes into), every input kept."""
        shards = {name: [[i, first, stop - 1] for i, first, stop in self.shards[name]]
                  for name in basenames if name in self.shards}
        return {"inputs": [item.to_json() for item in self.inputs], "shards": shards, "version": 1}

    def add_input(self, item: InputId) -> int:
        """The index of `item` among the inputs, added if new (the same input converted again keeps its
        index, so its rows can be recognised as stored twice)."""
        if item not in self.inputs:
            self.inputs.append(item)
        return self.inputs.index(item)

    def describe(self, segments: Sequence[Segment]) -> str:
        return ", ".join(f"{self.inputs[i]} rows {first}..{stop - 1}" for i, first, stop in segments) or "no rows"


def split_runs(runs: Sequence[Segment], counts: Sequence[int]) -> list[list[Segment]]:
    """Consecutive `runs` of rows cut into pieces of `counts` rows each (shards' sample counts)."""
    out: list[list[Segment]] = []
    queue = list(runs)
    for count in counts:
        piece: list[Segment] = []
        while count > 0 and queue:
            i, first, stop = queue[0]
            take = min(count, stop - first)
            piece.append((i, first, first + take))
            count -= take
            queue[0] = (i, first + take, stop)
            if first + take == stop:
                queue.pop(0)
        out.append(merge_segments(piece))
    return out


def merge_segments(segments: Sequence[Segment]) -> list[Segment]:
    """Adjacent segments of one input's consecutive rows joined into one."""
    out: list[Segment] = []
    for seg in segments:
        if seg[1] == seg[2]:
            continue
        if out and out[-1][0] == seg[0] and out[-1][2] == seg[1]:
            out[-1] = (seg[0], out[-1][1], seg[2])
        else:
            out.append(seg)
    return out


def provenance_problems(extensions: Mapping[str, Any], shards: Sequence[tuple[str, int]], label: str) -> list[str]:
    """What `verify` reports from the recorded provenance (`extensions` of index.json) of `shards` ((data
    file basename, samples) in index order): source rows stored in more than one shard (or twice in one),
    and shards whose recorded rows do not add up to their samples."""
    try:
        found = Provenance.from_extensions(extensions, label)
    except IndexFormatError as exc:
        return [str(exc)]
    if found is None:
        return []
    problems: list[str] = []
    by_input: dict[InputId, list[tuple[int, int, int, str]]] = {}
    for shard, (basename, samples) in enumerate(shards):
        segments = found.shards.get(basename)
        if segments is None:
            continue
        rows = sum(stop - first for _, first, stop in segments)
        if rows != samples:
            problems.append(f"{label} (shard {shard}): {PROVENANCE_KEY} records {rows} rows for "
                            f"{basename!r}, which holds {samples} samples")
        for i, first, stop in segments:
            by_input.setdefault(found.inputs[i], []).append((first, stop, shard, basename))
    for item, spans in by_input.items():
        problems += _overlaps(label, item, spans)
    return problems


def _overlaps(label: str, item: InputId, spans: list[tuple[int, int, int, str]]) -> list[str]:
    """One problem per span that repeats rows of an earlier one (spans sorted by first row)."""
    out = []
    reach: tuple[int, int, int, str] | None = None  # the span seen so far that reaches furthest
    for span in sorted(spans):
        if reach is not None and span[0] < reach[1]:
            first, last = span[0], min(span[1], reach[1]) - 1
            out.append(f"{label}: {item} rows {first}..{last} are stored twice: in shard {reach[2]} "
                       f"({reach[3]}) and in shard {span[2]} ({span[3]}); the same source rows were written "
                       "again (a conversion resumed or appended twice?)")
        if reach is None or span[1] > reach[1]:
            reach = span
    return out


class SourceRecorder:
    """A writer's record of where the samples of each shard it cuts came from (`ShardWriter(sources=)`).

    `sources` are this write's inputs; `add(source, first, count)` takes an index into them. The record
    starts from the provenance of the shards the write keeps (an appended dataset's, a resumed write's)."""

    def __init__(self, base: Provenance | None, sources: Sequence[InputId]) -> None:
        self.provenance = base or Provenance()
        self.ids = [self.provenance.add_input(item) for item in sources]
        self._open: list[Segment] | None = []  # rows of the shard being filled; None: some of unknown origin

    def add(self, source: int, first: int, count: int) -> None:
        """The shard being filled takes rows first..first+count-1 of `sources[source]`."""
        if self._open is None or count == 0:
            return
        i = self.ids[source]
        if self._open and self._open[-1][0] == i and self._open[-1][2] == first:
            self._open[-1] = (i, self._open[-1][1], first + count)
        else:
            self._open.append((i, first, first + count))

    def unknown(self) -> None:
        """The shard being filled takes samples of no recorded origin (`ShardWriter.write`): no record."""
        self._open = None

    def cut(self, basename: str) -> None:
        """The shard being filled is cut, as `basename`."""
        if self._open is not None:
            self.provenance.shards[basename] = self._open
        else:
            self.provenance.shards.pop(basename, None)
        self._open = []

    def extensions(self, base: Mapping[str, Any], shards: Sequence[ShardEntry]) -> dict[str, Any]:
        """`base` (the index's other extensions) with the record of `shards`."""
        return {**base, PROVENANCE_KEY: self.provenance.to_json([entry.raw_data.basename for entry in shards])}

    def resumed(self, kept: Sequence[ShardEntry], runs: Sequence[Segment], label: str) -> None:
        """The shards a resumed write kept hold the first rows of this write's input, `runs` (indexes into
        `sources`): recorded for them; where the journal recorded them, they must be the same rows, else
        the input is not the one the interrupted write was converting (NotResumable)."""
        prov = self.provenance
        runs = [(self.ids[i], first, stop) for i, first, stop in runs]
        derived = dict(zip([e.raw_data.basename for e in kept], split_runs(runs, [e.samples for e in kept]),
                           strict=True))
        for name, pieces in derived.items():  # all checked before any is recorded: a refused resume
            recorded = prov.shards.get(name)  # must leave the journal as it found it
            if recorded is not None and recorded != pieces:
                raise NotResumable(f"{label}: the interrupted write stored {prov.describe(recorded)} in {name}, "
                                   f"but this input puts {prov.describe(pieces)} there: it is not the input "
                                   "that write was converting; resume with the same input and options, or "
                                   "pass mode='overwrite' to start over")
        prov.shards.update(derived)
