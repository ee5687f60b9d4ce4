"""Cutting a page's crops into calls that fit a stage's buckets, and putting results back.

A page has 3 or 40 text lines; the classifier and the recogniser serve a few batch sizes
(and the recogniser a few widths). :func:`chunk_crops` groups the crops by the narrowest
width bucket that holds each one (a wider crop is squeezed to the widest), then cuts every
group into batches: the largest batch bucket while enough crops remain, then the smallest
bucket that holds the rest, filled up with blank (zero) crops. Each chunk carries the crop
index of every row (``-1`` for a blank one), so :func:`scatter` can put the rows of the
gathered outputs back in crop order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edge_ocr_example.buckets import FLOAT
from edge_ocr_example.crops import fit_crop
from edge_ocr_example.errors import TensorMismatch

__all__ = ["Chunk", "batch_plan", "chunk_crops", "natural_width", "scatter", "width_bucket"]

Chunk = tuple[np.ndarray, np.ndarray]
"""``(batch N x C x H x W float32, crop index per row int64, -1 for blank rows)``."""

_INDEX = np.dtype(np.int64)


def natural_width(crop: np.ndarray, height: int) -> int:
    """The width of ``crop`` (``C x h x w``) resized to ``height`` with its aspect kept."""
    return max(1, math.ceil(height * int(crop.shape[2]) / int(crop.shape[1])))


def width_bucket(width: int, widths: Sequence[int]) -> int:
    """The narrowest of ``widths`` that holds ``width``; the widest when none does."""
    for candidate in sorted(widths):
        if width <= candidate:
            return candidate
    return max(widths)


def batch_plan(count: int, batches: Sequence[int]) -> list[int]:
    """Batch buckets for ``count`` crops: the largest while it fills, then the smallest fit.

    ``batch_plan(37, (1, 4, 8, 16)) == [16, 16, 8]`` (3 blank rows in the last call).
    """
    ordered = sorted(batches)
    plan: list[int] = []
    remaining = count
    while remaining >= ordered[-1]:
        plan.append(ordered[-1])
        remaining -= ordered[-1]
    if remaining:
        plan.append(next(b for b in ordered if b >= remaining))
    return plan


def chunk_crops(crops: Sequence[np.ndarray], *, height: int, widths: Sequence[int],
                batches: Sequence[int]) -> list[Chunk]:
    """Fit every crop to its width bucket and cut the crops into batch buckets.

    Chunks come narrowest width first, crops in their original order within a width.
    """
    groups: dict[int, list[int]] = {}
    for index, crop in enumerate(crops):
        if crop.ndim != 3:
            raise TensorMismatch(f"crops[{index}]", "expected a C x h x w crop", crop.shape)
        groups.setdefault(width_bucket(natural_width(crop, height), widths), []).append(index)
    chunks: list[Chunk] = []
    for width in sorted(groups):
        members = groups[width]
        start = 0
        for size in batch_plan(len(members), batches):
            rows = members[start:start + size]
            start += len(rows)
            channels = crops[rows[0]].shape[0]
            batch = np.zeros((size, channels, height, width), dtype=FLOAT)
            order = np.full(size, -1, dtype=_INDEX)
            for row, crop_index in enumerate(rows):
                batch[row] = fit_crop(crops[crop_index], height, width)
                order[row] = crop_index
            chunks.append((batch, order))
    return chunks


def scatter(outputs: Sequence[np.ndarray], indices: Sequence[np.ndarray],
            count: int) -> list[np.ndarray]:
    """Rows of the gathered outputs, put back in crop order (blank rows dropped).

    Raises:
        TensorMismatch: the lists differ in length, a chunk's rows differ from its index,
            or a crop is missing or appears twice.
    """
    if len(outputs) != len(indices):
        raise TensorMismatch("outputs", f"one index per chunk ({len(indices)})", len(outputs))
    found: list[np.ndarray | None] = [None] * count
    for chunk, (rows, index) in enumerate(zip(outputs, indices, strict=True)):
        if rows.shape[0] != index.shape[0]:
            raise TensorMismatch(f"outputs[{chunk}]", f"{index.shape[0]} rows", rows.shape)
        for row, crop in enumerate(index.tolist()):
            if crop < 0:
                continue
            if crop >= count or found[crop] is not None:
                raise TensorMismatch(f"index[{chunk}][{row}]", f"each crop once, < {count}",
                                     crop)
            found[crop] = rows[row]
    missing = [i for i, row in enumerate(found) if row is None]
    if missing:
        raise TensorMismatch("index", "every crop needs its row", missing)
    return [row for row in found if row is not None]
