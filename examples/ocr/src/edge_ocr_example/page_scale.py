"""Detection at the page's own scale: how an image maps into the detection input and back.

PP-OCR's detector is fully convolutional: it reads a page at (almost) any size whose sides
are multiples of 32. A page is therefore not squeezed into one square; it is

1. scaled by one factor so that its longer side is at most ``limit`` pixels (960 by
   default; smaller pages are never enlarged), aspect ratio kept;
2. normalised to ``(v / 255 - 0.5) / 0.5``, the range all three PP-OCR graphs use;
3. padded at the right and bottom to the next multiple of 32 with white paper
   (normalised 1.0), so the padding looks like the page's margin, not like an edge.

:class:`PageFrame` records the three sizes; :func:`to_image_points` maps points found in
the detection input (pixel-edge coordinates: the pixel in column 3 spans x = 3 .. 4) back
to the original image's pixels, and :func:`to_frame_points` maps the other way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from PIL import Image

from edge_ocr_example.errors import OcrError, TensorMismatch

__all__ = [
    "DET_LIMIT",
    "DET_MULTIPLE",
    "PageFrame",
    "page_frame",
    "page_input",
    "to_frame_points",
    "to_image_points",
]

DET_LIMIT: Final = 960
"""Default limit of the detection input's longer side, in pixels."""
DET_MULTIPLE: Final = 32
"""The detection input's sides are padded to a multiple of this (the network's stride)."""
_WHITE: Final = np.float32(1.0)


@dataclass(frozen=True)
class PageFrame:
    """Where a page image sits inside its detection input."""

    image_height: int
    """The original image's height in pixels."""
    image_width: int
    """The original image's width in pixels."""
    height: int
    """The scaled page's height inside the detection input."""
    width: int
    """The scaled page's width inside the detection input."""
    padded_height: int
    """The detection input's height (a multiple of ``DET_MULTIPLE``)."""
    padded_width: int
    """The detection input's width (a multiple of ``DET_MULTIPLE``)."""

    @property
    def scale_x(self) -> float:
        """Detection-input pixels per image pixel, horizontally."""
        return self.width / self.image_width

    @property
    def scale_y(self) -> float:
        """Detection-input pixels per image pixel, vertically."""
        return self.height / self.image_height


def page_frame(
    image_height: int, image_width: int, *, limit: int = DET_LIMIT, multiple: int = DET_MULTIPLE
) -> PageFrame:
    """The frame of an ``image_height x image_width`` page with its longer side ``<= limit``.

    Raises:
        OcrError: the image is empty, or ``limit`` / ``multiple`` is not positive or
            ``limit`` is smaller than ``multiple``.

    """
    if image_height < 1 or image_width < 1:
        raise OcrError("image", "the image has no pixels", (image_height, image_width))
    if multiple < 1 or limit < multiple:
        raise OcrError("limit", f"must be at least the multiple {multiple}", limit)
    scale = min(1.0, limit / max(image_height, image_width))
    height = min(limit, max(1, round(image_height * scale)))
    width = min(limit, max(1, round(image_width * scale)))
    return PageFrame(
        image_height,
        image_width,
        height,
        width,
        math.ceil(height / multiple) * multiple,
        math.ceil(width / multiple) * multiple,
    )


def page_input(
    image: np.ndarray, *, limit: int = DET_LIMIT, multiple: int = DET_MULTIPLE
) -> tuple[np.ndarray, PageFrame]:
    """Return the ``1 x 3 x Hp x Wp`` float32 detection input of an RGB page and its frame.

    Raises:
        TensorMismatch: the image is not a non-empty ``H x W x 3`` uint8 array.

    """
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise TensorMismatch(
            "image", "expected a non-empty HxWx3 uint8 RGB array", (image.shape, str(image.dtype))
        )
    frame = page_frame(image.shape[0], image.shape[1], limit=limit, multiple=multiple)
    if (frame.height, frame.width) != image.shape[:2]:
        resized = Image.fromarray(image).resize(
            (frame.width, frame.height), Image.Resampling.BILINEAR
        )
        pixels = np.asarray(resized)
    else:
        pixels = image
    out = np.full((1, 3, frame.padded_height, frame.padded_width), _WHITE, dtype=np.float32)
    scaled = pixels.astype(np.float32) * np.float32(2.0 / 255.0) - np.float32(1.0)
    out[0, :, : frame.height, : frame.width] = scaled.transpose(2, 0, 1)
    return out, frame


def to_image_points(points: np.ndarray, frame: PageFrame) -> np.ndarray:
    """Map ``(..., 2)`` (x, y) points from detection-input pixels to the original image's.

    Points are clipped to the image (``0 .. width`` and ``0 .. height``).
    """
    out = np.asarray(points, dtype=np.float64).copy()
    out[..., 0] = np.clip(out[..., 0] / frame.scale_x, 0, frame.image_width)
    out[..., 1] = np.clip(out[..., 1] / frame.scale_y, 0, frame.image_height)
    return out.astype(np.float32)


def to_frame_points(points: np.ndarray, frame: PageFrame) -> np.ndarray:
    """Map ``(..., 2)`` (x, y) points from the original image to detection-input pixels."""
    out = np.asarray(points, dtype=np.float64).copy()
    out[..., 0] *= frame.scale_x
    out[..., 1] *= frame.scale_y
    return out.astype(np.float32)
