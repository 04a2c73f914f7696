"""The demo's loss plot (examples/loss_plot.py): a valid SVG with ticks and labels on both axes, both
loss series, and the kill/resume point marked where the run resumed."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st
from loss_plot import loss_svg, nice_ticks

NS = "{http://www.w3.org/2000/svg}"


def test_the_plot_has_axes_ticks_labels_and_the_resume_marker() -> None:
    train = [(s, 6.0 - s / 100) for s in range(20, 301, 20)]
    evals = [(100, 4.9), (200, 4.1), (300, 3.2)]
    root = ET.fromstring(loss_svg(train, evals, steps=300, resumed_from=120))
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert "batch" in texts and "loss" in texts
    assert {"0", "100", "200", "300"} <= set(texts)            # x tick labels
    assert {"3", "4", "5"} <= set(texts) or {"3.5", "4.5"} <= set(texts)  # y tick labels
    lines = list(root.iter(f"{NS}line"))
    assert sum(line.get("class") == "xtick" for line in lines) >= 4
    assert sum(line.get("class") == "ytick" for line in lines) >= 3
    (marker,) = [line for line in lines if line.get("id") == "resume"]
    assert float(marker.get("x1")) > 70  # right of the y axis, at batch 120
    assert any("resumed from batch 120" in (t or "") for t in texts)
    assert {p.get("class") for p in root.iter(f"{NS}polyline")} == {"train", "eval"}


def test_without_a_resume_there_is_no_marker() -> None:
    svg = loss_svg([(10, 2.0), (20, 1.5)], [], steps=20)
    assert 'id="resume"' not in svg
    ET.fromstring(svg)


@given(lo=st.floats(-1e6, 1e6), width=st.floats(1e-6, 1e6))
def test_nice_ticks_cover_the_range_with_round_steps(lo: float, width: float) -> None:
    hi = lo + width
    ticks = nice_ticks(lo, hi)
    assert 1 <= len(ticks) <= 12
    assert all(lo - width * 1e-6 <= t <= hi + width * 1e-6 for t in ticks)
    assert ticks == sorted(ticks)
