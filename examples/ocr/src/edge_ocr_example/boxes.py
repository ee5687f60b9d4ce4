"""Text boxes from a DB (differentiable binarisation) probability map, in plain numpy.

The detector outputs, per pixel, the probability that it lies in a *shrunk* text region.
Boxes come out of it in five steps, each simple enough to check by hand:

1. threshold the map (``> thresh``) and dilate the mask by a 2x2 square;
2. label the 8-connected components of the mask (run-length union-find, no per-pixel loop);
3. take each component's axis-aligned bounding rectangle (the text is horizontal);
4. keep it when its side is at least ``min_size`` and the mean probability inside it is at
   least ``box_thresh``;
5. *unclip*: grow it on every side by ``area * unclip_ratio / perimeter`` to undo the
   shrinking the network was trained with, clip to the map, and drop what is still thin.

Boxes are returned as 4 corner points (top-left, top-right, bottom-right, bottom-left) in
map pixel coordinates, sorted in reading order (lines top to bottom, then left to right).
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numpy as np

from edge_ocr_example.buckets import FLOAT
from edge_ocr_example.errors import TensorMismatch

__all__ = [
    "BOX_THRESH",
    "THRESH",
    "UNCLIP_RATIO",
    "Component",
    "binarize",
    "extract_boxes",
    "label_components",
    "reading_order",
    "rectangle_corners",
    "unclip",
]

THRESH: Final = 0.3
"""Pixel probability above which a pixel is text."""
BOX_THRESH: Final = 0.5
"""Minimum mean probability inside a candidate box."""
UNCLIP_RATIO: Final = 1.6
"""How far a shrunk region is grown back (in units of area / perimeter)."""
MIN_SIZE: Final = 3
"""Smallest side, in map pixels, of a candidate before unclipping."""
MAX_CANDIDATES: Final = 1000
"""At most this many components are considered (largest first)."""
LINE_TOLERANCE: Final = 10.0
"""Boxes whose tops differ by less than this many pixels are on the same line."""


class Component(NamedTuple):
    """One 8-connected component of a mask: its bounding rectangle and pixel count.

    ``x1`` and ``y1`` are exclusive: the component spans columns ``x0 .. x1 - 1``.
    """

    x0: int
    y0: int
    x1: int
    y1: int
    pixels: int


def binarize(prob: np.ndarray, thresh: float = THRESH, dilate: bool = True) -> np.ndarray:
    """Return the boolean text mask of a 2-D probability map, optionally dilated by 2x2.

    The 2x2 dilation sets a pixel when it or its upper, left or upper-left neighbour is set.
    """
    mask = prob > thresh
    if dilate:
        grown = mask.copy()
        grown[1:, :] |= mask[:-1, :]
        grown[:, 1:] |= mask[:, :-1]
        grown[1:, 1:] |= mask[:-1, :-1]
        mask = grown
    return mask


def _find(parent: list[int], item: int) -> int:
    root = item
    while parent[root] != root:
        root = parent[root]
    while parent[item] != root:
        parent[item], item = root, parent[item]
    return root


def label_components(mask: np.ndarray) -> list[Component]:
    """Return the 8-connected components of a 2-D boolean mask, largest first.

    Each row is split into runs of set pixels (vectorised); a run joins every run of the
    row above that it touches, diagonals included, through a union-find over runs.
    """
    if mask.ndim != 2:
        raise TensorMismatch("mask", "expected a 2-D mask", mask.shape)
    padded = np.zeros((mask.shape[0], mask.shape[1] + 2), dtype=np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    start_rows, start_cols = np.nonzero(edges == 1)
    _, end_cols = np.nonzero(edges == -1)  # exclusive ends, same row-major order as starts
    rows = start_rows.tolist()
    starts = start_cols.tolist()
    ends = end_cols.tolist()
    parent = list(range(len(rows)))
    above_first = 0  # first run of the previous row
    row_first = 0  # first run of the current row
    for index, row in enumerate(rows):
        if index == 0 or row != rows[index - 1]:
            above_first = row_first if index and rows[index - 1] == row - 1 else index
            row_first = index
        if above_first == row_first:
            continue  # no runs in the row above
        for other in range(above_first, row_first):
            # 8-connectivity: runs touch when they overlap once each is widened by one.
            if starts[other] <= ends[index] and starts[index] <= ends[other]:
                a, b = _find(parent, index), _find(parent, other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    boxes: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        root = _find(parent, index)
        size = ends[index] - starts[index]
        box = boxes.get(root)
        if box is None:
            boxes[root] = [starts[index], row, ends[index], row + 1, size]
        else:
            box[0] = min(box[0], starts[index])
            box[2] = max(box[2], ends[index])
            box[3] = row + 1
            box[4] += size
    components = [Component(*box) for box in boxes.values()]
    components.sort(key=lambda c: (-c.pixels, c.y0, c.x0))
    return components


def unclip(
    x0: float, y0: float, x1: float, y1: float, ratio: float = UNCLIP_RATIO
) -> tuple[float, float, float, float]:
    """Grow a rectangle on every side by ``area * ratio / perimeter``."""
    width, height = x1 - x0, y1 - y0
    distance = width * height * ratio / (2.0 * (width + height))
    return x0 - distance, y0 - distance, x1 + distance, y1 + distance


def rectangle_corners(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    """The 4x2 float32 corners of a rectangle: top-left, top-right, bottom-right, bottom-left."""
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=FLOAT)


def reading_order(boxes: np.ndarray, tolerance: float = LINE_TOLERANCE) -> np.ndarray:
    """Indices that sort ``(K, 4, 2)`` boxes into lines top to bottom, each left to right.

    A box starts a new line when its top is ``tolerance`` or more below the first box of the
    current line (boxes taken by ascending top).
    """
    if len(boxes) == 0:
        return np.zeros(0, dtype=np.int64)
    tops = boxes[:, 0, 1].astype(np.float64)
    lefts = boxes[:, 0, 0].astype(np.float64)
    by_top = np.lexsort((lefts, tops))
    line_of = np.zeros(len(boxes), dtype=np.int64)
    line, line_top = 0, tops[by_top[0]]
    for index in by_top:
        if tops[index] - line_top >= tolerance:
            line, line_top = line + 1, tops[index]
        line_of[index] = line
    return np.lexsort((lefts, line_of))


def extract_boxes(
    prob: np.ndarray,
    *,
    thresh: float = THRESH,
    box_thresh: float = BOX_THRESH,
    unclip_ratio: float = UNCLIP_RATIO,
    min_size: int = MIN_SIZE,
    max_candidates: int = MAX_CANDIDATES,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(boxes, scores)`` for a 2-D probability map, boxes in reading order.

    ``boxes`` is ``(K, 4, 2)`` float32 corner points in map pixels (edges, not centres:
    a box covering columns 3..7 spans x = 3 .. 8); ``scores`` is ``(K,)`` float32, each
    the mean probability inside the box before unclipping.

    Raises:
        TensorMismatch: ``prob`` is not a 2-D floating-point map.

    """
    if prob.ndim != 2 or not np.issubdtype(prob.dtype, np.floating):
        raise TensorMismatch("prob", "expected a 2-D float map", (prob.shape, str(prob.dtype)))
    height, width = prob.shape
    found: list[np.ndarray] = []
    scores: list[float] = []
    for component in label_components(binarize(prob, thresh))[:max_candidates]:
        x0, y0, x1, y1, _ = component
        if min(x1 - x0, y1 - y0) < min_size:
            continue
        score = float(prob[y0:y1, x0:x1].mean(dtype=np.float64))
        if score < box_thresh:
            continue
        ux0, uy0, ux1, uy1 = unclip(x0, y0, x1, y1, unclip_ratio)
        if min(ux1 - ux0, uy1 - uy0) < min_size + 2:
            continue
        cx0, cx1 = np.clip(np.round([ux0, ux1]), 0, width)
        cy0, cy1 = np.clip(np.round([uy0, uy1]), 0, height)
        if cx1 - cx0 <= 3 or cy1 - cy0 <= 3:
            continue
        found.append(rectangle_corners(cx0, cy0, cx1, cy1))
        scores.append(score)
    if not found:
        return np.zeros((0, 4, 2), dtype=FLOAT), np.zeros(0, dtype=FLOAT)
    boxes = np.stack(found)
    order = reading_order(boxes)
    return boxes[order], np.asarray(scores, dtype=FLOAT)[order]
