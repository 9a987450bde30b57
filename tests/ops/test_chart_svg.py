"""The dashboard's server-rendered SVG charts: what they draw stays inside the picture."""

from __future__ import annotations

import re

import pytest

from rollq.ops.dashboard.data import Series
from rollq.ops.dashboard.svg import line_chart

# DejaVu Sans (Chromium's fallback on the test machines) is 0.636 em per digit, wider than most other glyphs.
EM_PER_CHAR = 0.64


def _tick_extents(svg: str) -> list[tuple[str, float, float]]:
    """Each x-axis label: its text and how far left and right it reaches, from its x, anchor and font size."""
    extents = []
    for attrs, text in re.findall(r'<text ([^>]*class="tick"[^>]*)>([^<]*)</text>', svg):
        x = float(re.search(r'\bx="([-\d.]+)"', attrs).group(1))  # type: ignore[union-attr]
        size = float(re.search(r'font-size="([\d.]+)"', attrs).group(1))  # type: ignore[union-attr]
        anchor = re.search(r'text-anchor="(\w+)"', attrs)
        wide = len(text) * size * EM_PER_CHAR
        start = {"start": x, "middle": x - wide / 2, "end": x - wide}[anchor.group(1) if anchor else "start"]
        extents.append((text, start, start + wide))
    return extents


@pytest.mark.parametrize(
    "series, x_labels",
    [
        ([Series("rollouts per minute", [(1_765_000_000.0 + 5 * i, 90.0 - i) for i in range(5)])], None),
        ([Series("train", [(0.0, 0.3)]), Series("val", [(1.0, 0.7)])], ["v1", "policy-step-2000"]),
    ],
    ids=["time", "versions"],
)
def test_every_x_axis_label_of_a_chart_fits_inside_its_width(series: list[Series], x_labels: list[str] | None) -> None:
    # A helper's audit: the charts page cut the throughput chart's last time label at the right edge ("17:04:0"),
    # centred under the last point 16 px from the edge.
    svg = line_chart(series, x_labels=x_labels)
    width = float(re.search(r'width="(\d+)"', svg).group(1))  # type: ignore[union-attr]
    extents = _tick_extents(svg)
    assert len(extents) >= 2
    for text, start, end in extents:
        assert 0 <= start and end <= width, (text, start, end, width)
