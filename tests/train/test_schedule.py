"""LR schedules: shape properties (hypothesis), units, and the LambdaLR wrapper."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tessera.train.schedule import ConstantWithWarmup, CosineWithWarmup, LinearWithWarmup, lambda_lr
from tessera.train.time import Time, Timestamp

alphas = st.floats(min_value=0.0, max_value=1.0)
lengths = st.tuples(st.integers(0, 100), st.integers(1, 400)).map(lambda wd: (wd[0], wd[0] + wd[1]))
DECAYING = [CosineWithWarmup, LinearWithWarmup]


def at(batch: int) -> Timestamp:
    return Timestamp(batch=batch)


@pytest.mark.parametrize("kind", DECAYING)
@given(lengths, alphas)
def test_decaying_schedules_shape(kind, wd, alpha_f):
    warmup, duration = wd
    sched = kind(warmup=f"{warmup}ba", duration=f"{duration}ba", alpha_f=alpha_f)
    values = [sched(at(b)) for b in range(0, duration + 3)]
    lo = min(alpha_f, 1.0)
    assert all(0.0 <= v <= 1.0 + 1e-12 for v in values)
    assert values[:warmup + 1] == sorted(values[:warmup + 1])  # warmup rises
    after = values[warmup:]
    assert all(a >= b - 1e-12 for a, b in zip(after, after[1:], strict=False))  # then never rises
    assert values[warmup] == pytest.approx(1.0)
    assert values[duration] == pytest.approx(lo) and values[-1] == pytest.approx(lo)
    if warmup:
        assert values[0] == 0.0
        assert values[warmup // 2] == pytest.approx((warmup // 2) / warmup)


@given(lengths)
def test_cosine_midpoint_and_constant(wd):
    warmup, duration = wd
    cos = CosineWithWarmup(warmup=f"{warmup}ba", duration=f"{duration}ba", alpha_f=0.2)
    if (duration - warmup) % 2 == 0:
        assert cos(at(warmup + (duration - warmup) // 2)) == pytest.approx(0.6)
    const = ConstantWithWarmup(warmup=f"{warmup}ba", duration=f"{duration}ba")
    assert [const(at(b)) for b in range(warmup, duration + 5)] == [1.0] * (duration - warmup + 5)


def test_token_based_schedule_follows_tokens_not_batches():
    sched = CosineWithWarmup(warmup="1000tok", duration="1e4tok")
    assert sched(Timestamp(batch=1, token=500)) == 0.5
    assert sched(Timestamp(batch=1000, token=500)) == 0.5
    assert sched(Timestamp(token=5500)) == pytest.approx(0.5)


def test_dur_resolves_against_max_duration():
    sched = CosineWithWarmup(warmup="0.1dur", duration="1dur", alpha_f=0.1)
    with pytest.raises(ValueError, match="resolve"):
        sched(at(0))
    resolved = sched.resolve("2ep", batches_per_epoch=50)
    assert (resolved.warmup, resolved.duration) == (Time(10, "ba"), Time(100, "ba"))
    assert resolved(at(100)) == pytest.approx(0.1)
    plain = LinearWithWarmup(duration="1dur").resolve("1000tok")
    assert plain(Timestamp(token=250)) == pytest.approx(0.75)


def test_mixed_units_are_refused():
    with pytest.raises(ValueError, match="same unit"):
        CosineWithWarmup(warmup="10ba", duration="1000tok")(at(1))


def test_lambda_lr_steps_with_the_timestamp_and_checkpoints_cleanly():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1.0)
    state = {"ts": Timestamp()}
    sched = lambda_lr(opt, CosineWithWarmup(warmup="40tok", duration="200tok"), lambda: state["ts"])
    assert opt.param_groups[0]["lr"] == 0.0
    for _ in range(3):
        opt.step()
        state["ts"] = state["ts"].to_next_batch(1, 20)
        sched.step()
    expected = 0.5 * (1 + math.cos(math.pi * 20 / 160))
    assert opt.param_groups[0]["lr"] == pytest.approx(expected)
    saved = sched.state_dict()
    assert saved["lr_lambdas"] == [None]
    torch.save(saved, __import__("io").BytesIO())


def test_lambda_lr_without_timestamp_counts_batches():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = lambda_lr(opt, LinearWithWarmup(duration="4ba"))
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([2.0, 1.5, 1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="timestamp_fn"):
        lambda_lr(opt, LinearWithWarmup(duration="4tok"))
