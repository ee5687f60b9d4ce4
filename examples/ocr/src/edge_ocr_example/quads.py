"""Plane geometry of text boxes: convex hull, minimum-area rectangle, corner order, unclip.

A text box is a quadrilateral: ``(4, 2)`` float (x, y) corners in the order top-left,
top-right, bottom-right, bottom-left (the order PP-OCR uses: the two leftmost corners are
the left side, each pair ordered by y). Rotated text gives a rotated rectangle.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from edge_ocr_example.errors import TensorMismatch

__all__ = [
    "convex_hull",
    "min_area_rect",
    "order_corners",
    "point_in_quad_mask",
    "quad_size",
    "unclip_rect",
]

_EPS: Final = 1e-9


def convex_hull(points: np.ndarray) -> np.ndarray:
    """The convex hull of ``(N, 2)`` points, counter-clockwise (y down), no repeated point.

    Andrew's monotone chain; collinear points on an edge are dropped.

    Raises:
        TensorMismatch: ``points`` is not a non-empty ``(N, 2)`` array.

    """
    if points.ndim != 2 or points.shape[1] != 2 or len(points) == 0:
        raise TensorMismatch("points", "expected a non-empty (N, 2) array", points.shape)
    unique = _sorted_unique(np.asarray(points, dtype=np.float64))
    if len(unique) <= 2:
        return unique
    pts = unique.tolist()

    def chain(sequence: list[list[float]]) -> list[list[float]]:
        hull: list[list[float]] = []
        for p in sequence:
            while len(hull) >= 2:
                (ax, ay), (bx, by) = hull[-2], hull[-1]
                if (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax) > _EPS:
                    break
                hull.pop()
            hull.append(p)
        return hull

    lower = chain(pts)
    upper = chain(pts[::-1])
    return np.asarray(lower[:-1] + upper[:-1], dtype=np.float64)


def _sorted_unique(points: np.ndarray) -> np.ndarray:
    """The distinct points sorted by x, then y: ``np.unique(points, axis=0)``, faster.

    ``np.unique`` along an axis sorts the rows as records, several times slower than a
    lexsort of the two columns for the few hundred corners of a text component. Finite
    points only (-0.0 read as 0.0); others go to ``np.unique``.
    """
    if not np.isfinite(points).all():
        return np.unique(points, axis=0)
    points = points + 0.0  # -0.0 -> 0.0: equal points compare and print alike
    ordered = points[np.lexsort((points[:, 1], points[:, 0]))]
    distinct = np.empty(len(ordered), dtype=bool)
    distinct[:1] = True
    np.any(ordered[1:] != ordered[:-1], axis=1, out=distinct[1:])
    return ordered[distinct]


def order_corners(corners: np.ndarray) -> np.ndarray:
    """Order 4 corners as top-left, top-right, bottom-right, bottom-left (PP-OCR's rule).

    The two corners with the smallest x form the left side; of each side the one with the
    smaller y is the top.
    """
    by_x = corners[np.argsort(corners[:, 0], kind="stable")]
    left, right = by_x[:2], by_x[2:]
    top_left, bottom_left = (left[0], left[1]) if left[0, 1] <= left[1, 1] else (left[1], left[0])
    top_right, bottom_right = (
        (right[0], right[1]) if right[0, 1] <= right[1, 1] else (right[1], right[0])
    )
    return np.stack([top_left, top_right, bottom_right, bottom_left])


def min_area_rect(points: np.ndarray) -> np.ndarray:
    """The minimum-area enclosing rectangle of ``(N, 2)`` points as ordered ``(4, 2)`` corners.

    Rotating calipers: the best rectangle has a side on an edge of the convex hull, so each
    hull edge direction is tried. Degenerate inputs (one point, a segment) give a rectangle
    of zero width or height.
    """
    hull = convex_hull(points)
    if len(hull) == 1:
        return np.repeat(hull, 4, axis=0)
    edges = np.roll(hull, -1, axis=0) - hull
    lengths = np.hypot(edges[:, 0], edges[:, 1])
    keep = lengths > _EPS
    u = edges[keep] / lengths[keep, None]  # (K, 2) unit edge directions
    v = np.stack([-u[:, 1], u[:, 0]], axis=1)
    pu = hull @ u.T  # (N, K) projections
    pv = hull @ v.T
    areas = (pu.max(0) - pu.min(0)) * (pv.max(0) - pv.min(0))
    best = int(np.argmin(areas))
    a, b = u[best], v[best]
    u0, u1 = pu[:, best].min(), pu[:, best].max()
    v0, v1 = pv[:, best].min(), pv[:, best].max()
    corners = np.array(
        [u0 * a + v0 * b, u1 * a + v0 * b, u1 * a + v1 * b, u0 * a + v1 * b], dtype=np.float64
    )
    return order_corners(corners)


def quad_size(quad: np.ndarray) -> tuple[float, float]:
    """``(width, height)`` of an ordered quadrilateral: its longer top/bottom and left/right."""
    q = np.asarray(quad, dtype=np.float64)
    width = max(np.hypot(*(q[1] - q[0])), np.hypot(*(q[2] - q[3])))
    height = max(np.hypot(*(q[3] - q[0])), np.hypot(*(q[2] - q[1])))
    return float(width), float(height)


def unclip_rect(rect: np.ndarray, ratio: float) -> np.ndarray:
    """Grow an ordered rectangle by ``area * ratio / perimeter`` on every side.

    This is what offsetting the rectangle's outline by that distance (PP-OCR's unclip)
    and taking the minimum-area rectangle of the result amounts to.
    """
    r = np.asarray(rect, dtype=np.float64)
    width, height = quad_size(r)
    perimeter = 2.0 * (width + height)
    if perimeter <= _EPS:
        return r.copy()
    distance = width * height * ratio / perimeter
    centre = r.mean(axis=0)
    along = r[1] - r[0]
    across = r[3] - r[0]
    along /= max(np.hypot(*along), _EPS)
    across /= max(np.hypot(*across), _EPS)
    half_w, half_h = width / 2 + distance, height / 2 + distance
    corners = np.array(
        [
            centre - half_w * along - half_h * across,
            centre + half_w * along - half_h * across,
            centre + half_w * along + half_h * across,
            centre - half_w * along + half_h * across,
        ]
    )
    return order_corners(corners)


def point_in_quad_mask(quad: np.ndarray, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    """Boolean mask over pixels ``[y0, y1) x [x0, x1)`` whose centres lie in a convex quad.

    Pixel (row r, column c) has its centre at (c + 0.5, r + 0.5); a centre on an edge counts
    as inside. With pixel-edge coordinates, a quad drawn around pixels covers exactly them.
    """
    q = np.asarray(quad, dtype=np.float64)
    ys, xs = np.mgrid[y0:y1, x0:x1]
    cx, cy = xs + 0.5, ys + 0.5
    area2 = 0.0
    for i in range(4):
        a, b = q[i], q[(i + 1) % 4]
        area2 += a[0] * b[1] - b[0] * a[1]
    sign = 1.0 if area2 >= 0 else -1.0
    inside = np.ones(cx.shape, dtype=bool)
    for i in range(4):
        a, b = q[i], q[(i + 1) % 4]
        edge = b - a
        length = max(float(np.hypot(*edge)), _EPS)
        cross = (edge[0] * (cy - a[1]) - edge[1] * (cx - a[0])) * sign / length
        inside &= cross >= -1e-6
    return inside
