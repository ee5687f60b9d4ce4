"""Reading order of text boxes: top to bottom, left to right, columns kept apart.

Boxes are quadrilaterals in image pixels, each with the number of quarter turns
(counter-clockwise) its crop took to be read upright: 1 for a tall crop turned by
:func:`~edge_ocr_example.perspective.upright_crop`, plus 2 when the direction classifier
turned it by 180 degrees. The order is decided in the page's *text frame*:

1. each box's reading direction is its top edge (turned by its quarter turns); the page's
   direction is their length-weighted circular mean, and every box is rotated by minus
   that angle, so a page turned by 4, 90 or 180 degrees is ordered as its text reads;
2. boxes whose inner halves (the middle half of each box's height) overlap vertically
   form a *band* (one row of text across the page);
3. consecutive bands that leave a common vertical *gutter* free (a gap between boxes at
   least half a line high wide) form a *block* of columns; a band that lies wholly on one
   side of the gutter (a column's short last line) continues the block; a block is read
   as columns only when at least two of its bands hold boxes on both sides (one line
   that the detector cut in two is not a column layout);
4. a block of three or more columns one of which is narrower than a gap beside it is a
   *table* (quantities and prices beside their labels), read row by row like a block
   without columns;
5. blocks are read top to bottom; inside a block each column left to right, and inside a
   column (or a block without columns) lines top to bottom, each left to right.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from edge_ocr_example.errors import TensorMismatch

__all__ = ["page_angle", "reading_order", "text_frame_boxes"]

_LINE_TOLERANCE: Final = 0.5
"""Boxes whose centres differ by less than this many box heights are on one line."""
_GUTTER: Final = 0.5
"""Smallest gutter between columns, in median box heights."""
_TABLE_COLUMNS: Final = 3
"""A block needs at least this many columns to be read as a table (:func:`_is_table`)."""


def _directions(quads: np.ndarray, turns: np.ndarray) -> np.ndarray:
    """Each box's reading direction (unit vector, image pixels) after its quarter turns."""
    along = quads[:, 1] - quads[:, 0]
    across = quads[:, 3] - quads[:, 0]
    k = (turns % 4)[:, None]
    direction = np.where(k == 0, along, np.where(k == 1, across, np.where(k == 2, -along, -across)))
    norm = np.maximum(np.hypot(direction[:, 0], direction[:, 1]), 1e-9)
    out: np.ndarray = direction / norm[:, None]
    return out


def page_angle(quads: np.ndarray, turns: np.ndarray | None = None) -> float:
    """The page's reading direction in radians (0: left to right, y pointing down)."""
    q = np.asarray(quads, dtype=np.float64)
    if len(q) == 0:
        return 0.0
    t = np.zeros(len(q), np.int64) if turns is None else np.asarray(turns, np.int64)
    directions = _directions(q, t)
    weights = np.hypot(*(q[:, 1] - q[:, 0]).T) + np.hypot(*(q[:, 3] - q[:, 0]).T)
    x = float((directions[:, 0] * weights).sum())
    y = float((directions[:, 1] * weights).sum())
    return math.atan2(y, x) if abs(x) + abs(y) > 1e-9 else 0.0


def text_frame_boxes(quads: np.ndarray, angle: float) -> np.ndarray:
    """``(K, 4)`` axis-aligned ``x0, y0, x1, y1`` of each quad rotated by ``-angle``."""
    q = np.asarray(quads, dtype=np.float64)
    c, s = math.cos(angle), math.sin(angle)
    x = q[..., 0] * c + q[..., 1] * s
    y = -q[..., 0] * s + q[..., 1] * c
    return np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], axis=1)


def _free(intervals: Sequence[tuple[float, float]], span: tuple[float, float],
          min_width: float) -> list[tuple[float, float]]:
    """The gaps of ``span`` that ``intervals`` leave uncovered, at least ``min_width`` wide."""
    gaps: list[tuple[float, float]] = []
    cursor = span[0]
    for x0, x1 in sorted(intervals):
        if x0 - cursor >= min_width:
            gaps.append((cursor, x0))
        cursor = max(cursor, x1)
    if span[1] - cursor >= min_width:
        gaps.append((cursor, span[1]))
    return gaps


def _intersect(gutters: Sequence[tuple[float, float]], free: Sequence[tuple[float, float]],
               min_width: float) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for g0, g1 in gutters:
        for f0, f1 in free:
            lo, hi = max(g0, f0), min(g1, f1)
            if hi - lo >= min_width:
                out.append((lo, hi))
    return out


def _line_sort(indices: list[int], boxes: np.ndarray) -> list[int]:
    """Lines top to bottom (centres within half a box height), each left to right."""
    if len(indices) <= 1:
        return list(indices)
    centre = (boxes[indices, 1] + boxes[indices, 3]) / 2
    height = boxes[indices, 3] - boxes[indices, 1]
    order = [indices[i] for i in np.argsort(centre, kind="stable")]
    lines: list[list[int]] = []
    first_centre = 0.0
    for index in order:
        c = (boxes[index, 1] + boxes[index, 3]) / 2
        tolerance = _LINE_TOLERANCE * float(np.median(height))
        if lines and c - first_centre < tolerance:
            lines[-1].append(index)
        else:
            lines.append([index])
            first_centre = c
    return [i for line in lines for i in sorted(line, key=lambda j: boxes[j, 0])]


def _two_sided_bands(members: list[int], bands: list[list[int]], boxes: np.ndarray,
                     cuts: list[float]) -> int:
    """How many of the block's bands hold boxes on both sides of some gutter."""
    inside = set(members)
    count = 0
    for band in bands:
        if not inside.issuperset(band):
            continue
        centres = [(boxes[i, 0] + boxes[i, 2]) / 2 for i in band]
        sides = {int(np.searchsorted(cuts, c)) for c in centres}
        count += len(sides) > 1
    return count


def _is_table(columns: Sequence[list[int]], boxes: np.ndarray) -> bool:
    """Whether a block's columns are a table's (read row by row), not columns of text.

    A column of running text is wider than the gutter beside it; a table's column
    (quantities, prices, short labels) is often narrower than the space that separates it
    from its neighbours. A block of three or more columns with one narrower than a gap
    next to it is a table. Two columns stay columns: two short columns far apart (a
    two-column list, or the short lines of two text columns) cannot be told from a
    two-column table by their boxes.
    """
    if len(columns) < _TABLE_COLUMNS:
        return False
    extents = [(float(boxes[c, 0].min()), float(boxes[c, 2].max())) for c in columns]
    for (left0, left1), (right0, right1) in itertools.pairwise(extents):
        gap = right0 - left1
        if left1 - left0 < gap or right1 - right0 < gap:
            return True
    return False


def reading_order(quads: np.ndarray, turns: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Indices that put ``(K, 4, 2)`` quads (image pixels) into reading order.

    ``turns[i]`` is the number of counter-clockwise quarter turns box ``i``'s crop took to
    read upright (0 when omitted). See the module docstring for the rule.

    Raises:
        TensorMismatch: ``quads`` is not ``(K, 4, 2)`` or ``turns`` has another length.

    """
    q = np.asarray(quads, dtype=np.float64)
    if q.ndim != 3 or q.shape[1:] != (4, 2):
        raise TensorMismatch("quads", "expected (K, 4, 2) corner points", q.shape)
    t = np.zeros(len(q), np.int64) if turns is None else np.asarray(turns, np.int64)
    if t.shape != (len(q),):
        raise TensorMismatch("turns", f"expected one per box ({len(q)})", t.shape)
    if len(q) <= 1:
        return np.arange(len(q), dtype=np.int64)
    boxes = text_frame_boxes(q, page_angle(q, t))
    heights = boxes[:, 3] - boxes[:, 1]
    min_gutter = _GUTTER * float(np.median(heights))
    inner_top = boxes[:, 1] + heights / 4
    inner_bottom = boxes[:, 3] - heights / 4
    # bands: rows of boxes whose inner halves overlap
    bands: list[list[int]] = []
    band_bottom = -math.inf
    for index in np.argsort(inner_top, kind="stable").tolist():
        if bands and inner_top[index] < band_bottom:
            bands[-1].append(index)
            band_bottom = max(band_bottom, inner_bottom[index])
        else:
            bands.append([index])
            band_bottom = inner_bottom[index]
    # blocks: consecutive bands sharing a free gutter
    span = (float(boxes[:, 0].min()), float(boxes[:, 2].max()))
    blocks: list[tuple[list[int], list[tuple[float, float]]]] = []
    for band in bands:
        extents = [(float(boxes[i, 0]), float(boxes[i, 2])) for i in band]
        free = _free(extents, span, min_gutter)
        if blocks and blocks[-1][1]:
            shared = _intersect(blocks[-1][1], free, min_gutter)
            if shared:
                blocks[-1][0].extend(band)
                blocks[-1] = (blocks[-1][0], shared)
                continue
        inner_span = (min(e[0] for e in extents), max(e[1] for e in extents))
        blocks.append((list(band), _free(extents, inner_span, min_gutter)))
    order: list[int] = []
    for members, gutters in blocks:
        cuts = sorted((g0 + g1) / 2 for g0, g1 in gutters)
        if not cuts or _two_sided_bands(members, bands, boxes, cuts) < 2:
            order.extend(_line_sort(members, boxes))  # one column (a split line is no gutter)
            continue
        columns: list[list[int]] = [[] for _ in range(len(cuts) + 1)]
        for index in members:
            centre = (boxes[index, 0] + boxes[index, 2]) / 2
            columns[int(np.searchsorted(cuts, centre))].append(index)
        columns = [column for column in columns if column]
        if _is_table(columns, boxes):
            order.extend(_line_sort(members, boxes))  # a table's rows are read across
            continue
        for column in columns:
            order.extend(_line_sort(column, boxes))
    return np.asarray(order, dtype=np.int64)
