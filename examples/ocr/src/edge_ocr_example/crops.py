"""Cut text boxes out of the normalised detection input and fit them to a crop bucket.

Crops come from the detection stage's own input tensor, which is already normalised the
way the classifier and recogniser expect (both use ``(v / 255 - 0.5) / 0.5``); bilinear
resizing is linear, so resizing normalised pixels equals normalising resized ones. A crop
is resized to the bucket height keeping its aspect ratio (capped at the bucket width) and
left-aligned; the rest of the row is 0, the normalised mid-grey PP-OCR pads with.
"""

from __future__ import annotations

import math

import numpy as np

from edge_ocr_example.buckets import FLOAT
from edge_ocr_example.errors import TensorMismatch

__all__ = ["crop_box", "fit_crop", "resize_bilinear", "rotate_half_turn"]


def _axis_weights(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices (low, high) and high-side weights for half-pixel-centred sampling."""
    position = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
    position = np.clip(position, 0.0, size_in - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, size_in - 1)
    return low, high, (position - low).astype(FLOAT)


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize a ``C x H x W`` float32 image bilinearly (half-pixel centres, edges clamped)."""
    if image.ndim != 3 or min(image.shape) == 0:
        raise TensorMismatch("image", "expected a non-empty CxHxW array", image.shape)
    if height < 1 or width < 1:
        raise TensorMismatch("size", "target size must be positive", (height, width))
    low, high, weight = _axis_weights(image.shape[1], height)
    column = weight[None, :, None]
    rows = image[:, low, :] * (1 - column) + image[:, high, :] * column
    low, high, weight = _axis_weights(image.shape[2], width)
    row = weight[None, None, :]
    out: np.ndarray = (rows[:, :, low] * (1 - row) + rows[:, :, high] * row).astype(FLOAT)
    return out


def crop_box(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Return the ``C x h x w`` pixels of ``image`` (``C x H x W``) inside a 4x2 box.

    The box's extent is rounded outwards to whole pixels and clipped to the image.

    Raises:
        TensorMismatch: the box is not 4x2 or covers no pixel of the image.

    """
    if box.shape != (4, 2):
        raise TensorMismatch("box", "expected 4 (x, y) corner points", box.shape)
    height, width = image.shape[1:]
    x0 = max(0, math.floor(float(box[:, 0].min())))
    x1 = min(width, math.ceil(float(box[:, 0].max())))
    y0 = max(0, math.floor(float(box[:, 1].min())))
    y1 = min(height, math.ceil(float(box[:, 1].max())))
    if x1 <= x0 or y1 <= y0:
        raise TensorMismatch("box", "covers no pixel of the image", box.tolist())
    return image[:, y0:y1, x0:x1]


def rotate_half_turn(crop: np.ndarray) -> np.ndarray:
    """Rotate a ``C x h x w`` crop by 180 degrees."""
    return np.ascontiguousarray(crop[:, ::-1, ::-1])


def fit_crop(crop: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize ``crop`` to ``height`` (aspect kept, width capped) and pad it to ``width``."""
    h, w = crop.shape[1:]
    resized_width = min(width, math.ceil(height * w / h))
    out = np.zeros((crop.shape[0], height, width), dtype=FLOAT)
    out[:, :, :resized_width] = resize_bilinear(crop, height, resized_width)
    return out
