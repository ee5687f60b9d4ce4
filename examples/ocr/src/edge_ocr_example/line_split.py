"""Long text lines: split where the recogniser's widest input ends, re-joined in order.

The recogniser reads a line crop resized to 48 pixels high; a line whose resized width
exceeds the widest recognition input (``max_width``, at least 1280 px) would have to be
squeezed, and squeezed glyphs are misread. Such a line is cut into pieces that each fit:

* each cut lies in the last 40 % of the room left, in the widest column gap without ink
  there (the middle of a space between words, when there is one), else in the column with
  the least ink (between two letters);
* a cut through a gap at least :data:`SPACE_GAP` times the crop's height wide was a word
  space: the texts read from the two pieces are joined with one space; otherwise they are
  joined directly.

Ink is what differs from the crop's paper (its median grey) by more than a quarter of the
crop's contrast, so light text on dark paper is found as well as dark on light.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np

from edge_ocr_example.errors import OcrError, TensorMismatch

__all__ = ["REC_MAX_WIDTH", "SPACE_GAP", "LinePiece", "ink_columns", "join_pieces", "split_line"]

REC_MAX_WIDTH: Final = 1280
"""The widest recognition input, in pixels at height 48; wider lines are split."""
SPACE_GAP: Final = 0.2
"""A gap at least this many crop heights wide is a word space."""
_SEARCH: Final = 0.4


class LinePiece(NamedTuple):
    """Columns ``x0 .. x1 - 1`` of a line crop, and whether a space precedes the piece."""

    x0: int
    x1: int
    space_before: bool


def ink_columns(crop: np.ndarray) -> np.ndarray:
    """How many ink pixels each column of an ``h x w x 3`` (or ``h x w``) crop holds."""
    gray = crop.astype(np.float32).mean(axis=2) if crop.ndim == 3 else crop.astype(np.float32)
    paper = float(np.median(gray))
    low, high = np.percentile(gray, [2, 98])
    contrast = max(float(high - low), 1.0)
    ink = np.abs(gray - paper) > max(16.0, contrast / 4)
    counts: np.ndarray = ink.sum(axis=0)
    return counts


def _gap_at(ink: np.ndarray, x: int) -> tuple[int, int]:
    """The run of zero-ink columns containing column ``x`` (``(x, x)`` when it has ink)."""
    if ink[x] > 0:
        return x, x
    left = x
    while left > 0 and ink[left - 1] == 0:
        left -= 1
    right = x
    while right + 1 < len(ink) and ink[right + 1] == 0:
        right += 1
    return left, right + 1


def split_line(
    crop: np.ndarray, *, height: int = 48, max_width: int = REC_MAX_WIDTH
) -> list[LinePiece]:
    """Cut a line crop into pieces whose width at ``height`` pixels is at most ``max_width``.

    Raises:
        TensorMismatch: the crop is empty.
        OcrError: ``height`` or ``max_width`` is not positive.

    """
    if crop.ndim < 2 or 0 in crop.shape[:2]:
        raise TensorMismatch("crop", "expected a non-empty h x w (x 3) crop", crop.shape)
    if height < 1 or max_width < 1:
        raise OcrError("max_width", "height and width must be positive", (height, max_width))
    rows, cols = crop.shape[:2]
    room = max(1, math.floor(max_width * rows / height))  # crop columns per piece
    if cols <= room:
        return [LinePiece(0, cols, False)]
    ink = ink_columns(crop)
    pieces: list[LinePiece] = []
    start, space = 0, False
    while cols - start > room:
        lo = start + max(1, math.floor(room * (1 - _SEARCH)))
        hi = start + room  # a cut at column c ends the piece at c (exclusive)
        window = ink[lo:hi]
        empty = np.flatnonzero(window == 0)
        if len(empty):
            # the widest gap: group consecutive empty columns, take the longest group's middle
            breaks = np.flatnonzero(np.diff(empty) > 1) + 1
            groups = np.split(empty, breaks)
            best = max(groups, key=len)
            cut = lo + int(best[len(best) // 2])
        else:
            cut = lo + len(window) - 1 - int(np.argmin(window[::-1]))  # the rightmost least
        gap_left, gap_right = _gap_at(ink, cut)
        pieces.append(LinePiece(start, cut, space))
        space = gap_right - gap_left >= SPACE_GAP * rows
        start = cut
    pieces.append(LinePiece(start, cols, space))
    return pieces


def join_pieces(texts: Sequence[str], pieces: Sequence[LinePiece]) -> str:
    """Join the texts read from a line's pieces, with a space where a piece follows a space.

    Raises:
        OcrError: the two sequences differ in length.

    """
    if len(texts) != len(pieces):
        raise OcrError("texts", f"expected one text per piece ({len(pieces)})", len(texts))
    out = ""
    for text, piece in zip(texts, pieces, strict=True):
        part = text.strip() if len(pieces) > 1 else text
        if not part:
            continue
        out = f"{out} {part}" if out and piece.space_before else out + part
    return out
