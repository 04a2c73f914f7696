"""Time strings, Time arithmetic, Timestamp counters, intervals and `dur` resolution."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.train.time import Time, Timestamp, TimeUnit, interval_fires, resolve_time, to_time

COUNTING = [TimeUnit.BATCH, TimeUnit.EPOCH, TimeUnit.SAMPLE, TimeUnit.TOKEN]
counting_units = st.sampled_from(COUNTING)
counts = st.integers(min_value=0, max_value=10**12)


@pytest.mark.parametrize(("text", "value", "unit"), [
    ("500ba", 500, "ba"), ("2ep", 2, "ep"), ("1e9tok", 10**9, "tok"), ("0.1dur", 0.1, "dur"),
    ("1_000sp", 1000, "sp"), (" 3 ba ", 3, "ba"), ("1dur", 1.0, "dur"), ("2.0ep", 2, "ep"),
])
def test_parse_examples(text, value, unit):
    t = Time.parse(text)
    assert t == Time(value, unit)
    assert type(t.value) is (float if unit == "dur" else int)


@pytest.mark.parametrize("text", ["", "ba", "5", "5xx", "5 ep s", "1.5ba", "-1ba", "nanba", "1e400tok",
                                  "1__0ba", "0.5ep", "five ba", "1e9"])
def test_bad_strings_raise_value_error_naming_the_string(text):
    with pytest.raises(ValueError) as info:
        Time.parse(text)
    assert repr(text) in str(info.value)


def test_unknown_unit_in_constructor_lists_the_units():
    with pytest.raises(ValueError, match="ba .batches.*tok"):
        Time(3, "steps")


@given(counts, counting_units)
def test_str_round_trips(value, unit):
    t = Time(value, unit)
    assert Time.parse(str(t)) == t
    assert to_time(t) is t


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_dur_round_trips(value):
    assert Time.parse(str(Time(value, "dur"))).value == pytest.approx(value, rel=1e-15)


@given(counts, counts, counting_units)
def test_order_and_arithmetic_follow_the_values(a, b, unit):
    x, y = Time(a, unit), Time(b, unit)
    assert (x < y) == (a < b) and (x <= y) == (a <= b) and (x > y) == (a > b) and (x >= y) == (a >= b)
    assert (x + y).value == a + b and (x - y).value == a - b
    assert (x * 3).value == 3 * a and (3 * x) == x * 3
    assert x < str(Time(a + 1, unit))
    if b:
        assert x / y == pytest.approx(a / b)


@given(counting_units, counting_units)
def test_mixed_units_raise_type_error_naming_both(u, v):
    if u is v:
        return
    x, y = Time(1, u), Time(2, v)
    for op in (lambda: x < y, lambda: x >= y, lambda: x + y, lambda: x - y, lambda: x / y):
        with pytest.raises(TypeError) as info:
            op()
        assert str(x) in str(info.value) and str(y) in str(info.value)
    assert x != y  # equality is structural, never an error


def test_fractional_counting_result_is_an_error():
    with pytest.raises(ValueError, match="whole number"):
        Time(3, "ba") * 0.5


batch_sizes = st.lists(st.tuples(st.integers(0, 64), st.integers(0, 4096)), max_size=40)


@given(batch_sizes, st.integers(1, 10))
def test_timestamp_counts_batches_samples_tokens(batches, epoch_len):
    ts = Timestamp()
    for i, (samples, tokens) in enumerate(batches):
        ts = ts.to_next_batch(samples, tokens)
        if (i + 1) % epoch_len == 0:
            ts = ts.to_next_epoch()
    assert ts.batch == len(batches)
    assert ts.sample == sum(s for s, _ in batches) and ts.token == sum(t for _, t in batches)
    assert ts.epoch == len(batches) // epoch_len
    assert ts.batch_in_epoch == len(batches) % epoch_len
    tail = batches[len(batches) - ts.batch_in_epoch:]
    assert ts.sample_in_epoch == sum(s for s, _ in tail)
    assert ts.get("ba") == Time(ts.batch, "ba") and ts.get(TimeUnit.TOKEN).value == ts.token
    assert Timestamp.from_state_dict(ts.state_dict()) == ts


def test_timestamp_rejects_dur_and_negative_counts():
    with pytest.raises(ValueError, match="fraction_of"):
        Timestamp().get("dur")
    with pytest.raises(ValueError, match="non-negative"):
        Timestamp(batch=-1)
    assert Timestamp(batch=250).fraction_of("1000ba") == 0.25


@given(st.integers(1, 50), st.lists(st.integers(0, 7), min_size=1, max_size=60))
def test_interval_fires_when_a_multiple_is_reached_or_passed(n, samples_per_batch):
    """A samples-based interval fires on exactly the steps whose (before, after] holds a multiple of n."""
    ts = Timestamp()
    for samples in samples_per_batch:
        after = ts.to_next_batch(samples)
        expected = any(m % n == 0 for m in range(ts.sample + 1, after.sample + 1))
        assert interval_fires(Time(n, "sp"), ts, after) == expected
        ts = after


@given(st.integers(1, 20), st.integers(1, 200), st.integers(1, 9))
def test_batch_and_epoch_intervals(n, steps, epoch_len):
    ts, fired_ba, fired_ep = Timestamp(), [], 0
    for _ in range(steps):
        after = ts.to_next_batch(1)
        if interval_fires(f"{n}ba", ts, after):
            fired_ba.append(after.batch)
        ts = after
        if ts.batch_in_epoch == epoch_len:
            after = ts.to_next_epoch()
            fired_ep += interval_fires("1ep", ts, after)
            assert not interval_fires(f"{n}ba", ts, after)  # the epoch step is not a batch
            ts = after
    assert fired_ba == list(range(n, steps + 1, n))
    assert fired_ep == steps // epoch_len


def test_dur_resolves_against_max_duration():
    assert resolve_time("0.1dur", "1000ba") == Time(100, "ba")
    assert resolve_time("0.5dur", "2ep") == Time(1, "ep")
    assert resolve_time("0.25dur", "2ep", batches_per_epoch=10) == Time(5, "ba")
    assert resolve_time("3ep", batches_per_epoch=10) == Time(30, "ba")
    assert resolve_time("7tok", "1000ba") == Time(7, "tok")
    with pytest.raises(ValueError, match="batches_per_epoch"):
        resolve_time("0.25dur", "2ep")
    with pytest.raises(ValueError, match="max_duration"):
        resolve_time("0.1dur")
    assert interval_fires("0.1dur", Timestamp(batch=99), Timestamp(batch=100), max_duration="1000ba")
