"""Where bytes live: one Store interface over local folders and object stores (via obstore).

See docs/storage-api.md for the contract. Everything above this layer (shards, stream, train)
reads and writes through `open_store(url)`.
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
from tessera.storage.local import LocalStore
from tessera.storage.open import open_store
from tessera.storage.remote import ObjectStore
from tessera.storage.retry import RetryPolicy, call_with_retry
from tessera.storage.transfer import copy_between, download, download_from, hash_file, new_hasher, upload
from tessera.storage.url import check_key, parse_url, split_url

__all__ = [
    "AlreadyExists", "BucketNotFound", "IntegrityError", "InvalidURL", "LocalStore", "NotFound",
    "ObjectInfo", "ObjectStore", "PermissionDenied", "PreconditionFailed", "RetryPolicy", "StorageError",
    "Store", "TransientError", "call_with_retry", "check_key", "copy_between", "download", "download_from",
    "hash_file", "new_hasher", "open_store", "parse_url", "split_url", "upload",
]
