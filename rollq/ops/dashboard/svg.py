"""Line charts as inline SVG: the dashboard loads nothing from the network."""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

from .data import Series

COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")
TICK_FONT = 11
LABEL_EM = 0.64
"""A label glyph's width in em, at most (DejaVu Sans digits are 0.636 em): how far an x-axis label reaches."""


def _tick_anchor(at: float, label: str, width: int) -> str:
    """How to anchor an x-axis label at ``at`` so that it stays inside the chart: centred under its point, unless
    that cuts it at an edge (the last time label did: "17:04:0"), then ending (or starting) at its point."""
    half = len(label) * TICK_FONT * LABEL_EM / 2
    if at + half > width:
        return "end"
    if at - half < 0:
        return "start"
    return "middle"


def line_chart(
    series: list[Series],
    *,
    width: int = 760,
    height: int = 220,
    unit: str = "",
    x_labels: Sequence[str] | None = None,
) -> str:
    """An SVG line chart of ``series`` sharing one x axis, with a legend (wrapped, every series); a note when
    there is no data. The x axis is time unless ``x_labels`` names the positions 0, 1, ... (versions, say)."""
    points = [p for s in series for p in s.points]
    if not points:
        return f'<svg class="chart" width="{width}" height="{height}"><text x="20" y="40">no data yet</text></svg>'
    per_row = max(1, (width - 56) // 130)
    legend_rows = (len(series) + per_row - 1) // per_row
    height += 16 * max(0, legend_rows - 1)
    left, right, top, bottom = 56, 16, 16, 28 + 16 * legend_rows
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    v0, v1 = min(0.0, min(v for _, v in points)), max(v for _, v in points)
    if t1 == t0:
        t0, t1 = (t0 - 60, t1 + 60) if x_labels is None else (t0 - 1, t1 + 1)
    if v1 == v0:
        v1 = v0 + 1

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * (width - left - right)

    def y(v: float) -> float:
        return top + (1 - (v - v0) / (v1 - v0)) * (height - top - bottom)

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    out.append(f'<line x1="{left}" y1="{y(v0):.1f}" x2="{width - right}" y2="{y(v0):.1f}" stroke="#999"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#999"/>')
    for v in (v0, (v0 + v1) / 2, v1):
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" font-size="11">{v:.3g}{unit}</text>')
    ticks: list[tuple[float, str]]
    if x_labels is None:
        clock = "%H:%M" if t1 - t0 >= 600 else "%H:%M:%S"
        ticks = [(t, time.strftime(clock, time.gmtime(t))) for t in (t0, (t0 + t1) / 2, t1)]
    else:
        step = max(1, (len(x_labels) + 9) // 10)  # at most about ten labels
        shown = list(range(0, len(x_labels), step))
        if shown[-1] != len(x_labels) - 1:
            shown.append(len(x_labels) - 1)
        ticks = [(float(i), x_labels[i]) for i in shown]
    for t, label in ticks:
        out.append(
            f'<text x="{x(t):.1f}" y="{height - bottom + 16}" text-anchor="{_tick_anchor(x(t), label, width)}"'
            f' font-size="{TICK_FONT}" class="tick">{escape(label)}</text>'
        )
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s.points)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        for t, v in s.points:
            out.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="{colour}"/>')
        lx = left + (i % per_row) * 130
        ly = height - 14 - 16 * (legend_rows - 1 - i // per_row)
        out.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly + 9}" font-size="11" class="legend">{escape(s.label)}</text>')
    out.append("</svg>")
    return "".join(out)
