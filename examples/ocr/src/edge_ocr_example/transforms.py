"""The model-owned transforms between stages: detect -> classify -> recognise.

Each is a plain function ``transform(previous, source)`` where ``previous`` is the
previous stage's outputs (plus what the previous transform carried) and ``source`` is the
pipeline's original inputs (the detection input ``x``). Both return an
``edge_core.runtime.Fanout``: one call of the next stage per chunk of crops, each chunk at
one of the stage's buckets (:mod:`edge_ocr_example.chunks`), so every detected line is
classified and recognised, however many there are. Each chunk carries ``carry:index``
(the crop index of every row, ``-1`` for blank rows); the runtime gathers the outputs and
those indices into lists in chunk order. Carried once for the whole page:

* ``carry:boxes``    ``(N, 4, 2)`` float32, the boxes in reading order;
* ``carry:count``    ``(1,)`` int64, ``N``;
* ``carry:detected`` ``(1,)`` int64, how many boxes the detector found (``N`` as well);
* ``carry:angle`` / ``carry:angle_score`` (after classification) ``(N,)`` int64 0 or 180
  and float32, the classifier's direction decision per crop;
* ``carry:second`` (after classification) ``(M,)`` int64, the crops read both ways
  (:func:`edge_ocr_example.directions.line_direction`): crop ``N + j`` of the recogniser's
  calls is crop ``second[j]`` turned the other way, and
  :func:`edge_ocr_example.decode.decode` keeps the reading
  :func:`edge_ocr_example.directions.keep_second` picks.

Use :func:`split_carry` to separate graph inputs from carried tensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from edge_core.fanout import Fanout
from edge_ocr_example.boxes import extract_boxes
from edge_ocr_example.buckets import (
    CARRY_PREFIX,
    CLS_BATCHES,
    CLS_HEIGHT,
    CLS_INPUT,
    CLS_OUTPUT,
    CLS_WIDTH,
    DET_HEIGHT,
    DET_INPUT,
    DET_OUTPUT,
    DET_SHAPE,
    DET_WIDTH,
    FLOAT,
    REC_BATCHES,
    REC_HEIGHT,
    REC_INPUT,
    REC_WIDTHS,
)
from edge_ocr_example.chunks import chunk_crops, scatter
from edge_ocr_example.crops import crop_box, rotate_half_turn
from edge_ocr_example.directions import line_direction
from edge_ocr_example.errors import OcrError, TensorMismatch

__all__ = [
    "REC_CALL_BATCHES",
    "REC_CALL_BATCHES_ENV",
    "classify_to_recognize",
    "detect_to_classify",
    "rec_call_batches",
    "split_carry",
]

REC_CALL_BATCHES: Final = (1,)
"""The batch buckets recognition calls are cut into by default: one crop per call.

The recogniser's bundle serves batches of 1, 4 and 8 crops, but on the CPU this model
costs more per crop in a larger batch. Measured on the 2-vCPU development machine
(ONNX Runtime 1.32, ms per crop, widths 640 / 960): one intra-op thread 40.6 / 59.6 at
batch 1, 52.6 / 82.9 at 4, 61.9 / 98.7 at 8; default threads 30.6 / 40.9, 28.7 / 50.2,
38.2 / 55.8. One-crop calls also spread evenly over replicas. Where batching pays
(an accelerator, a wide machine), :data:`REC_CALL_BATCHES_ENV` picks other buckets."""

REC_CALL_BATCHES_ENV: Final = "EDGE_OCR_REC_BATCHES"
"""Environment variable naming the recognition call batches, e.g. ``1,4,8``."""


def rec_call_batches() -> tuple[int, ...]:
    """The recognition call batches: :data:`REC_CALL_BATCHES_ENV`, else the default.

    Raises:
        OcrError: the variable names a batch the recogniser's buckets do not serve.

    """
    raw = os.environ.get(REC_CALL_BATCHES_ENV)
    if not raw:
        return REC_CALL_BATCHES
    try:
        batches = tuple(sorted({int(part) for part in raw.split(",") if part.strip()}))
    except ValueError:
        raise OcrError(REC_CALL_BATCHES_ENV, "must list whole numbers", raw) from None
    if not batches or not set(batches) <= set(REC_BATCHES):
        raise OcrError(REC_CALL_BATCHES_ENV, f"must name batches among {REC_BATCHES}", raw)
    return batches


_INT: Final = np.dtype(np.int64)


def split_carry(mapping: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a transform's result into ``(graph inputs, carried tensors)``."""
    inputs = {k: v for k, v in mapping.items() if not k.startswith(CARRY_PREFIX)}
    carried = {k: v for k, v in mapping.items() if k.startswith(CARRY_PREFIX)}
    return inputs, carried


def _tensor(
    mapping: Mapping[str, Any],
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


def _count(mapping: Mapping[str, Any]) -> int:
    count = int(_tensor(mapping, CARRY_PREFIX + "count", (1,), _INT, "previous")[0])
    if count < 0:
        raise TensorMismatch("previous['carry:count']", "must be >= 0", count)
    return count


def _gathered(mapping: Mapping[str, Any], name: str) -> list[np.ndarray]:
    """A gathered fan-out output: the list of per-chunk arrays (empty when nothing ran)."""
    value = mapping.get(name, [])
    if not isinstance(value, list):
        raise TensorMismatch(f"previous[{name!r}]", "expected the list a fan-out gathers",
                             type(value).__name__)
    return value


def _fanout(chunks: list[tuple[np.ndarray, np.ndarray]], name: str,
            carry: Mapping[str, np.ndarray]) -> Fanout:
    return Fanout(items=[{name: batch, CARRY_PREFIX + "index": index}
                         for batch, index in chunks], carry=carry)


def detect_to_classify(
    previous: Mapping[str, Any], source: Mapping[str, np.ndarray]
) -> Fanout:
    """Detection outputs -> classifier calls: find boxes, crop every one, carry the boxes.

    Raises:
        TensorMismatch: a required tensor is missing or not at its bucket shape and dtype.

    """
    prob = _tensor(previous, DET_OUTPUT, (1, 1, DET_HEIGHT, DET_WIDTH), FLOAT, "previous")
    image = _source_image(source)
    boxes, _scores = extract_boxes(prob[0, 0])
    crops = [crop_box(image, box) for box in boxes]
    chunks = chunk_crops(crops, height=CLS_HEIGHT, widths=(CLS_WIDTH,), batches=CLS_BATCHES)
    count = np.array([len(boxes)], dtype=_INT)
    return _fanout(chunks, CLS_INPUT, {
        CARRY_PREFIX + "boxes": np.asarray(boxes, dtype=FLOAT).reshape(len(boxes), 4, 2),
        CARRY_PREFIX + "count": count,
        CARRY_PREFIX + "detected": count.copy(),
    })


def classify_to_recognize(
    previous: Mapping[str, Any], source: Mapping[str, np.ndarray]
) -> Fanout:
    """Classifier outputs -> recogniser calls: turn upside-down crops, chunk them by width.

    Crops are cut again from the source at the carried boxes (cheaper to recompute than to
    carry), turned by 180 degrees where the classifier is sure (more than
    :data:`~edge_ocr_example.directions.ANGLE_THRESH`), and cut into chunks at the
    recogniser's width and batch buckets. A crop of small print the classifier may have
    misjudged (:func:`~edge_ocr_example.directions.line_direction`, the crop's height in
    detection-bucket pixels) is also sent turned the other way, after all the others
    (``carry:second``).

    Raises:
        TensorMismatch: a required tensor is missing or not at its bucket shape and dtype.

    """
    count = _count(previous)
    boxes = _tensor(previous, CARRY_PREFIX + "boxes", (count, 4, 2), FLOAT, "previous")
    detected = _tensor(previous, CARRY_PREFIX + "detected", (1,), _INT, "previous")
    probs = scatter(_gathered(previous, CLS_OUTPUT),
                    _gathered(previous, CARRY_PREFIX + "index"), count)
    image = _source_image(source)
    angle = np.zeros(count, dtype=_INT)
    angle_score = np.zeros(count, dtype=FLOAT)
    crops = []
    second: list[int] = []
    others = []
    for index in range(count):
        label = int(probs[index].argmax())
        angle_score[index] = probs[index][label]
        crop = crop_box(image, boxes[index])
        direction = line_direction(float(probs[index][1]), crop.shape[1])
        if direction.turn:
            angle[index] = 180
            crop = rotate_half_turn(crop)
        crops.append(crop)
        if direction.check:
            second.append(index)
            others.append(rotate_half_turn(crop))
    chunks = chunk_crops(crops + others, height=REC_HEIGHT, widths=REC_WIDTHS,
                         batches=rec_call_batches())
    return _fanout(chunks, REC_INPUT, {
        CARRY_PREFIX + "boxes": boxes.copy(),
        CARRY_PREFIX + "count": np.array([count], dtype=_INT),
        CARRY_PREFIX + "detected": detected.copy(),
        CARRY_PREFIX + "angle": angle,
        CARRY_PREFIX + "angle_score": angle_score,
        CARRY_PREFIX + "second": np.array(second, dtype=_INT),
    })
