"""DB (differentiable binarisation) post-processing to rotated boxes, in plain numpy.

The detector outputs, per pixel, the probability that it lies in a *shrunk* text region.
Rotated text boxes come out of it as in PP-OCR:

1. threshold the map (``> thresh``) and dilate the mask by 2x2 (:func:`boxes.binarize`);
2. label the 8-connected components as runs of pixels (run-length union-find);
3. per component (largest first, at most ``max_candidates``): the minimum-area rectangle
   of its pixels (pixel-edge coordinates), dropped when its short side is below
   ``min_size``;
4. its score, the mean probability over the component's own pixels, must reach
   ``box_thresh`` (PP-OCR's "slow" score: the rectangle of a long, slightly slanted line
   takes in the paper between its words and along its slant, which the "fast" score
   averages in and so drops such lines);
5. *unclip*: the rectangle grows by ``area * unclip_ratio / perimeter`` on every side to
   undo the shrinking the network was trained with; a result whose short side is below
   ``min_size + 2`` is dropped.

Boxes are ``(4, 2)`` float32 corners (top-left, top-right, bottom-right, bottom-left) in
map pixels; :func:`edge_ocr_example.page_scale.to_image_points` maps them to the image.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from edge_ocr_example.boxes import (
    BOX_THRESH,
    MAX_CANDIDATES,
    MIN_SIZE,
    THRESH,
    UNCLIP_RATIO,
    binarize,
)
from edge_ocr_example.errors import TensorMismatch
from edge_ocr_example.quads import min_area_rect, quad_size, unclip_rect

__all__ = ["component_runs", "detect_quads", "runs_outline"]

_FLOAT: Final = np.float32


def _find(parent: list[int], item: int) -> int:
    root = item
    while parent[root] != root:
        root = parent[root]
    while parent[item] != root:
        parent[item], item = root, parent[item]
    return root


def component_runs(mask: np.ndarray) -> list[np.ndarray]:
    """The 8-connected components of a 2-D boolean mask, each as ``(R, 3)`` int runs.

    A run is ``(row, start, end)`` with ``end`` exclusive. Components come largest first
    (by pixel count; ties by their first run).

    Raises:
        TensorMismatch: ``mask`` is not 2-D.

    """
    if mask.ndim != 2:
        raise TensorMismatch("mask", "expected a 2-D mask", mask.shape)
    padded = np.zeros((mask.shape[0], mask.shape[1] + 2), dtype=np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    start_rows, start_cols = np.nonzero(edges == 1)
    _, end_cols = np.nonzero(edges == -1)
    rows, starts, ends = start_rows.tolist(), start_cols.tolist(), end_cols.tolist()
    parent = list(range(len(rows)))
    above_first = row_first = 0
    for index, row in enumerate(rows):
        if index == 0 or row != rows[index - 1]:
            above_first = row_first if index and rows[index - 1] == row - 1 else index
            row_first = index
        for other in range(above_first, row_first):
            if starts[other] <= ends[index] and starts[index] <= ends[other]:
                a, b = _find(parent, index), _find(parent, other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    if not rows:
        return []
    roots = np.fromiter((_find(parent, i) for i in range(len(rows))), np.int64, len(rows))
    runs = np.stack([start_rows, start_cols, end_cols], axis=1).astype(np.int64)
    order = np.argsort(roots, kind="stable")
    boundaries = np.flatnonzero(np.diff(roots[order])) + 1
    groups = np.split(runs[order], boundaries)
    groups.sort(key=lambda g: (-int((g[:, 2] - g[:, 1]).sum()), int(g[0, 0]), int(g[0, 1])))
    return groups


def runs_outline(runs: np.ndarray) -> np.ndarray:
    """The pixel-edge corner points that bound a component's runs (for its convex hull).

    Per row only the leftmost start and rightmost end matter; each gives its top and
    bottom corner, so the hull of these points is the hull of the pixel squares.
    """
    rows = runs[:, 0]
    unique_rows, first = np.unique(rows, return_index=True)
    left = np.minimum.reduceat(runs[:, 1], first) if len(runs) else runs[:, 1]
    right = np.maximum.reduceat(runs[:, 2], first) if len(runs) else runs[:, 2]
    y = unique_rows.astype(np.float64)
    return np.concatenate(
        [
            np.stack([left, y], 1),
            np.stack([left, y + 1], 1),
            np.stack([right, y], 1),
            np.stack([right, y + 1], 1),
        ]
    ).astype(np.float64)


def _score(row_sums: np.ndarray, runs: np.ndarray) -> float:
    """Mean probability over a component's own pixels, from per-row cumulative sums."""
    rows, starts, ends = runs[:, 0], runs[:, 1], runs[:, 2]
    total = float((row_sums[rows, ends] - row_sums[rows, starts]).sum())
    return total / max(1, int((ends - starts).sum()))


def detect_quads(
    prob: np.ndarray,
    *,
    thresh: float = THRESH,
    box_thresh: float = BOX_THRESH,
    unclip_ratio: float = UNCLIP_RATIO,
    min_size: int = MIN_SIZE,
    max_candidates: int = MAX_CANDIDATES,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(quads, scores)`` for a 2-D probability map, in the order found.

    ``quads`` is ``(K, 4, 2)`` float32 in map pixels (unclipped: a box near the edge may
    reach past the map, as text cut by the page's edge does); ``scores`` is ``(K,)``.

    Raises:
        TensorMismatch: ``prob`` is not a 2-D floating-point map.

    """
    if prob.ndim != 2 or not np.issubdtype(prob.dtype, np.floating):
        raise TensorMismatch("prob", "expected a 2-D float map", (prob.shape, str(prob.dtype)))
    quads: list[np.ndarray] = []
    scores: list[float] = []
    row_sums = np.zeros((prob.shape[0], prob.shape[1] + 1), dtype=np.float64)
    np.cumsum(prob, axis=1, dtype=np.float64, out=row_sums[:, 1:])
    for runs in component_runs(binarize(prob, thresh))[:max_candidates]:
        rect = min_area_rect(runs_outline(runs))
        if min(quad_size(rect)) < min_size:
            continue
        score = _score(row_sums, runs)
        if score < box_thresh:
            continue
        grown = unclip_rect(rect, unclip_ratio)
        if min(quad_size(grown)) < min_size + 2:
            continue
        quads.append(grown.astype(_FLOAT))
        scores.append(score)
    if not quads:
        return np.zeros((0, 4, 2), dtype=_FLOAT), np.zeros(0, dtype=_FLOAT)
    return np.stack(quads), np.asarray(scores, dtype=_FLOAT)
