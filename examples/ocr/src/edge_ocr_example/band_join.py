"""Text boxes of a folded page: each band's boxes in the page, and text the cuts divided joined.

A long, thin page is detected folded (:mod:`edge_ocr_example.page_scale`): cut across its
long side into bands that overlap, laid side by side in the detection input. Each band's
part of the probability map is post-processed on its own (:func:`regions.detect_quads`),
its boxes moved to where the band lies in the scaled page, and then the boxes of
neighbouring bands that hold the same text are joined:

* a line the cut crosses is found twice in part: up to one band's end and from the next
  band's start, both parts reaching into the overlap the bands share;
* a line lying in the overlap is found whole in both bands.

Two boxes of neighbouring bands are the same text when, measured along the text
direction of the larger of the two (the longer side of its bounding rectangle), their
extents overlap, and across it they overlap by at least :data:`SAME_LINE` of the thinner
one (two lines one above the other overlap across by far less). A group of such boxes
becomes the minimum-area rectangle of all their corners, scored by the area-weighted mean
of their scores.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from edge_ocr_example.errors import TensorMismatch
from edge_ocr_example.page_scale import PageFrame, band_windows
from edge_ocr_example.quads import min_area_rect, quad_size
from edge_ocr_example.regions import detect_quads

__all__ = ["SAME_LINE", "join_cut_quads", "page_quads"]

SAME_LINE: Final = 0.5
"""Two boxes of neighbouring bands are one text when they overlap across the text by at
least this share of the thinner box."""


def page_quads(prob: np.ndarray, frame: PageFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(quads, scores)`` of a detection map, the quads in the scaled page's pixels.

    An unfolded page's map is post-processed whole, exactly as
    :func:`~edge_ocr_example.regions.detect_quads` does; a folded page's band by band,
    and the text its cuts divided joined (:func:`join_cut_quads`).

    Raises:
        TensorMismatch: ``prob`` is not a 2-D float map of the frame's padded size.

    """
    if frame.folds <= 1:
        return detect_quads(prob)
    if prob.shape != (frame.padded_height, frame.padded_width):
        raise TensorMismatch("prob", "expected the folded frame's padded size",
                             (prob.shape, (frame.padded_height, frame.padded_width)))
    quads: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    bands: list[np.ndarray] = []
    for index, window in enumerate(band_windows(frame)):
        part = prob[window.row : window.row + window.height,
                    window.column : window.column + window.width]
        found, score = detect_quads(part)
        quads.append(found + np.array([window.x, window.y], dtype=found.dtype))
        scores.append(score)
        bands.append(np.full(len(found), index, dtype=np.int64))
    return join_cut_quads(np.concatenate(quads), np.concatenate(scores), np.concatenate(bands))


def _bounds(quads: np.ndarray) -> np.ndarray:
    """``(K, 4)`` axis-aligned ``x0, y0, x1, y1`` of ``(K, 4, 2)`` quads."""
    return np.concatenate([quads.min(axis=1), quads.max(axis=1)], axis=1)


def _same_text(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two bounding rectangles (``x0, y0, x1, y1``) hold the same text."""
    larger = a if (a[2] - a[0]) * (a[3] - a[1]) >= (b[2] - b[0]) * (b[3] - b[1]) else b
    along, across = (0, 1) if larger[2] - larger[0] >= larger[3] - larger[1] else (1, 0)
    if min(a[along + 2], b[along + 2]) - max(a[along], b[along]) <= 0:
        return False
    overlap = min(a[across + 2], b[across + 2]) - max(a[across], b[across])
    thinner = min(a[across + 2] - a[across], b[across + 2] - b[across])
    return bool(overlap >= SAME_LINE * thinner and thinner > 0)


def _root(parent: list[int], item: int) -> int:
    while parent[item] != item:
        parent[item] = parent[parent[item]]
        item = parent[item]
    return item


def join_cut_quads(quads: np.ndarray, scores: np.ndarray,
                   bands: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Join the boxes of neighbouring bands that hold the same text (module docstring).

    ``quads`` ``(K, 4, 2)``, ``scores`` ``(K,)`` and ``bands`` ``(K,)`` (each box's band
    index); boxes come back in the order of their group's first box.

    Raises:
        TensorMismatch: the three differ in length or ``quads`` is not ``(K, 4, 2)``.

    """
    q = np.asarray(quads, dtype=np.float64)
    if q.ndim != 3 or q.shape[1:] != (4, 2) or not len(q) == len(scores) == len(bands):
        raise TensorMismatch("quads", "expected (K, 4, 2) quads with K scores and K bands",
                             (q.shape, len(scores), len(bands)))
    dtype = np.asarray(quads).dtype
    bounds = _bounds(q) if len(q) else np.zeros((0, 4))
    parent = list(range(len(q)))
    for i in range(len(q)):
        for j in np.flatnonzero(bands == bands[i] + 1).tolist():
            if _same_text(bounds[i], bounds[j]):
                a, b = _root(parent, i), _root(parent, j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(q)):
        groups.setdefault(_root(parent, i), []).append(i)
    joined: list[np.ndarray] = []
    joined_scores: list[float] = []
    for members in groups.values():
        if len(members) == 1:
            joined.append(q[members[0]])
            joined_scores.append(float(scores[members[0]]))
            continue
        joined.append(min_area_rect(q[members].reshape(-1, 2)))
        areas = np.array([max(1e-9, float(np.prod(quad_size(q[i])))) for i in members])
        joined_scores.append(float((np.asarray(scores)[members] * areas).sum() / areas.sum()))
    if not joined:
        return np.zeros((0, 4, 2), dtype=dtype), np.zeros(0, dtype=np.float32)
    return np.stack(joined).astype(dtype), np.asarray(joined_scores, dtype=np.float32)
