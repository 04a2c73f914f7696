"""Object stores (S3 and S3-compatible, GCS, Azure, in-memory) as a Store, through obstore.

One obstore client per bucket is shared by every `child()` store, so a dataset with thousands of
shards reuses one connection pool. obstore's own retries are switched off: `call_with_retry`
owns the policy, so the attempt count users configure is the one they get.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import obstore

from tessera.storage.base import Data, ObjectInfo, Store
from tessera.storage.errors import NotFound
from tessera.storage.fork_gate import note_request
from tessera.storage.retry import RetryBudget, RetryPolicy, call_with_retry
from tessera.storage.url import ParsedURL, check_key, join_key

MULTIPART_THRESHOLD = 16 << 20
PART_SIZE = 8 << 20
STREAM_CHUNK = 256 << 10  # bytes a streamed download holds at once per range


def _info(meta: dict[str, Any], prefix: str) -> ObjectInfo:
    path = meta["path"]
    key = path[len(prefix) + 1 :] if prefix else path
    return ObjectInfo(key, int(meta["size"]), meta.get("e_tag"), meta.get("last_modified"))


class ObjectStore(Store):
    """Keys live under `prefix` inside one bucket held by the obstore client `client`."""

    def __init__(self, client: Any, parsed: ParsedURL, retry: RetryPolicy) -> None:
        self.client = client
        self.parsed = parsed
        self.prefix = parsed.prefix
        self.url = parsed.root_url()
        self.retry = retry
        self.endpoint = endpoint_of(client)

    def _full(self, key: str) -> str:
        return join_key(self.prefix, check_key(key, self.url_for(key)))

    def url_for(self, key: str) -> str:
        return f"{self.url}/{key}"

    def _call(self, key: str, fn: Any) -> Any:
        note_request()  # see fork_gate.py: a first request waits for a fork in progress
        return call_with_retry(fn, self.url_for(key), self.retry, self.endpoint)

    def get(self, key: str) -> bytes:
        path = self._full(key)
        return self._call(key, lambda: obstore.get(self.client, path).bytes().to_bytes())

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        path = self._full(key)
        return self._call(key, lambda: obstore.get_range(self.client, path, start=start, end=end).to_bytes())

    def get_range_buffer(self, key: str, start: int, end: int) -> Any:
        path = self._full(key)
        return self._call(key, lambda: obstore.get_range(self.client, path, start=start, end=end))

    def write_range(self, key: str, start: int, end: int, fd: int, progress: Any = None) -> int:
        """Stream [start, end) into `fd` in chunks of STREAM_CHUNK: a 16 MiB range held whole cost 16 MiB
        of memory per concurrent range (4 ranges x 4 prefetches = 256 MiB per DataLoader worker).
        A retried attempt writes the same offsets again."""
        path = self._full(key)

        def attempt() -> int:
            at = start
            for chunk in obstore.get(self.client, path, options={"range": (start, end)}).stream(
                    min_chunk_size=STREAM_CHUNK):
                view = memoryview(chunk)
                while view:
                    written = os.pwrite(fd, view, at)
                    view, at = view[written:], at + written
            return at - start

        got = self._call(key, attempt)
        if progress:
            progress(got)
        return got

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        path = self._full(key)
        todo = [(i, s, e) for i, (s, e) in enumerate(ranges) if e > s]
        out = [b""] * len(ranges)
        if todo:
            starts, ends = [s for _, s, _ in todo], [e for _, _, e in todo]
            got = self._call(key, lambda: obstore.get_ranges(self.client, path, starts=starts, ends=ends))
            for (i, _, _), buf in zip(todo, got, strict=True):
                out[i] = buf.to_bytes()
        return out

    def put(self, key: str, data: Data) -> None:
        path = self._full(key)
        payload = bytes(data) if isinstance(data, (bytearray, memoryview)) else data
        big = len(payload) > MULTIPART_THRESHOLD
        self._call(key, lambda: obstore.put(self.client, path, payload, use_multipart=big,
                                            chunk_size=PART_SIZE))

    def put_file(self, key: str, path: str | Path) -> None:
        dest = self._full(key)
        src = Path(path)
        big = src.stat().st_size > MULTIPART_THRESHOLD
        # A multipart upload is atomic on S3: the object appears only when the upload completes.
        self._call(key, lambda: obstore.put(self.client, dest, src, use_multipart=big, chunk_size=PART_SIZE))

    def _put_create(self, key: str, data: Data) -> None:
        path = self._full(key)
        payload = bytes(data)
        self._call(key, lambda: obstore.put(self.client, path, payload, mode="create"))

    def head(self, key: str) -> ObjectInfo:
        path = self._full(key)
        meta = self._call(key, lambda: obstore.head(self.client, path))
        return _info(meta, self.prefix)

    def list(self, prefix: str = "", *, start_after: str = "") -> Iterator[ObjectInfo]:
        """Stream the listing page by page; a transient failure resumes after the last key seen."""
        seg_prefix, _, _ = prefix.rpartition("/")  # obstore lists by whole path segments
        full = join_key(self.prefix, seg_prefix) if seg_prefix else (self.prefix or None)
        last: str | None = join_key(self.prefix, start_after) if start_after else None
        note_request()
        budget, url = RetryBudget(self.retry), self.url_for(prefix) if prefix else self.url
        while True:
            budget.start()
            try:
                for page in obstore.list(self.client, prefix=full, offset=last, chunk_size=1000):
                    for meta in page:
                        last = meta["path"]
                        info = _info(meta, self.prefix)
                        if info.key.startswith(prefix):
                            yield info
                return
            except Exception as exc:  # noqa: BLE001 - classified like every other call
                budget.failed(exc, url, self.endpoint)

    def delete(self, key: str) -> None:
        path = self._full(key)
        try:
            self._call(key, lambda: obstore.delete(self.client, path))
        except NotFound:
            pass

    def delete_many(self, keys: Sequence[str] | Any) -> None:
        paths = [self._full(k) for k in keys]
        for i in range(0, len(paths), 1000):  # S3 DeleteObjects takes at most 1000 keys
            batch = paths[i : i + 1000]
            try:
                self._call(batch[0], lambda b=batch: obstore.delete(self.client, b))
            except NotFound:
                pass

    def copy(self, src_key: str, dst_key: str) -> None:
        src, dst = self._full(src_key), self._full(dst_key)
        self._call(src_key, lambda: obstore.copy(self.client, src, dst, overwrite=True))

    def copy_to(self, src_key: str, other: ObjectStore, dst_key: str) -> None:
        """Server-side copy into another store that shares this client (same bucket)."""
        src, dst = self._full(src_key), other._full(dst_key)
        self._call(src_key, lambda: obstore.copy(self.client, src, dst, overwrite=True))

    def child(self, prefix: str) -> ObjectStore:
        sub = self._full(prefix.strip("/"))
        return ObjectStore(self.client, ParsedURL(self.parsed.scheme, self.parsed.bucket, sub), self.retry)


def client_options(retry: RetryPolicy, allow_http: bool) -> dict[str, Any]:
    """HTTP client timeouts: connect and first-byte waits are capped by the policy's total deadline."""
    return {
        "timeout": f"{retry.request_timeout}s",
        "connect_timeout": f"{min(retry.connect_timeout, retry.total_timeout)}s",
        "read_timeout": f"{min(retry.read_timeout, retry.total_timeout)}s",
        "allow_http": allow_http,
    }


def endpoint_of(client: Any) -> str | None:
    """The host a client talks to, for errors that must say which endpoint did not answer."""
    config = getattr(client, "config", None) or {}
    if config.get("endpoint"):
        return str(config["endpoint"])
    kind = type(client).__name__
    if kind == "S3Store":
        return f"https://s3.{config.get('region', 'us-east-1')}.amazonaws.com"
    if kind == "GCSStore":
        return "https://storage.googleapis.com"
    if kind == "AzureStore" and config.get("account_name"):
        return f"https://{config['account_name']}.blob.core.windows.net"
    return None


def no_retry_config() -> dict[str, Any]:
    return {"max_retries": 0, "retry_timeout": timedelta(seconds=1),
            "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=1),
                        "base": 2}}

