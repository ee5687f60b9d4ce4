"""Image -> detection input: letterbox into the fixed detection bucket and normalise.

The image is scaled by one factor (never enlarged past the bucket, aspect kept) so that it
fits ``DET_HEIGHT x DET_WIDTH``, placed at the top-left corner, and the rest of the bucket
is filled with the normalised mid-grey value 0. Pixels map to ``(v / 255 - 0.5) / 0.5``, the
normalisation all three PP-OCR graphs were trained with. Boxes found in bucket coordinates
map back to the image with :func:`to_image_coordinates`.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from edge_ocr_example.buckets import DET_HEIGHT, DET_INPUT, DET_SHAPE, DET_WIDTH, FLOAT
from edge_ocr_example.errors import TensorMismatch

__all__ = ["letterbox_scale", "normalize", "preprocess", "to_image_coordinates"]


def letterbox_scale(image_height: int, image_width: int) -> float:
    """The factor that maps image pixels to bucket pixels (at most 1: images never grow)."""
    return min(1.0, DET_HEIGHT / image_height, DET_WIDTH / image_width)


def normalize(pixels: np.ndarray) -> np.ndarray:
    """Map uint8 (or float 0..255) HxWx3 RGB pixels to the float32 3xHxW network range."""
    scaled = pixels.astype(FLOAT) / np.float32(255.0)
    return np.ascontiguousarray(((scaled - np.float32(0.5)) / np.float32(0.5)).transpose(2, 0, 1))


def preprocess(image: np.ndarray, out: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Return the detection stage's inputs for an ``H x W x 3`` uint8 RGB image.

    ``out`` (a ``DET_SHAPE`` float32 array, e.g. a pipeline input buffer) receives the
    bucket in place instead of a new array.

    Raises:
        TensorMismatch: the image is not a non-empty HxWx3 uint8 array, or ``out`` is not
            a writable float32 array of the bucket's shape.

    """
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise TensorMismatch(
            "image", "expected an HxWx3 uint8 RGB array", (image.shape, str(image.dtype))
        )
    height, width = image.shape[:2]
    if height == 0 or width == 0:
        raise TensorMismatch("image", "image is empty", image.shape)
    scale = letterbox_scale(height, width)
    if scale < 1.0:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        pixels = np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR))
    else:
        pixels = image
    if out is None:
        bucket = np.zeros(DET_SHAPE, dtype=FLOAT)
    elif out.shape != DET_SHAPE or out.dtype != FLOAT or not out.flags.writeable:
        raise TensorMismatch("out", "expected a writable float32 bucket array",
                             (out.shape, str(out.dtype)))
    else:
        bucket = out
        bucket[...] = 0
    bucket[0, :, : pixels.shape[0], : pixels.shape[1]] = normalize(pixels)
    return {DET_INPUT: bucket}


def to_image_coordinates(boxes: np.ndarray, image_height: int, image_width: int) -> np.ndarray:
    """Map ``(..., 2)`` (x, y) points from bucket coordinates back to the original image."""
    scale = letterbox_scale(image_height, image_width)
    points = boxes.astype(np.float64) / scale
    points[..., 0] = np.clip(points[..., 0], 0, image_width)
    points[..., 1] = np.clip(points[..., 1], 0, image_height)
    return points.astype(FLOAT)
