"""Keep the training process free of obstore's runtime so DataLoader workers can simply fork().

obstore runs its requests on a process-global tokio runtime whose threads do not survive fork(): once
this process has made one object-store request, a fork()ed child that makes another (even through a
new store object) hangs. Forkserver workers avoid that but cost ~2 s to start (a fresh interpreter
importing torch), which was most of the time to the first remote batch.

A dataset only needs the store in this process for its index.json. `call_outside_runtime` makes that
request from a short-lived fork()ed child (~30 ms), so the runtime starts there and dies with it; store
objects created here without a request are fine to use after fork. `fork_is_clean` tells the
DataLoader whether fork() is still safe (something else in the process may have used obstore: through
tessera.storage, which `fork_gate` tracks, or another library, whose runtime threads `runtime_started`
sees). Both decide and fork under `tessera.storage.fork_gate`, so a first request made by another
thread at that moment waits instead of leaving the children hanging.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tessera.storage.fork_gate import fork_gate

T = TypeVar("T")

# obstore names its runtime threads "tokio-rt-worker"; tokio's default is "tokio-runtime-worker".
_RUNTIME_THREAD_PREFIX = "tokio-"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_M_ARENA_MAX = -8  # malloc.h


def can_fork() -> bool:
    """fork() is available and usable for workers (Linux; macOS forks badly and defaults to spawn)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def runtime_started() -> bool:
    """Whether a tokio runtime has threads in this process (then fork()ed children cannot use obstore).

    Read from the thread names in /proc, so it also sees runtimes started by other libraries. Where
    that cannot be read, answer True: the caller then takes the safe (slower) path.
    """
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return True
    for task in tasks:
        try:
            if (task / "comm").read_text().startswith(_RUNTIME_THREAD_PREFIX):
                return True
        except OSError:
            continue  # the thread ended while we looked
    return False


def fork_is_clean(gate_open: bool) -> bool:
    """Inside `fork_gate()` (which yields `gate_open`): whether fork()ed children may use object stores."""
    return can_fork() and gate_open and not runtime_started()


def die_with_parent() -> None:
    """In a reader process (DataLoader worker, forkserver): be killed when the process that started it
    dies, and exit now if it already has.

    A training process killed by a signal runs no clean-up, and its workers or forkserver could stay
    alive as orphans for minutes, holding memory and cache pins. Linux only (prctl
    PR_SET_PDEATHSIG); elsewhere torch's own check of the parent every few seconds remains. The signal
    follows the *thread* that started the child, so create loader iterators on a thread that lives as
    long as they do (the main thread, as usual).
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl: nobody would send the signal any more
        os._exit(1)


def limit_malloc_arenas(arenas: int = 2) -> None:
    """In a reader process: at most `arenas` glibc malloc arenas. Download threads (the prefetcher's and
    obstore's runtime) each got an arena of their own, whose freed buffers glibc keeps: ~75 MB more
    anonymous memory per DataLoader worker than MosaicML's workers. No-op off glibc."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mallopt(_M_ARENA_MAX, arenas)
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return


def call_outside_runtime(fn: Callable[[], T]) -> T:
    """`fn()` (which may make object-store requests) without starting obstore's runtime here: in a
    fork()ed child while this process has made no request, here otherwise (it is started already, or
    fork() is not available). The check and the fork are one step under `fork_gate()`."""
    with fork_gate() as gate_open:
        forked = _fork_with_pipe() if fork_is_clean(gate_open) else None
    return fn() if forked is None else _run_in_child(forked, fn)


def _fork_with_pipe() -> tuple[int, int, int]:
    read_fd, write_fd = os.pipe()
    return os.fork(), read_fd, write_fd


def _run_in_child(forked: tuple[int, int, int], fn: Callable[[], T]) -> T:
    """After `_fork_with_pipe`: the child runs `fn` and exits; the parent returns its result."""
    pid, read_fd, write_fd = forked
    if pid == 0:  # the child: never returns into the caller's code
        os.close(read_fd)
        status = 0
        try:
            try:
                payload = pickle.dumps((True, fn()))
            except BaseException as err:  # noqa: BLE001 - every error goes back to the parent
                try:
                    payload = pickle.dumps((False, err))
                except Exception:  # noqa: BLE001 - an unpicklable error: keep its text
                    payload = pickle.dumps((False, RuntimeError(f"{type(err).__name__}: {err}")))
            with os.fdopen(write_fd, "wb") as out:
                out.write(payload)
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)  # no atexit handlers, no flushing of the parent's buffers twice
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            payload = pipe.read()
    except BaseException:  # interrupted here (Ctrl-C): do not leave the helper running
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    _, status = os.waitpid(pid, 0)
    if not payload:
        raise RuntimeError(f"a fork()ed helper process died (wait status {status}) before it answered")
    ok, value = pickle.loads(payload)
    if not ok:
        raise value
    return value
