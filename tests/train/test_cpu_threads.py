"""The trainer's guard against an oversubscribed CPU: the decision is a pure function of (load, cores,
whether the user chose a thread count); the wiring is checked with the load average injected."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tessera.train import cpu_threads
from tessera.train.cpu_threads import threads_for_load


@pytest.mark.parametrize(("load", "cores", "user_set", "expected"), [
    (0.5, 2, False, None),     # idle
    (2.9, 2, False, None),     # busy but within the margin (e.g. a data prep that just ended)
    (6.0, 2, False, 1),        # six jobs on two cores
    (6.0, 2, True, None),      # the user chose: leave it
    (40.0, 1, False, None),    # one core: torch already uses one thread
    (13.0, 8, False, 1),
    (11.0, 8, False, None),
])
def test_threads_for_load(load: float, cores: int, user_set: bool, expected: int | None) -> None:
    assert threads_for_load(load, cores, user_set) == expected


@given(load=st.floats(0, 1000), cores=st.integers(1, 512), user_set=st.booleans())
def test_never_acts_for_a_user_choice_or_below_the_cores(load: float, cores: int, user_set: bool) -> None:
    threads = threads_for_load(load, cores, user_set)
    assert threads in (None, 1)
    if user_set or load <= cores:
        assert threads is None


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def busy_two_cores(monkeypatch: pytest.MonkeyPatch, restore_threads) -> None:
    """Two usable cores under a 1-minute load of 9, no thread variables set, torch at its default of 2."""
    for name in cpu_threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 5.0, 3.0))
    torch.set_num_threads(2)


def test_an_oversubscribed_cpu_drops_to_one_thread_once(monkeypatch: pytest.MonkeyPatch, busy_two_cores,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tessera.train.cpu_threads"):
        cpu_threads.limit_threads_if_oversubscribed(torch.device("cpu"))
    assert torch.get_num_threads() == 1
    (record,) = caplog.records
    assert "oversubscribed" in record.getMessage() and "9.0" in record.getMessage()

    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # chosen by the user: kept
    cpu_threads.limit_threads_if_oversubscribed(torch.device("cpu"))
    assert torch.get_num_threads() == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    cpu_threads.limit_threads_if_oversubscribed(torch.device("meta"))  # not a CPU run: untouched
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(("saved", "current", "chosen", "expected"), [
    (2, 1, False, 2),      # started with 2 threads, resumed on a busy machine: 2 again
    (1, 2, False, 1),      # started busy with 1: 1 again
    (2, 2, False, None),   # nothing differs
    (None, 2, False, None),  # a checkpoint from before the count was saved
    (2, 1, True, None),    # the user chose 1 for this part: kept (with a warning)
])
def test_threads_for_resume(saved: int | None, current: int, chosen: bool, expected: int | None) -> None:
    assert cpu_threads.threads_for_resume(saved, current, chosen) == expected


def test_a_resumed_cpu_run_takes_the_saved_count_whatever_the_load(busy_two_cores,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    assert cpu_threads.choose_threads(torch.device("cpu"), None) == 1  # busy at this start
    cpu_threads.resume_threads(torch.device("cpu"), 2, chosen=False)  # the run began with 2
    assert torch.get_num_threads() == 2
    assert cpu_threads.choose_threads(torch.device("cpu"), 1) == 1  # torch_threads=1 given: the user's
    with caplog.at_level(logging.WARNING, logger="tessera.train.cpu_threads"):
        cpu_threads.resume_threads(torch.device("cpu"), 2, chosen=True)
    assert torch.get_num_threads() == 1
    assert "last bits" in caplog.records[-1].getMessage()
