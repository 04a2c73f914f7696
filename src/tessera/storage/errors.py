"""Storage errors users can catch, and the one place that maps backend exceptions onto them.

Every error carries the URL it concerns, and its message names the likely fix, because the person
reading it is usually looking at a training job that died far away from their laptop.
"""

from __future__ import annotations

import errno
import re

_CRED_HINT = "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / S3_ENDPOINT_URL (or the store options)"


class StorageError(Exception):
    """Base class: something went wrong reading or writing `url`.

    Subclasses also derive from the built-in exception MosaicML Streaming raises for the same case
    (ValueError, FileNotFoundError, ...), so `except` clauses written for it still catch ours.
    """

    __str__ = BaseException.__str__  # the message as given, not OSError's "[Errno ...]" form

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class InvalidURL(StorageError, ValueError):
    """A URL or key is malformed, unsupported, or tries to climb out of its root."""


class NotFound(StorageError, FileNotFoundError):
    """The object does not exist (a FileNotFoundError, as MosaicML raises for a missing object)."""


class BucketNotFound(StorageError, FileNotFoundError):
    """The bucket (or container) does not exist."""


class PermissionDenied(StorageError, PermissionError):
    """Credentials are missing, wrong, or lack the needed permission."""


class AlreadyExists(StorageError, FileExistsError):
    """A conditional write found the key already present."""


class PreconditionFailed(StorageError):
    """A conditional write lost a race (ETag changed)."""


class TransientError(StorageError):
    """A retryable failure (5xx, throttling, timeout, reset) that outlived the retry policy."""


class EndpointTimeout(TransientError, TimeoutError):
    """The object store's endpoint did not answer in time (no connection or no first byte): it is down,
    firewalled, or S3_ENDPOINT_URL names the wrong host or port. `endpoint` says which one."""

    def __init__(self, message: str, url: str = "", endpoint: str = "") -> None:
        super().__init__(message, url)
        self.endpoint = endpoint


class IntegrityError(StorageError, ValueError):
    """Bytes do not match the expected size or hash (downloaded now, or found in a cache).

    Also a ValueError: MosaicML Streaming raises ValueError for a checksum failure, so code written for
    it (`except ValueError`) still catches ours."""


_TRANSIENT_PATTERNS = re.compile(
    r"(\b5\d\d\b|SlowDown|RequestTimeout|InternalError|ServiceUnavailable|timed? ?out|timeout|"
    r"connection|reset|broken pipe|error sending request|error decoding response body|"
    r"incomplete|unexpected eof|hyper|dns error)",
    re.IGNORECASE,
)


_STATUS = re.compile(r"status code: (\d{3})")
_TIMEOUT = re.compile(r"kind: Timeout|timed out|deadline has elapsed", re.IGNORECASE)


def is_transient(exc: BaseException) -> bool:
    """True when retrying may succeed: throttling, 5xx, timeouts, dropped connections."""
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, StorageError):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT):
        return True
    name = type(exc).__name__
    if name in ("GenericError", "BaseError") or name.endswith("IOError"):
        text = str(exc)
        status = _STATUS.search(text)
        if status:  # the server answered: its status code decides
            code = int(status.group(1))
            return code >= 500 or code in (408, 429)
        return bool(_TRANSIENT_PATTERNS.search(text))
    return False


def translate(exc: BaseException, url: str, endpoint: str | None = None) -> StorageError:
    """Turn a backend exception (obstore, OSError) into a StorageError subclass naming `url` (and the
    `endpoint`, when it is the one that did not answer)."""
    if isinstance(exc, StorageError):
        return exc
    text = str(exc)
    first = text.splitlines()[0][:300] if text else type(exc).__name__
    name = type(exc).__name__
    if endpoint and (isinstance(exc, TimeoutError) or (_TIMEOUT.search(text) and not _STATUS.search(text))):
        return EndpointTimeout(f"{url}: the endpoint {endpoint} did not answer in time; check that it is up and "
                               f"reachable, and S3_ENDPOINT_URL (the wait is bounded by TESSERA_S3_TIMEOUT "
                               f"seconds) ({first})", url, endpoint)
    if "NoSuchBucket" in text or "ContainerNotFound" in text:
        return BucketNotFound(f"{url}: bucket does not exist; create it or fix the URL ({first})", url)
    if name == "AlreadyExistsError" or isinstance(exc, FileExistsError):
        return AlreadyExists(f"{url}: already exists", url)
    if name == "PreconditionError":
        return PreconditionFailed(f"{url}: conditional write failed: the object changed ({first})", url)
    if name in ("PermissionDeniedError", "UnauthenticatedError") or isinstance(exc, PermissionError):
        return PermissionDenied(f"{url}: access denied; {_CRED_HINT} ({first})", url)
    if isinstance(exc, FileNotFoundError) or name == "NotFoundError":
        return NotFound(f"{url}: no such object", url)
    if name == "InvalidPathError":
        return InvalidURL(f"{url}: invalid path ({first})", url)
    if is_transient(exc):
        return TransientError(f"{url}: transient failure persisted after retries ({first})", url)
    if "403" in text or "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
        return PermissionDenied(f"{url}: access denied; {_CRED_HINT} ({first})", url)
    return StorageError(f"{url}: {first}", url)
