"""Local files for a dataset's shards: the files themselves when possible, else a cache copy.

A local uncompressed dataset is read in place (nothing copied). Compressed shards are decompressed into
the cache folder once, and remote shards are downloaded there on first use. Every file appears in the
cache atomically (temp file + rename), so concurrent processes sharing a cache never read a partial
shard; the worst case of a race is the same file fetched twice.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tessera.shards.compression import CHUNK, Compression, InflateLimitError, parse_compression
from tessera.shards.errors import CorruptShard, HashMismatch, MissingShard, TruncatedShard
from tessera.shards.hashing import Digests
from tessera.shards.index import FileInfo, ShardEntry, shard_key
from tessera.shards.reader import verify_digests
from tessera.storage import IntegrityError, NotFound, Store, download_from
from tessera.storage.local import temp_path_for


def default_cache_dir(url: str) -> Path:
    """A per-dataset cache folder under $TESSERA_CACHE (default ~/.cache/tessera)."""
    root = Path(os.environ.get("TESSERA_CACHE", "~/.cache/tessera")).expanduser()
    return root / "datasets" / hashlib.sha256(url.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ShardFiles:
    """The local, uncompressed files of one shard (`meta` only for JSON/CSV/TSV/XSV shards)."""

    data: Path
    meta: Path | None = None


class ShardFetcher:
    """Resolves shard entries of one dataset (a store, optionally a split child) to local files."""

    def __init__(self, store: Store, cache_dir: str | Path | None = None, verify_hashes: bool = False) -> None:
        self.store = store
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(store.url)
        self.verify_hashes = verify_hashes

    def files(self, entry: ShardEntry, shard: int) -> ShardFiles:
        """Local files for `entry`, fetching and decompressing as needed."""
        data = self._raw_file(entry.raw_data, entry.zip_data, entry.compression, shard)
        meta = None
        if entry.raw_meta is not None:
            meta = self._raw_file(entry.raw_meta, entry.zip_meta, entry.compression, shard)
        return ShardFiles(data, meta)

    def label(self, basename: str) -> str:
        """How errors name a shard file: its URL in the store."""
        return self.store.url_for(shard_key(basename))

    def _raw_file(self, raw: FileInfo, zipped: FileInfo | None, compression: str | None, shard: int) -> Path:
        key = shard_key(raw.basename)
        in_place = self.store.local_path(key)
        if in_place is not None and (zipped is None or _has_size(in_place, raw.bytes)):
            return in_place  # a local dataset: read the file itself (the reader reports a bad size)
        cached = self.cache_dir / key
        if _has_size(cached, raw.bytes):
            return cached
        if zipped is None:
            self._download(key, cached, raw.bytes, shard)
            return cached
        self._decompress(zipped, compression, raw, cached, shard)
        return cached

    def _download(self, key: str, dest: Path, size: int, shard: int) -> None:
        label = self.store.url_for(key)
        try:
            download_from(self.store, key, dest, size=size)
        except NotFound:
            raise MissingShard(label, "shard file is missing from the store", shard) from None
        except IntegrityError as err:
            raise TruncatedShard(label, f"stored size differs from index.json ({err})", shard) from None

    def _decompress(self, zipped: FileInfo, compression: str | None, raw: FileInfo, dest: Path, shard: int) -> None:
        zkey = shard_key(zipped.basename)
        label = self.store.url_for(zkey)
        zpath = self.store.local_path(zkey)
        downloaded = zpath is None
        if zpath is None:
            zpath = self.cache_dir / zkey
            self._download(zkey, zpath, zipped.bytes, shard)
        check = sorted(zipped.hashes) if self.verify_hashes else ()
        decompress_file(zpath, zipped, compression, raw, dest, label, shard, check)
        if downloaded:
            zpath.unlink(missing_ok=True)  # the decompressed copy is what readers use


def decompress_file(zpath: Path, zipped: FileInfo, compression: str | None, raw: FileInfo, dest: Path,
                    label: str, shard: int | None, check: Collection[str] = ()) -> None:
    """Decompress a stored shard file into `dest` atomically, streaming, checking sizes on the way.

    Memory stays O(chunk) whatever the stream inflates to, and the output may not pass the raw size
    index.json declares (a corrupt shard or a decompression bomb is an error naming both sizes).
    `check` names hash algorithms whose recorded digests of the compressed file (before decoding, as
    MosaicML does) and of the decompressed bytes (as they are written) must match.
    """
    codec = parse_compression(compression)
    try:
        src = open(zpath, "rb")  # noqa: SIM115 - closed by the with-block below
    except FileNotFoundError:
        raise MissingShard(label, "compressed shard file is missing", shard) from None
    with src:
        size = os.fstat(src.fileno()).st_size
        if size != zipped.bytes:
            raise TruncatedShard(label, f"file has {size} bytes but index.json records {zipped.bytes}", shard)
        if check and size:
            with mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as blob:
                verify_digests(blob, zipped, label, shard, check)
        _inflate_into(src, codec, raw, dest, label, shard, check)


def _inflate_into(src: BinaryIO, codec: Compression | None, raw: FileInfo, dest: Path, label: str,
                  shard: int | None, check: Collection[str]) -> None:
    digests = Digests(check)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(dest)
    pieces = codec.inflate(src, raw.bytes) if codec else iter(lambda: src.read(CHUNK), b"")
    try:
        with open(tmp, "wb") as out:
            while (piece := _next_piece(pieces, codec, raw, label, shard)) is not None:
                digests.update(piece)
                out.write(piece)
            seen = out.tell()
        if seen != raw.bytes:
            raise CorruptShard(label, f"decompresses to {seen} bytes but index.json records {raw.bytes}", shard)
        for algo, got in digests.hexdigests().items():
            if got != raw.hashes[algo].lower():
                raise HashMismatch(label, f"decompressed {algo} digest is {got} but index.json records "
                                   f"{raw.hashes[algo]}", shard)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _next_piece(pieces: Iterator[bytes], codec: Compression | None, raw: FileInfo, label: str,
                shard: int | None) -> bytes | None:
    """The next decompressed piece (None at the end); a codec failure is a CorruptShard naming the shard.

    Kept apart from the writes: codec libraries raise OSError too (gzip, bz2), which must not pass for
    a disk error."""
    try:
        return next(pieces, None)
    except InflateLimitError as err:
        raise CorruptShard(label, f"decompresses to more than the {raw.bytes} bytes index.json records for "
                           f"{raw.basename} (stopped at {err.seen}): a corrupt shard or a decompression bomb",
                           shard) from None
    except Exception as err:  # every codec library has its own error type (some with no message)
        reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise CorruptShard(label, f"cannot decompress as {codec.text if codec else None}: {reason}",
                           shard) from None


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False
