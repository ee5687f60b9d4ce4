"""Detection at the page's own scale: how an image maps into the detection input and back.

PP-OCR's detector is fully convolutional: it reads a page at (almost) any size whose sides
are multiples of 32. A page is therefore not squeezed into one square; it is

1. scaled by one factor so that its longer side is at most ``limit`` pixels (960 by
   default), aspect ratio kept; a smaller page is enlarged towards the limit, at most
   :data:`MAX_ENLARGE` times (the detector's boxes of small print read at its own size
   are loose or missing, see :data:`MAX_ENLARGE`);
2. normalised to ``(v / 255 - 0.5) / 0.5``, the range all three PP-OCR graphs use;
3. padded at the right and bottom to the next multiple of 32 with white paper
   (normalised 1.0), so the padding looks like the page's margin, not like an edge.

A long, thin page (a line of text as wide as a screen, a till receipt) scaled so would
leave most of the ``limit x limit`` input unused and its text a few pixels high, below
what the detector finds. Such a page is *folded* instead: scaled by a larger factor (at
most :data:`FOLD_MAX_SCALE`), cut across its long side into :attr:`PageFrame.folds` bands
of ``band`` pixels that overlap by :data:`FOLD_OVERLAP`, and the bands laid side by side
across the input (a wide page's one under the other, a tall page's next to each other),
:data:`FOLD_GAP` pixels of white apart. A page is folded when that scales it at least
:data:`FOLD_GAIN` times as large as the plain scaling does. :func:`band_windows` says
where each band lies in the input and in the scaled page; text the cuts divide is joined
again by :mod:`edge_ocr_example.band_join`.

:class:`PageFrame` records the sizes and the fold; :func:`to_image_points` maps points
found in the scaled page (pixel-edge coordinates: the pixel in column 3 spans x = 3 .. 4)
back to the original image's pixels, and :func:`to_frame_points` maps the other way.
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
    "FOLD_GAIN",
    "FOLD_GAP",
    "FOLD_MAX_SCALE",
    "FOLD_OVERLAP",
    "MAX_ENLARGE",
    "BandWindow",
    "PageFrame",
    "band_windows",
    "page_frame",
    "page_input",
    "to_frame_points",
    "to_image_points",
]

DET_LIMIT: Final = 960
"""Default limit of the detection input's longer side, in pixels."""
DET_MULTIPLE: Final = 32
"""The detection input's sides are padded to a multiple of this (the network's stride)."""
FOLD_GAIN: Final = 1.5
"""A page is folded only when that scales it at least this many times as large."""
FOLD_GAP: Final = 32
"""White pixels between two bands of a folded page in the detection input."""
FOLD_OVERLAP: Final = 64
"""Pixels of the scaled page two neighbouring bands share, so that a word cut at one
band's end lies whole in the next (a few letters of the smallest text detected)."""
MAX_ENLARGE: Final = 4.0
"""The most a page smaller than the limit is enlarged for detection.

Small print read at its own size gives the detector a few pixels a line: its boxes come
out loose (far taller than the text in them, which the classifier then reads as upside
down and the recogniser misreads) or the line is missed. Enlarged, the boxes
fit the text; they are mapped back, and the lines are cut from the original image as
before. Chosen on generated pages of small print against RapidOCR, which enlarges a
page's shorter side to 736 px (benchmarks/RESULTS.md, "ocr_small_print")."""
FOLD_MAX_SCALE: Final = 2.0
"""The most a folded page is enlarged: folding for more scale lays more bands into the
input (a 900 x 40 line enlarged four times fills 960 x 736 instead of 960 x 192), and on
sparse strips of small print it read no better than twice
(benchmarks/RESULTS.md, "ocr_small_print")."""
_MAX_FOLDS: Final = 32
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
    folds: int = 1
    """Bands the scaled page is cut into (1: not folded)."""
    band: int = 0
    """A band's length along the page's long side, in scaled pixels (folded pages)."""
    step: int = 0
    """From one band's start to the next one's (``band - FOLD_OVERLAP``; the last band
    ends at the page's end)."""
    gap: int = 0
    """White pixels between neighbouring bands in the detection input."""

    def as_array(self) -> np.ndarray:
        """The frame as ten int64, in field order (what the pipeline carries)."""
        return np.array([self.image_height, self.image_width, self.height, self.width,
                         self.padded_height, self.padded_width, self.folds, self.band,
                         self.step, self.gap], dtype=np.int64)

    @property
    def scale_x(self) -> float:
        """Detection-input pixels per image pixel, horizontally."""
        return self.width / self.image_width

    @property
    def scale_y(self) -> float:
        """Detection-input pixels per image pixel, vertically."""
        return self.height / self.image_height


@dataclass(frozen=True)
class BandWindow:
    """Where one band of a page lies: in the detection input and in the scaled page."""

    row: int
    """The band's first row in the detection input."""
    column: int
    """The band's first column in the detection input."""
    height: int
    """The band's height in the detection input."""
    width: int
    """The band's width in the detection input."""
    x: int
    """The scaled page's column at the band's first column."""
    y: int
    """The scaled page's row at the band's first row."""


def _fold_scale(long: int, short: int, limit: int) -> float:
    """The largest scale (at most :data:`FOLD_MAX_SCALE`) of a ``long x short`` page folded
    into bands.

    ``k`` bands ``limit`` long, overlapping by ``FOLD_OVERLAP``, must cover the long side;
    ``k`` short sides and the gaps between them must fit in ``limit``.
    """
    best = 0.0
    for k in range(2, _MAX_FOLDS + 1):
        across = (limit - (k - 1) * FOLD_GAP) / (k * short)
        along = (k * limit - (k - 1) * FOLD_OVERLAP) / long
        best = max(best, min(FOLD_MAX_SCALE, across, along))
    return best


def page_frame(
    image_height: int, image_width: int, *, limit: int = DET_LIMIT, multiple: int = DET_MULTIPLE
) -> PageFrame:
    """The frame of an ``image_height x image_width`` page with its longer side ``<= limit``
    (a smaller page enlarged, at most ``MAX_ENLARGE`` times), or folded (see the module
    docstring) when that scales it ``FOLD_GAIN`` times as large.

    Raises:
        OcrError: the image is empty, or ``limit`` / ``multiple`` is not positive or
            ``limit`` is smaller than ``multiple``.

    """
    if image_height < 1 or image_width < 1:
        raise OcrError("image", "the image has no pixels", (image_height, image_width))
    if multiple < 1 or limit < multiple:
        raise OcrError("limit", f"must be at least the multiple {multiple}", limit)
    scale = min(MAX_ENLARGE, limit / max(image_height, image_width))
    long, short = max(image_height, image_width), min(image_height, image_width)
    fold_scale = _fold_scale(long, short, limit) if limit > FOLD_OVERLAP else 0.0
    if fold_scale >= FOLD_GAIN * scale:
        return _folded_frame(image_height, image_width, fold_scale, limit, multiple)
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


def _folded_frame(image_height: int, image_width: int, scale: float, limit: int,
                  multiple: int) -> PageFrame:
    """The frame of a page folded at ``scale`` (sizes rounded down, so that they fit)."""
    height = max(1, math.floor(image_height * scale))
    width = max(1, math.floor(image_width * scale))
    long, short = max(height, width), min(height, width)
    band = min(limit, long)
    step = band - FOLD_OVERLAP
    folds = 1 + math.ceil((long - band) / step)
    across = math.ceil((folds * short + (folds - 1) * FOLD_GAP) / multiple) * multiple
    along = math.ceil(band / multiple) * multiple
    wide = width >= height
    return PageFrame(image_height, image_width, height, width,
                     across if wide else along, along if wide else across,
                     folds, band, step, FOLD_GAP)


def band_windows(frame: PageFrame) -> list[BandWindow]:
    """Each band of the frame's detection input: where it lies there and in the page.

    An unfolded frame is one band: the scaled page at the input's top-left corner.
    """
    if frame.folds <= 1:
        return [BandWindow(0, 0, frame.height, frame.width, 0, 0)]
    wide = frame.width >= frame.height
    long = frame.width if wide else frame.height
    short = frame.height if wide else frame.width
    windows = []
    for k in range(frame.folds):
        start = min(k * frame.step, long - frame.band)
        offset = k * (short + frame.gap)
        if wide:
            windows.append(BandWindow(offset, 0, short, frame.band, start, 0))
        else:
            windows.append(BandWindow(0, offset, frame.band, short, 0, start))
    return windows


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
    page = scaled.transpose(2, 0, 1)
    for w in band_windows(frame):
        out[0, :, w.row : w.row + w.height, w.column : w.column + w.width] = (
            page[:, w.y : w.y + w.height, w.x : w.x + w.width])
    return out, frame


def to_image_points(points: np.ndarray, frame: PageFrame) -> np.ndarray:
    """Map ``(..., 2)`` (x, y) points from the scaled page's pixels to the original image's.

    An unfolded page's scaled pixels are the detection input's.

    Points are clipped to the image (``0 .. width`` and ``0 .. height``).
    """
    out = np.asarray(points, dtype=np.float64).copy()
    out[..., 0] = np.clip(out[..., 0] / frame.scale_x, 0, frame.image_width)
    out[..., 1] = np.clip(out[..., 1] / frame.scale_y, 0, frame.image_height)
    return out.astype(np.float32)


def to_frame_points(points: np.ndarray, frame: PageFrame) -> np.ndarray:
    """Map ``(..., 2)`` (x, y) points from the original image to the scaled page's pixels."""
    out = np.asarray(points, dtype=np.float64).copy()
    out[..., 0] *= frame.scale_x
    out[..., 1] *= frame.scale_y
    return out.astype(np.float32)
