"""The fork server behind `reader_proc.py --serve` and `trainer_run.py --serve`.

Why: the multi-process tests start dozens of real reader and trainer processes, and a fresh interpreter
that imports torch and tessera costs ~3 s of CPU on the two shared cores. The server imports them once
and forks each process from itself instead. A child is still a separate OS process, as under torchrun:
a session (process group) of its own, so a test can SIGKILL it with its DataLoader workers; the
environment it was sent (RANK, WORLD_SIZE, ...) as its whole environment; its own stdout/stderr.

Protocol: one JSON command a line on stdin, each with "env" (the child's environment), "log" (the file
its stdout and stderr go to) and whatever the script's `run` reads. The server prints each child's pid
on a line of its own and, when the child exits, writes its exit status (-9 when SIGKILLed) to the file
`rc_path(cmd)` names, atomically, so a test polling for it never reads it half written. Closing stdin
stops the server once every child has exited.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path


def serve(run: Callable[[dict], None], rc_path: Callable[[dict], str]) -> None:
    """Fork a child running `run(cmd)` per command line on stdin; write each child's exit status to
    `rc_path(cmd)`. Returns once stdin is closed and every child has been reaped."""
    children: dict[int, str] = {}
    buffer = b""
    open_input = True
    while open_input or children:
        if open_input and select.select([0], [], [], 0.01)[0]:
            data = os.read(0, 65536)
            open_input = bool(data)
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                cmd = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(run, cmd)
                children[pid] = rc_path(cmd)
                sys.stdout.write(f"{pid}\n")
                sys.stdout.flush()
        elif not open_input:
            time.sleep(0.01)
        for pid in list(children):  # only our children: never reap a process someone else waits for
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = Path(children.pop(pid))
                tmp = rc.with_name(rc.name + ".tmp")
                tmp.write_text(str(os.waitstatus_to_exitcode(status)))
                tmp.replace(rc)


def _child(run: Callable[[dict], None], cmd: dict) -> None:
    """In the forked child: become a process of our own, run `cmd` and exit (0, or 1 with the traceback
    in the log); never returns, so the child can never fall back into the server's loop."""
    code = 1
    try:
        os.setsid()  # a process group of its own: the test may SIGKILL it with its DataLoader workers
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the server's stdin is the test's command pipe, not the child's
        log = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(cmd["env"])
        run(cmd)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
