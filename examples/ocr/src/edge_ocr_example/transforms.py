"""The model-owned transforms between stages: detect -> classify -> recognise.

Each is a plain function ``transform(previous, source) -> dict`` where ``previous`` is the
previous stage's outputs (plus what the previous transform carried) and ``source`` is the
pipeline's original inputs (the detection input ``x``). The result holds the next stage's
graph inputs exactly at its bucket, plus carried tensors under ``CARRY_PREFIX``:

* ``carry:boxes``    ``(CROP_BATCH, 4, 2)`` float32, valid rows first, zeros after;
* ``carry:count``    ``(1,)`` int64, how many rows are valid;
* ``carry:detected`` ``(1,)`` int64, how many boxes the detector found (``count`` is this
  capped at ``CROP_BATCH``);
* ``carry:angle`` / ``carry:angle_score`` (after classification) ``(CROP_BATCH,)`` int64
  0 or 180 and float32, the direction decision per crop.

Use :func:`split_carry` to separate graph inputs from carried tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np

from edge_ocr_example.boxes import extract_boxes
from edge_ocr_example.buckets import (
    CARRY_PREFIX,
    CLS_HEIGHT,
    CLS_INPUT,
    CLS_OUTPUT,
    CLS_SHAPE,
    CLS_WIDTH,
    CROP_BATCH,
    DET_HEIGHT,
    DET_INPUT,
    DET_OUTPUT,
    DET_SHAPE,
    DET_WIDTH,
    FLOAT,
    REC_HEIGHT,
    REC_INPUT,
    REC_SHAPE,
    REC_WIDTH,
)
from edge_ocr_example.crops import crop_box, fit_crop, rotate_half_turn
from edge_ocr_example.errors import TensorMismatch

__all__ = [
    "ANGLE_THRESH",
    "classify_to_recognize",
    "detect_to_classify",
    "split_carry",
]

ANGLE_THRESH: Final = 0.9
"""A crop is turned by 180 degrees only when the classifier says so with this confidence."""

_INT: Final = np.dtype(np.int64)


def split_carry(
    mapping: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Split a transform's result into ``(graph inputs, carried tensors)``."""
    inputs = {k: v for k, v in mapping.items() if not k.startswith(CARRY_PREFIX)}
    carried = {k: v for k, v in mapping.items() if k.startswith(CARRY_PREFIX)}
    return inputs, carried


def _tensor(
    mapping: Mapping[str, np.ndarray],
    name: str,
    shape: tuple[int, ...],
    dtype: np.dtype[np.generic],
    where: str,
) -> np.ndarray:
    """Fetch ``mapping[name]`` and check its shape and dtype exactly."""
    if name not in mapping:
        raise TensorMismatch(f"{where}[{name!r}]", "tensor missing", sorted(mapping))
    value = np.asarray(mapping[name])
    if value.shape != shape or value.dtype != dtype:
        raise TensorMismatch(
            f"{where}[{name!r}]",
            f"expected {dtype}{list(shape)}",
            f"{value.dtype}{list(value.shape)}",
        )
    return value


def _source_image(source: Mapping[str, np.ndarray]) -> np.ndarray:
    image: np.ndarray = _tensor(source, DET_INPUT, DET_SHAPE, FLOAT, "source")[0]
    return image


def _count(mapping: Mapping[str, np.ndarray]) -> int:
    count = int(_tensor(mapping, CARRY_PREFIX + "count", (1,), _INT, "previous")[0])
    if not 0 <= count <= CROP_BATCH:
        raise TensorMismatch("previous['carry:count']", f"must be in 0..{CROP_BATCH}", count)
    return count


def detect_to_classify(
    previous: Mapping[str, np.ndarray], source: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Detection outputs -> classifier inputs: find boxes, crop them at 48x192, carry boxes.

    Raises:
        TensorMismatch: a required tensor is missing or not at its bucket shape and dtype.

    """
    prob = _tensor(previous, DET_OUTPUT, (1, 1, DET_HEIGHT, DET_WIDTH), FLOAT, "previous")
    image = _source_image(source)
    boxes, _scores = extract_boxes(prob[0, 0])
    count = min(len(boxes), CROP_BATCH)
    batch = np.zeros(CLS_SHAPE, dtype=FLOAT)
    carried_boxes = np.zeros((CROP_BATCH, 4, 2), dtype=FLOAT)
    for index in range(count):
        batch[index] = fit_crop(crop_box(image, boxes[index]), CLS_HEIGHT, CLS_WIDTH)
        carried_boxes[index] = boxes[index]
    return {
        CLS_INPUT: batch,
        CARRY_PREFIX + "boxes": carried_boxes,
        CARRY_PREFIX + "count": np.array([count], dtype=_INT),
        CARRY_PREFIX + "detected": np.array([len(boxes)], dtype=_INT),
    }


def classify_to_recognize(
    previous: Mapping[str, np.ndarray], source: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Classifier outputs -> recogniser inputs: turn upside-down crops, crop at 48x640.

    Crops are cut again from the source at the carried boxes (cheaper to recompute than to
    carry), turned by 180 degrees where the classifier is at least ``ANGLE_THRESH`` sure,
    and fitted to the recogniser's bucket.

    Raises:
        TensorMismatch: a required tensor is missing or not at its bucket shape and dtype.

    """
    probs = _tensor(previous, CLS_OUTPUT, (CROP_BATCH, 2), FLOAT, "previous")
    boxes = _tensor(previous, CARRY_PREFIX + "boxes", (CROP_BATCH, 4, 2), FLOAT, "previous")
    detected = _tensor(previous, CARRY_PREFIX + "detected", (1,), _INT, "previous")
    count = _count(previous)
    image = _source_image(source)
    batch = np.zeros(REC_SHAPE, dtype=FLOAT)
    angle = np.zeros(CROP_BATCH, dtype=_INT)
    angle_score = np.zeros(CROP_BATCH, dtype=FLOAT)
    for index in range(count):
        label = int(probs[index].argmax())
        angle_score[index] = probs[index, label]
        crop = crop_box(image, boxes[index])
        if label == 1 and angle_score[index] > ANGLE_THRESH:
            angle[index] = 180
            crop = rotate_half_turn(crop)
        batch[index] = fit_crop(crop, REC_HEIGHT, REC_WIDTH)
    return {
        REC_INPUT: batch,
        CARRY_PREFIX + "boxes": boxes.copy(),
        CARRY_PREFIX + "count": np.array([count], dtype=_INT),
        CARRY_PREFIX + "detected": detected.copy(),
        CARRY_PREFIX + "angle": angle,
        CARRY_PREFIX + "angle_score": angle_score,
    }
