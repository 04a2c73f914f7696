"""`open_store(url)`: pick the backend for a URL and configure credentials the usual way."""

from __future__ import annotations

import configparser
import os
import threading
from pathlib import Path
from typing import Any

from obstore.store import AzureStore, GCSStore, MemoryStore, S3Store

from tessera.storage.base import Store
from tessera.storage.errors import InvalidURL
from tessera.storage.local import LocalStore
from tessera.storage.remote import ObjectStore, client_options, no_retry_config
from tessera.storage.retry import RetryPolicy
from tessera.storage.url import ParsedURL, parse_url

_MEMORY: dict[str, MemoryStore] = {}
_CLIENTS: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


def _aws_profile_credentials(profile: str) -> dict[str, str]:
    """Keys of a named profile in ~/.aws/credentials (AWS_SHARED_CREDENTIALS_FILE overrides)."""
    path = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")).expanduser()
    cfg = configparser.ConfigParser()
    cfg.read(path)
    if profile not in cfg:
        return {}
    section = cfg[profile]
    out = {k: section[k] for k in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
           if k in section}
    return {k.removeprefix("aws_"): v for k, v in out.items()}


def s3_settings(endpoint: str | None, access_key_id: str | None, secret_access_key: str | None,
                region: str | None, session_token: str | None = None) -> dict[str, Any]:
    """Explicit options win, then AWS_* / S3_ENDPOINT_URL env vars, then the AWS profile file."""
    env = os.environ
    endpoint = endpoint or env.get("S3_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL")
    key = access_key_id or env.get("AWS_ACCESS_KEY_ID")
    secret = secret_access_key or env.get("AWS_SECRET_ACCESS_KEY")
    token = session_token or env.get("AWS_SESSION_TOKEN")
    if not (key and secret):
        prof = _aws_profile_credentials(env.get("AWS_PROFILE", "default"))
        key, secret = prof.get("access_key_id"), prof.get("secret_access_key")
        token = token or prof.get("session_token")
    region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    out: dict[str, Any] = {"region": region}
    if endpoint:
        out["endpoint"] = endpoint
        # Custom endpoints (MinIO, SeaweedFS, R2) are path-style; R2 and AWS also accept it.
        out["virtual_hosted_style_request"] = False
    if key and secret:
        out.update(access_key_id=key, secret_access_key=secret)
        if token:
            out["token"] = token
    else:
        out["skip_signature"] = True  # public buckets; private ones then fail with PermissionDenied
    return out


def _client(parsed: ParsedURL, retry: RetryPolicy, opts: dict[str, Any]) -> Any:
    if parsed.scheme == "memory":
        with _LOCK:
            return _MEMORY.setdefault(parsed.bucket, MemoryStore())
    if parsed.scheme == "s3":
        settings = s3_settings(opts.pop("endpoint", None), opts.pop("access_key_id", None),
                               opts.pop("secret_access_key", None), opts.pop("region", None),
                               opts.pop("session_token", None))
        allow_http = str(settings.get("endpoint", "")).startswith("http://")
        settings.update(opts)
        cache_key = ("s3", parsed.bucket, retry, tuple(sorted((k, str(v)) for k, v in settings.items())))
        with _LOCK:
            if cache_key not in _CLIENTS:
                _CLIENTS[cache_key] = S3Store(parsed.bucket, client_options=client_options(retry, allow_http),
                                              retry_config=no_retry_config(), **settings)
            return _CLIENTS[cache_key]
    common = {"client_options": client_options(retry, False), "retry_config": no_retry_config()}
    if parsed.scheme == "gs":
        return GCSStore(parsed.bucket, **common, **opts)
    if parsed.scheme in ("az", "abfs", "abfss"):
        container = parsed.bucket.split("@", 1)[0]
        if "@" in parsed.bucket and "account_name" not in opts:
            opts["account_name"] = parsed.bucket.split("@", 1)[1].split(".", 1)[0]
        return AzureStore(container, **common, **opts)
    raise InvalidURL(f"{parsed.root_url()}: unsupported scheme", parsed.root_url())


def open_store(url: str | os.PathLike[str], *, endpoint: str | None = None,
               access_key_id: str | None = None, secret_access_key: str | None = None,
               region: str | None = None, retry: RetryPolicy | None = None,
               options: dict[str, Any] | None = None) -> Store:
    """A Store rooted at `url`: a local path, file://, s3://, gs://, az://, abfs:// or memory://.

    `memory://NAME` stores live for the whole process, so separate calls see the same bytes.
    `options` go to the backend as-is (obstore config keys, e.g. {"session_token": ...} for S3).
    """
    parsed = parse_url(url)
    policy = retry or RetryPolicy()
    if parsed.is_local:
        return LocalStore(parsed.prefix, policy)
    opts = dict(options or {})
    for name, value in (("endpoint", endpoint), ("access_key_id", access_key_id),
                        ("secret_access_key", secret_access_key), ("region", region)):
        if value is not None:
            opts[name] = value
    if parsed.scheme not in ("s3",) and opts.keys() & {"endpoint", "access_key_id", "secret_access_key"}:
        raise InvalidURL(f"{parsed.root_url()}: endpoint/access keys are S3 options; pass "
                         f"backend options for {parsed.scheme}:// in `options`", parsed.root_url())
    return ObjectStore(_client(parsed, policy, opts), parsed, policy)
