"""Inline SVG latency distribution plots (no scripts, no external resources).

Each series is one row: every raw sample as a dot, a box from p25 to p75, a thick mark
at p50 and a thin one at p95, on a shared linear millisecond axis.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

from edge_core.evidence.stats import percentile

__all__ = ["latency_svg"]

_ROW = 26
_LEFT = 150
_RIGHT = 20
_TOP = 10
_AXIS = 28


def _ticks(high: float) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) from 0 up to ``high``."""
    if high <= 0:
        return [0.0]
    raw = high / 4
    base = 10.0 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= raw)
    return [i * step for i in range(int(high / step) + 1)]


def latency_svg(series: Mapping[str, Sequence[float]], *, width: int = 640,
                colour: str = "#0969da", title: str = "") -> str:
    """An SVG document fragment plotting each series of millisecond samples in a row."""
    rows = [(name, list(values)) for name, values in series.items() if values]
    height = _TOP + _ROW * max(len(rows), 1) + _AXIS
    label = html.escape(title or "latency distribution (ms)")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="latency" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{label}">', f"<title>{label}</title>"]
    if not rows:
        parts.append(f'<text x="{_LEFT}" y="{_TOP + 14}" font-size="12">no samples</text>')
        parts.append("</svg>")
        return "".join(parts)
    high = max(max(values) for _, values in rows) * 1.05
    span = width - _LEFT - _RIGHT

    def x(value: float) -> float:
        return _LEFT + (value / high * span if high > 0 else 0.0)

    for index, (name, values) in enumerate(rows):
        mid = _TOP + _ROW * index + _ROW / 2
        p25, p50 = percentile(values, 0.25), percentile(values, 0.50)
        p75, p95 = percentile(values, 0.75), percentile(values, 0.95)
        parts.append(f'<text x="{_LEFT - 6}" y="{mid + 4:.1f}" font-size="11" '
                     f'text-anchor="end">{html.escape(name)} (n={len(values)})</text>')
        parts.append(f'<rect x="{x(p25):.1f}" y="{mid - 7:.1f}" '
                     f'width="{max(x(p75) - x(p25), 1):.1f}" height="14" fill="{colour}" '
                     'fill-opacity="0.18" stroke="none"/>')
        parts.extend(f'<circle cx="{x(v):.1f}" cy="{mid:.1f}" r="2.2" fill="{colour}" '
                     'fill-opacity="0.55"/>' for v in values)
        parts.append(f'<line class="p50" x1="{x(p50):.1f}" x2="{x(p50):.1f}" '
                     f'y1="{mid - 9:.1f}" y2="{mid + 9:.1f}" stroke="#1f2328" '
                     'stroke-width="2.5"/>')
        parts.append(f'<line class="p95" x1="{x(p95):.1f}" x2="{x(p95):.1f}" '
                     f'y1="{mid - 9:.1f}" y2="{mid + 9:.1f}" stroke="#cf222e" '
                     'stroke-width="1.2"/>')
    axis_y = _TOP + _ROW * len(rows) + 4
    parts.append(f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{axis_y}" y2="{axis_y}" '
                 'stroke="#8c959f"/>')
    for tick in _ticks(high):
        parts.append(f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{axis_y}" '
                     f'y2="{axis_y + 4}" stroke="#8c959f"/>')
        parts.append(f'<text x="{x(tick):.1f}" y="{axis_y + 16}" font-size="10" '
                     f'text-anchor="middle">{tick:g}</text>')
    parts.append(f'<text x="{width - _RIGHT}" y="{axis_y + 16}" font-size="10" '
                 'text-anchor="end">ms</text>')
    parts.append("</svg>")
    return "".join(parts)
