"""Parse storage URLs and validate keys.

Keys come from index files and run specs written by other people, so they are checked: a key that
is absolute, empty or climbs out of its root with '..' is refused rather than resolved.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from tessera.storage.errors import InvalidURL

REMOTE_SCHEMES = ("s3", "gs", "az", "abfs", "abfss", "memory")


class MalformedURL(InvalidURL):
    """The text cannot name a location at all (`s3:/bucket`, `ftp://...`, `s3://`): a mistake in what the
    user typed, so the CLI exits 2 as for any usage error. (A key from an index is checked by `check_key`.)"""


# `s3:/bucket/x` or `s3:bucket` has no '://', so it would silently be a local folder named 's3:'.
_SCHEME_WITHOUT_SLASHES = re.compile(r"^(" + "|".join(REMOTE_SCHEMES) + r"):/?(?!/)", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedURL:
    """A storage location: scheme ('file' for local paths), bucket (or '' / memory name), prefix."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def root_url(self) -> str:
        if self.is_local:
            return self.prefix
        base = f"{self.scheme}://{self.bucket}"
        return f"{base}/{self.prefix}" if self.prefix else base


def parse_url(url: str | os.PathLike[str]) -> ParsedURL:
    """Split a URL or local path into scheme, bucket and prefix (no trailing slash)."""
    text = os.fspath(url)
    if "://" not in text:
        if not text:
            raise MalformedURL("empty storage URL", text)
        if (typo := _SCHEME_WITHOUT_SLASHES.match(text)) is not None:
            scheme, rest = typo.group(1), text[typo.end():]
            raise MalformedURL(f"{text}: a URL needs two slashes after '{scheme}:' (write {scheme}://{rest}); "
                             f"for a local folder whose name starts with '{scheme}:', write ./{text}", text)
        return ParsedURL("file", "", str(Path(text).expanduser().resolve()))
    parts = urlparse(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return ParsedURL("file", "", str(Path(parts.path).resolve()))
    if scheme not in REMOTE_SCHEMES:
        raise MalformedURL(f"{text}: unsupported scheme {scheme!r}; use a local path, file://, "
                         f"s3://, gs://, az://, abfs:// or memory://", text)
    bucket = parts.netloc
    if not bucket and scheme != "memory":
        raise MalformedURL(f"{text}: missing bucket name (expected {scheme}://BUCKET/prefix)", text)
    prefix = parts.path.strip("/")
    if prefix:
        check_key(prefix, text)
    return ParsedURL(scheme, bucket or "default", prefix)


def check_key(key: str, url: str = "") -> str:
    """Return `key` if it is a safe relative key, else raise InvalidURL naming it."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidURL(f"{url or key}: invalid key {key!r} (must be relative, '/'-separated)", url)
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidURL(f"{url or key}: key {key!r} has an empty, '.' or '..' segment "
                         f"(path traversal is refused)", url)
    return key


def join_key(prefix: str, key: str) -> str:
    """Join a prefix and a relative key with exactly one '/'."""
    return f"{prefix}/{key}" if prefix else key


def split_url(url: str) -> tuple[str, str]:
    """'s3://b/p/k.bin' -> ('s3://b/p', 'k.bin'); '/a/b/c' -> ('/a/b', 'c')."""
    parsed = parse_url(url)
    if parsed.is_local:
        path = Path(parsed.prefix)
        return str(path.parent), path.name
    head, _, last = parsed.prefix.rpartition("/")
    if not last:
        raise InvalidURL(f"{url}: names a bucket, not an object", url)
    return ParsedURL(parsed.scheme, parsed.bucket, head).root_url(), last
