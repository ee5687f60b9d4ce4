"""Line crops (uint8 RGB, upright) -> classifier and recogniser input rows.

Both graphs take ``3 x 48 x W`` rows normalised to ``(v / 255 - 0.5) / 0.5``. A crop is
resized to height 48 with its aspect ratio kept (Pillow's bilinear filter, which averages
when it shrinks, so large print is not aliased), left-aligned, and the rest of the row is
0 (the normalised mid-grey PP-OCR pads with). A crop wider than the row is squeezed to it:
the recogniser gets pieces that fit (:mod:`edge_ocr_example.line_split`), the classifier
only needs the start of the line's shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

from edge_ocr_example.errors import OcrError, TensorMismatch

__all__ = ["fit_width", "line_row", "pick_width"]


def fit_width(crop_height: int, crop_width: int, height: int) -> int:
    """The width of a ``crop_height x crop_width`` crop resized to ``height`` (at least 1)."""
    return max(1, math.ceil(height * crop_width / max(1, crop_height)))


def pick_width(needed: int, widths: Sequence[int]) -> int:
    """The narrowest of ``widths`` that holds ``needed`` columns (the widest when none does).

    Raises:
        OcrError: ``widths`` is empty.

    """
    if not widths:
        raise OcrError("widths", "no recognition width is declared", list(widths))
    fitting = [w for w in widths if w >= needed]
    return min(fitting) if fitting else max(widths)


def line_row(crop: np.ndarray, height: int, width: int) -> np.ndarray:
    """Return the ``3 x height x width`` float32 input row for an ``h x w x 3`` uint8 crop.

    Raises:
        TensorMismatch: the crop is not a non-empty ``h x w x 3`` uint8 array.

    """
    if crop.dtype != np.uint8 or crop.ndim != 3 or crop.shape[2] != 3 or 0 in crop.shape:
        raise TensorMismatch("crop", "expected a non-empty h x w x 3 uint8 crop", crop.shape)
    resized_width = min(width, fit_width(crop.shape[0], crop.shape[1], height))
    pixels = np.asarray(
        Image.fromarray(crop).resize((resized_width, height), Image.Resampling.BILINEAR)
    )
    row = np.zeros((3, height, width), dtype=np.float32)
    row[:, :, :resized_width] = (
        pixels.astype(np.float32) * np.float32(2.0 / 255.0) - np.float32(1.0)
    ).transpose(2, 0, 1)
    return row
