"""Failure classification is a pure function of the evidence."""

from __future__ import annotations

import pytest

from tessera.platform.clusters.base import JobState, NodeExit
from tessera.platform.supervision.failures import Action, Evidence, FailureKind, classify, first_exception

TRACEBACK = """step 0
Traceback (most recent call last):
  File "train.py", line 3, in <module>
    main()
KeyError: 'lr'
"""


def ev(state=JobState.FAILED, code=1, log="", progress=False, **kw) -> Evidence:
    exits = kw.pop("exits", [NodeExit(0, "n1", code)] if code is not None else [])
    return Evidence(state, code, exits, {0: log}, kw.pop("nodes", ["n1"]), made_progress=progress, **kw)


@pytest.mark.parametrize("evidence,kind,action", [
    (ev(log=TRACEBACK), FailureKind.USER_ERROR, Action.FAIL),
    (ev(code=127, log="bash: trainx: command not found"), FailureKind.USER_ERROR, Action.FAIL),
    (ev(log=TRACEBACK, progress=True), FailureKind.ERROR, Action.RETRY),
    (ev(code=137), FailureKind.CRASH, Action.RETRY),
    (ev(code=137, log="Out of memory: Killed process 4242 (python)"), FailureKind.OOM, Action.RETRY),
    (ev(log="torch.OutOfMemoryError: CUDA out of memory."), FailureKind.OOM, Action.RETRY),
    (ev(state=JobState.OUT_OF_MEMORY, code=0), FailureKind.OOM, Action.RETRY),
    (ev(code=143), FailureKind.PREEMPTION, Action.RETRY),
    (ev(state=JobState.PREEMPTED, code=None), FailureKind.PREEMPTION, Action.RETRY),
    (ev(state=JobState.TIMEOUT, code=None), FailureKind.PREEMPTION, Action.RETRY),
    (ev(log="OSError: [Errno 28] No space left on device"), FailureKind.STORAGE, Action.RETRY),
    (ev(log="RuntimeError: NCCL error in: ..., unhandled system error"), FailureKind.NODE_FAULT,
     Action.EXCLUDE_AND_RETRY),
    (ev(state=JobState.NODE_FAIL, code=None, unhealthy_nodes=["n1"]), FailureKind.NODE_FAULT,
     Action.EXCLUDE_AND_RETRY),
    (ev(code=143, hang=True), FailureKind.HANG, Action.RETRY),
    (ev(state=JobState.LOST, code=None), FailureKind.CRASH, Action.RETRY),
])
def test_classification(evidence: Evidence, kind: FailureKind, action: Action) -> None:
    failure = classify(evidence)
    assert (failure.kind, failure.action) == (kind, action), failure.summary


def test_node_fail_names_the_unhealthy_node_as_hard() -> None:
    failure = classify(ev(state=JobState.NODE_FAIL, code=None, nodes=["n1", "n2"],
                          exits=[NodeExit(0, "n1", 143), NodeExit(1, "n2", 143)], unhealthy_nodes=["n2"]))
    assert failure.nodes == ["n2"] and failure.hard and failure.system


def test_the_node_that_failed_first_is_blamed_not_the_ones_killed_after() -> None:
    failure = classify(ev(code=139, nodes=["n1", "n2"], exits=[NodeExit(0, "n1", 143), NodeExit(1, "n2", 139)]))
    assert failure.kind is FailureKind.CRASH and failure.nodes == ["n2"] and not failure.hard


def test_first_exception() -> None:
    assert first_exception(TRACEBACK) == "KeyError: 'lr'"
    chained = TRACEBACK + "\nDuring handling of the above exception, another exception occurred:\n\n" + \
        TRACEBACK.replace("KeyError: 'lr'", "RuntimeError: again")
    assert first_exception(chained) == "KeyError: 'lr'"
    assert first_exception("[default1]:Traceback (most recent call last):\n[default1]:  File x\n"
                           "[default1]:ValueError: v") == "ValueError: v"
    assert first_exception("no traceback here") is None
    # the CLI's one-line error, printed instead of a traceback (tessera.cli.console.fail)
    assert first_exception("[tessera] starting\nerror: data.train.streams: no index.json\n") == \
        "error: data.train.streams: no index.json"
