"""Retry transient storage failures with jittered exponential backoff, bounded attempts and a deadline.

The deadline (`total_timeout`, `TESSERA_S3_TIMEOUT` seconds, default 30) is what makes an endpoint that
accepts connections and never answers fail in seconds: each attempt then waits out the read timeout, and
six of them at a 120 s request timeout took 725 s. It counts from the last sign of life, so a long
transfer that breaks part-way is still retried as before.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tessera.storage.errors import TransientError, is_transient, translate

T = TypeVar("T")

TIMEOUT_ENV = "TESSERA_S3_TIMEOUT"
DEFAULT_TOTAL_TIMEOUT = 30.0


def total_timeout_from_env() -> float:
    """Seconds from TESSERA_S3_TIMEOUT (default 30); a clear ValueError naming the variable otherwise."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TOTAL_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds, e.g. 30")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Delays follow "full jitter": uniform(0, min(max_delay, base * 2**attempt)).

    `request_timeout` bounds each HTTP request so a dead server becomes a retryable timeout rather
    than a hang; `connect_timeout` keeps a refused or black-holed endpoint from eating the budget;
    `read_timeout` is the longest wait for the first (or any next) byte of an answer. `total_timeout`
    bounds the retrying of an operation that gets no answer (see the module docstring); the connect and
    read timeouts never exceed it.
    """

    max_attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 8.0
    request_timeout: float = 120.0
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    total_timeout: float = field(default_factory=total_timeout_from_env)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy delays must be >= 0")
        if not 0 < self.total_timeout < math.inf:
            raise ValueError(f"RetryPolicy.total_timeout must be positive and finite, got {self.total_timeout}")

    @property
    def silence(self) -> float:
        """The longest one attempt waits without an answer before it times out (connect, then first byte)."""
        return min(self.connect_timeout, self.total_timeout) + min(self.read_timeout, self.total_timeout)

    def delay(self, attempt: int) -> float:
        """Seconds to sleep before retry number `attempt` (0-based)."""
        return random.uniform(0, min(self.max_delay, self.base_delay * (2**attempt)))


class RetryBudget:
    """The attempts and the deadline of one operation: call `start()` before each attempt and
    `failed(exc, url)` after a failure, which sleeps before the next attempt or raises.

    The deadline counts from the last sign of life: an attempt that lasted longer than the policy's
    `silence` (plus a second of slack for the client's own overhead) was being answered: it would have
    timed out otherwise, so it restarts the clock.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempt = 0
        self.alive = self.began = time.monotonic()

    def start(self) -> None:
        self.began = time.monotonic()

    def next_delay(self) -> float | None:
        now = time.monotonic()
        if now - self.began > self.policy.silence + 1.0:
            self.alive = now
        delay = self.policy.delay(self.attempt)
        self.attempt += 1
        if self.attempt >= self.policy.max_attempts:
            return None
        if now - self.alive + delay + self.policy.silence > self.policy.total_timeout:
            return None
        return delay

    def failed(self, exc: BaseException, url: str, endpoint: str | None = None) -> None:
        """After a failed attempt: sleep before the next one, or raise a translated StorageError naming
        `url` (and `endpoint` when the last failure is a timeout) when `exc` is permanent or the attempts
        or the deadline are spent."""
        if not is_transient(exc):
            raise translate(exc, url, endpoint) from exc
        delay = self.next_delay()
        if delay is None:
            err = translate(exc, url, endpoint)
            if not isinstance(err, TransientError):
                err = TransientError(f"{url}: gave up after {self.attempt} attempts ({err})", url)
            raise err from exc
        time.sleep(delay)


def call_with_retry(fn: Callable[[], T], url: str, policy: RetryPolicy, endpoint: str | None = None) -> T:
    """Run `fn`, retrying transient errors; raise a translated StorageError otherwise.

    Permanent failures (403, 404, missing bucket) fail on the first attempt: retrying them only
    delays the message the user needs to see. `endpoint` is named when the last failure is a timeout.
    """
    budget = RetryBudget(policy)
    while True:
        budget.start()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - every backend error is classified by `failed`
            budget.failed(exc, url, endpoint)
