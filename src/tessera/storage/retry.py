"""Retry transient storage failures with jittered exponential backoff and bounded attempts."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tessera.storage.errors import TransientError, is_transient, translate

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Delays follow "full jitter": uniform(0, min(max_delay, base * 2**attempt)).

    `request_timeout` bounds each HTTP request so a dead server becomes a retryable timeout rather
    than a hang; `connect_timeout` keeps a refused or black-holed endpoint from eating the budget.
    """

    max_attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 8.0
    request_timeout: float = 120.0
    connect_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy delays must be >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to sleep before retry number `attempt` (0-based)."""
        return random.uniform(0, min(self.max_delay, self.base_delay * (2**attempt)))


def call_with_retry(fn: Callable[[], T], url: str, policy: RetryPolicy) -> T:
    """Run `fn`, retrying transient errors; raise a translated StorageError otherwise.

    Permanent failures (403, 404, missing bucket) fail on the first attempt: retrying them only
    delays the message the user needs to see.
    """
    for attempt in range(policy.max_attempts):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - every backend error is classified below
            if not is_transient(exc):
                raise translate(exc, url) from exc
            if attempt + 1 == policy.max_attempts:
                err = translate(exc, url)
                if not isinstance(err, TransientError):
                    err = TransientError(f"{url}: gave up after {policy.max_attempts} attempts ({err})", url)
                raise err from exc
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")
