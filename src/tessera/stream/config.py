"""The stream layer's typed description of a stream and of a dataset's options, with MosaicML Streaming's
names: `Stream` checks its arguments through `StreamConfig`, and a recipe's data section is made of these
models (llm/recipe.py), so a stream is described, checked and documented in one place."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from tessera.typed_config import one_message, storage_url

StorageURL = Annotated[str | None, BeforeValidator(storage_url)]


class StreamConfig(BaseModel):
    """One dataset of a mix. At most one of proportion, repeat, choose weights it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    remote: StorageURL = Field(None, description="Where the shards live (a URL or path); None: local holds them.")
    local: StorageURL = Field(None, description="The cache folder; None: one under the temp dir per remote.")
    split: str | None = Field(None, description="A sub-folder of remote and local (train, val).")
    proportion: float | None = Field(None, ge=0, description="This stream's share of each epoch.")
    repeat: float | None = Field(None, ge=0, description="Samples per epoch as a multiple of the stream's size.")
    choose: int | None = Field(None, ge=0, description="Samples per epoch from this stream.")
    download_retry: int | None = Field(None, ge=0, description="Retries per download; None: the dataset's.")
    download_timeout: float | None = Field(None, gt=0, description="Seconds per download; None: the dataset's.")
    validate_hash: str | None = Field(None, description="Check each shard with this hash (e.g. xxh64).")
    keep_zip: bool | None = Field(None, description="Keep compressed shards after decompressing them.")

    @model_validator(mode="after")
    def _where_and_weight(self) -> StreamConfig:
        if self.remote is None and self.local is None:
            raise ValueError("a Stream needs a remote URL, a local folder, or both")
        given = [n for n in ("proportion", "repeat", "choose") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"a Stream takes at most one of proportion, repeat, choose; got {given}")
        return self

    @classmethod
    def check(cls, **arguments: Any) -> StreamConfig:
        """The config of a `Stream`'s arguments, or one ValueError naming the argument."""
        try:
            return cls(**arguments)
        except ValidationError as exc:
            raise ValueError(one_message(exc)) from None


class StreamingConfig(BaseModel):
    """A dataset of streams and its loader: the options a run description (a recipe) sets."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    streams: list[StreamConfig] = Field(min_length=1, description="The datasets to mix.")
    shuffle: bool = Field(False, description="Shuffle the samples (deterministically, for any world size).")
    shuffle_seed: int = Field(9176, description="The shuffle's seed.")
    num_canonical_nodes: int | None = Field(None, ge=1, description="Fixes the order across world sizes; "
                                                                    "None: the first run's node count.")
    shuffle_block_size: int | None = Field(None, ge=1, description="Samples shuffled together.")
    cache_limit: int | str | None = Field(None, description="Evict shards above this size (bytes, or '10gb').")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes.")

    def dataset_options(self) -> dict[str, Any]:
        """StreamingDataset's keyword arguments (without the streams and the batch size)."""
        return self.model_dump(include={"shuffle", "shuffle_seed", "num_canonical_nodes", "shuffle_block_size",
                                        "cache_limit"})
