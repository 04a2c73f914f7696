"""`MDSDatasink`: write any Ray Dataset as one MDS dataset, each write task a part, one merged index.

    ds = ray.data.read_parquet("s3://bucket/raw/")
    ds.write_datasink(MDSDatasink("s3://bucket/mds", columns={"text": "str", "id": "int64"}))

Each write task of Ray Data writes its blocks with a `ShardWriter` into `OUT/part-NNNNN/` (NNNNN is the
task's index), committing that folder's index.json last and in `overwrite` mode, so a task Ray retries
after its worker died replaces its own part and nothing else. When every task is done, the driver
merges the parts' indexes in task order into `OUT/index.json` and writes it last (`ray_engine.commit_parts`).

Sample order is the order in which Ray Data hands blocks to the write tasks: set
`DataContext.get_current().execution_options.preserve_order = True` for the dataset's own order (Ray
Data may otherwise reorder blocks to keep workers busy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ray.data import Datasink
from ray.data.block import Block, BlockAccessor

from tessera.shards.dataset import open_dataset_store
from tessera.shards.ray_engine import check_target, commit_parts, part_name, write_rows_to_part

try:  # where Ray keeps them moves between versions
    from ray.data._internal.execution.interfaces import TaskContext
    from ray.data.datasource.datasink import WriteResult
except ImportError:  # pragma: no cover
    TaskContext = WriteResult = Any  # type: ignore[misc,assignment]


class MDSDatasink(Datasink):
    """A Ray Data sink writing MDS shards straight to `out` (a bucket, or a folder every node sees).

    Args:
        out: dataset URL or folder.
        columns: {name: MDS encoding}, as for `ShardWriter`.
        compression: as for `ShardWriter`.
        hashes: as for `ShardWriter`.
        size_limit: as for `ShardWriter`.
        mode: "create" (refuses an existing dataset or an unfinished distributed write) or "overwrite".
    """

    def __init__(self, out: str, columns: Mapping[str, str], *, compression: str | None = None,
                 hashes: Iterable[str] | None = None, size_limit: int | str | None = "64mb",
                 mode: str = "create") -> None:
        if mode not in ("create", "overwrite"):
            raise ValueError(f"MDSDatasink supports mode create or overwrite, got {mode!r}")
        if str(out).startswith("memory://"):
            raise ValueError("memory:// stores live in one process; Ray write tasks run in others")
        self.url = open_dataset_store(out).url
        self.columns = dict(columns)
        self.compression = compression
        self.hashes = tuple(hashes) if hashes else None
        self.size_limit = size_limit
        self.mode = mode

    def on_write_start(self, schema: Any = None) -> None:
        check_target(open_dataset_store(self.url), self.mode)

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> dict[str, Any]:
        rows = (dict(row) for block in blocks for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True))
        samples = write_rows_to_part(self.url, ctx.task_idx, self.columns, rows, compression=self.compression,
                                     hashes=self.hashes, size_limit=self.size_limit)
        return {"part": part_name(ctx.task_idx), "samples": samples}

    def on_write_complete(self, write_result: WriteResult) -> None:
        returns = getattr(write_result, "write_returns", write_result)
        names = sorted(r["part"] for r in returns if r["samples"])  # a task given no rows lists nothing
        commit_parts(open_dataset_store(self.url), names)

    def get_name(self) -> str:
        return "MDS"
