"""One lock that makes "has this process used obstore yet?" and fork() a single atomic step.

obstore runs requests on a process-global tokio runtime whose threads do not survive fork(): a child
forked after the parent's first request hangs on its own first request. The stream layer therefore
forks DataLoader workers (and a helper that reads index.json) only while no request has been made
here. Deciding that and forking are two steps; a request started by another thread in between (a
checkpoint upload, a log sync) would leave the new children hanging. So every request through
`ObjectStore` first passes `note_request()`, which takes this lock the first time only, and code about
to fork holds `fork_gate()` from the check through the fork: a first request then waits until the
children exist, and the decision is never stale. After the first request the flag stays set and
requests no longer touch the lock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_used = False  # a request has been made (or is about to be) through obstore in this process


def note_request() -> None:
    """Called before every object-store request: the first one waits for a fork in progress."""
    global _used
    if not _used:
        with _lock:
            _used = True


def requests_made() -> bool:
    """Whether this process has made an object-store request (then fork()ed children cannot)."""
    return _used


@contextmanager
def fork_gate() -> Iterator[bool]:
    """Hold while deciding whether to fork and forking; yields True when no request has been made, i.e.
    fork()ed children may use object stores. No first request starts while it is held."""
    with _lock:
        yield not _used


def _after_fork_in_child() -> None:
    # The forking thread may have held the lock (fork_gate); the child must not inherit it held. `_used`
    # stays as inherited: a child of a process that had made requests cannot make any either.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
