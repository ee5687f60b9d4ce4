"""Cut a text quadrilateral out of the original image, upright, by a perspective transform.

The crop's width is the longer of the quad's top and bottom edges, its height the longer
of its left and right edges (PP-OCR's rule); the quad's corners (top-left, top-right,
bottom-right, bottom-left) land on the crop's corners. Pixels are sampled bicubically by
Pillow from a region of the image around the quad whose outside is filled by repeating
the image's edge pixels, so a box that reaches past the page does not bring in black.

A crop at least :data:`TALL_RATIO` times as tall as it is wide holds vertical text (a page
turned by 90 or 270 degrees); :func:`upright_crop` turns it a quarter counter-clockwise,
as PP-OCR does, and the direction classifier then decides whether it is upside down.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from PIL import Image

from edge_ocr_example.errors import TensorMismatch
from edge_ocr_example.quads import quad_size

__all__ = ["TALL_RATIO", "crop_quad", "perspective_coefficients", "upright_crop"]

TALL_RATIO: Final = 1.5
"""A crop with ``height >= TALL_RATIO * width`` is turned a quarter before recognition."""


def perspective_coefficients(src: np.ndarray, dst: np.ndarray) -> tuple[float, ...]:
    """The 8 coefficients of the projective map taking each ``dst`` point to its ``src`` point.

    ``x_src = (a x + b y + c) / (g x + h y + 1)``, ``y_src = (d x + e y + f) / (g x + h y + 1)``:
    the form Pillow's ``Image.transform(..., PERSPECTIVE, data)`` takes.

    Raises:
        TensorMismatch: the points are not ``(4, 2)`` or are degenerate (three collinear).

    """
    s = np.asarray(src, dtype=np.float64)
    d = np.asarray(dst, dtype=np.float64)
    if s.shape != (4, 2) or d.shape != (4, 2):
        raise TensorMismatch("points", "expected two (4, 2) point sets", (s.shape, d.shape))
    matrix = np.zeros((8, 8))
    rhs = np.zeros(8)
    for i, ((x, y), (u, v)) in enumerate(zip(d, s, strict=True)):
        matrix[2 * i] = [x, y, 1, 0, 0, 0, -u * x, -u * y]
        matrix[2 * i + 1] = [0, 0, 0, x, y, 1, -v * x, -v * y]
        rhs[2 * i], rhs[2 * i + 1] = u, v
    try:
        solution = np.linalg.solve(matrix, rhs)
    except np.linalg.LinAlgError as exc:
        raise TensorMismatch("quad", "degenerate quadrilateral", s.tolist()) from exc
    return tuple(float(c) for c in solution)


def crop_quad(image: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """Return the ``h x w x 3`` uint8 pixels inside ``quad`` (image pixels), straightened.

    Raises:
        TensorMismatch: the image is not ``H x W x 3`` uint8 or the quad is not ``(4, 2)``
            or is degenerate.

    """
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise TensorMismatch("image", "expected a non-empty HxWx3 uint8 array", image.shape)
    q = np.asarray(quad, dtype=np.float64)
    if q.shape != (4, 2) or not np.isfinite(q).all():
        raise TensorMismatch("quad", "expected 4 finite (x, y) corners", q.shape)
    width_f, height_f = quad_size(q)
    width, height = max(1, round(width_f)), max(1, round(height_f))
    # The region of the image the quad touches, widened by 2 px and edge-padded where it
    # leaves the image.
    x0 = math.floor(q[:, 0].min()) - 2
    y0 = math.floor(q[:, 1].min()) - 2
    x1 = math.ceil(q[:, 0].max()) + 2
    y1 = math.ceil(q[:, 1].max()) + 2
    rows, cols = image.shape[:2]
    inner = image[max(0, y0) : max(0, min(rows, y1)), max(0, x0) : max(0, min(cols, x1))]
    if inner.size == 0:
        raise TensorMismatch("quad", "lies outside the image", q.tolist())
    region = np.pad(
        inner,
        (
            (max(0, -y0), max(0, y1 - rows)),
            (max(0, -x0), max(0, x1 - cols)),
            (0, 0),
        ),
        mode="edge",
    )
    local = q - np.array([x0, y0], dtype=np.float64)
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float64)
    coefficients = perspective_coefficients(local, target)
    out = Image.fromarray(np.ascontiguousarray(region)).transform(
        (width, height),
        Image.Transform.PERSPECTIVE,
        coefficients,
        resample=Image.Resampling.BICUBIC,
    )
    return np.asarray(out, dtype=np.uint8).copy()


def upright_crop(crop: np.ndarray) -> tuple[np.ndarray, bool]:
    """Turn a tall crop (``h >= TALL_RATIO * w``) a quarter counter-clockwise.

    Returns the crop and whether it was turned.
    """
    height, width = crop.shape[:2]
    if height >= TALL_RATIO * width:
        return np.ascontiguousarray(np.rot90(crop)), True
    return crop, False
