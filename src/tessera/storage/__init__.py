"""Where bytes live: one Store interface over local folders and object stores (via obstore).

See docs/storage-api.md for the contract. Everything above this layer (shards, stream, train)
reads and writes through `open_store(url)`.

- `open_store(url)` -> `Store`: get, ranged and concurrent gets, atomic and conditional puts, list,
  delete, copy; `ObjectInfo` is what `head` and `list` return.
- `download(url, path)`, `download_from(store, key, path)`, `upload(path, url)`,
  `copy_between(src, key, dst, key)`: whole-file transfers, verified and atomic.
- `RetryPolicy`: jittered retries for transient errors; `split_url` splits off the last key.
- Errors derive from `StorageError` and name the URL.
"""

from tessera.storage.base import ObjectInfo, Store
from tessera.storage.errors import (
    AlreadyExists,
    BucketNotFound,
    IntegrityError,
    InvalidURL,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    StorageError,
    TransientError,
)
from tessera.storage.open import open_store
from tessera.storage.retry import RetryPolicy
from tessera.storage.transfer import copy_between, download, download_from, upload
from tessera.storage.url import split_url

__all__ = [
    "AlreadyExists", "BucketNotFound", "IntegrityError", "InvalidURL", "NotFound", "ObjectInfo",
    "PermissionDenied", "PreconditionFailed", "RetryPolicy", "StorageError", "Store", "TransientError",
    "copy_between", "download", "download_from", "open_store", "split_url", "upload",
]
