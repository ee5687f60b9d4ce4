"""Recogniser probabilities -> text: the character table, greedy CTC decoding, final results.

The PP-OCRv4 recogniser emits, for each of ``T`` time steps, probabilities over
``1 + len(dictionary) + 1`` classes: index 0 is the CTC *blank*, then the dictionary's
characters in order, then the space. Greedy decoding takes the best class per step,
collapses repeats, drops blanks, and scores a line by the mean probability of the steps
it kept. The dictionary ships inside the recogniser's ONNX metadata (key ``character``);
the bundle builder writes it next to the graph as ``characters.txt`` (UTF-8, one per line).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import numpy as np

from edge_ocr_example.buckets import (
    CARRY_PREFIX,
    FLOAT,
    REC_BEST,
    REC_CONFIDENCE,
    REC_OUTPUT,
)
from edge_ocr_example.chunks import scatter
from edge_ocr_example.directions import keep_second
from edge_ocr_example.errors import OcrError, TensorMismatch

__all__ = [
    "CHARACTERS_FILE",
    "MIN_TEXT_SCORE",
    "TextLine",
    "bundle_characters",
    "character_table",
    "ctc_best_decode",
    "ctc_greedy_decode",
    "decode",
    "load_characters",
    "recogniser_decode",
]

CHARACTERS_FILE: Final = "characters.txt"
"""Name of the dictionary file in the recogniser's bundle."""
MIN_TEXT_SCORE: Final = 0.5
"""Recognised lines scoring below this are dropped by :func:`decode`."""


class TextLine(NamedTuple):
    """One recognised line: its text, its score in [0, 1] and its 4x2 box (bucket pixels)."""

    text: str
    score: float
    box: np.ndarray


def character_table(dictionary: Sequence[str]) -> tuple[str, ...]:
    """Class index -> character: blank (``""``) first, then ``dictionary``, then a space.

    Raises:
        OcrError: the dictionary is empty or an entry is not exactly one character.

    """
    if not dictionary:
        raise OcrError("dictionary", "the character dictionary is empty", list(dictionary))
    for index, entry in enumerate(dictionary):
        if len(entry) != 1:
            raise OcrError(f"dictionary[{index}]", "each entry must be one character", entry)
    return ("", *dictionary, " ")


def load_characters(path: Path) -> tuple[str, ...]:
    """Read a ``characters.txt`` dictionary and return its :func:`character_table`."""
    return _table_of(path.read_bytes())


def bundle_characters(bundles: Mapping[str, Path | None],
                      stage_id: str = "recognize") -> tuple[str, ...]:
    """The :func:`character_table` of the ``characters.txt`` in ``stage_id``'s bundle.

    ``bundles`` as a pipeline gives them (``edge_core.runtime.bundle_folders.BundleFolders``):
    read through its ``read``, the bytes the stage verified (one read and one sha256 of
    the file per call; ``BundleChanged`` when the bundle was rewritten in place). Any
    other mapping of folders (a caller's own): the folder's file as it is.

    Raises:
        OcrError: the stage has no bundle.
    """
    directory = bundles.get(stage_id)
    if directory is None:
        raise OcrError(f"bundles.{stage_id}", f"the {stage_id} stage has no bundle", None)
    read = getattr(bundles, "read", None)
    if callable(read):
        return _table_of(bytes(read(stage_id, CHARACTERS_FILE)))
    return load_characters(Path(directory) / CHARACTERS_FILE)


@functools.lru_cache(maxsize=4)
def _table_of(data: bytes) -> tuple[str, ...]:
    """The table of a dictionary's bytes (UTF-8, no newline translation), kept by bytes."""
    return character_table(data.decode("utf-8").split("\n"))


def ctc_greedy_decode(
    probabilities: np.ndarray, characters: Sequence[str]
) -> list[tuple[str, float]]:
    """Decode ``N x T x C`` probabilities to ``(text, score)`` per row, greedily.

    The score is the mean best-class probability over the steps that produced a character
    (0.0 for an empty line).

    Raises:
        TensorMismatch: the array is not 3-D or ``C`` differs from the table's length.

    """
    if probabilities.ndim != 3 or probabilities.shape[2] != len(characters):
        raise TensorMismatch(
            "probabilities",
            f"expected N x T x {len(characters)}",
            probabilities.shape,
        )
    return ctc_best_decode(probabilities.argmax(axis=2), probabilities.max(axis=2), characters)


def ctc_best_decode(
    best: np.ndarray, confidence: np.ndarray, characters: Sequence[str]
) -> list[tuple[str, float]]:
    """Decode ``N x T`` best classes and their probabilities to ``(text, score)`` per row.

    What :func:`ctc_greedy_decode` does after its reductions (the recogniser's CTC head,
    :mod:`edge_ocr_example.ctc_head`, does them in the graph): repeats collapsed, blanks
    dropped, the score the mean probability of the steps kept (0.0 for an empty line).

    Raises:
        TensorMismatch: the arrays are not ``N x T`` alike, or a class is outside the table.

    """
    if best.ndim != 2 or confidence.shape != best.shape:
        raise TensorMismatch("best", "expected N x T classes and N x T probabilities",
                             (best.shape, confidence.shape))
    if best.size and not 0 <= int(best.min()) <= int(best.max()) < len(characters):
        raise TensorMismatch("best", f"expected classes in [0, {len(characters)})",
                             (int(best.min()), int(best.max())))
    results: list[tuple[str, float]] = []
    for row, conf in zip(best, confidence, strict=True):
        keep = np.ones(row.shape, dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != 0
        text = "".join(characters[index] for index in row[keep].tolist())
        score = float(conf[keep].mean(dtype=np.float64)) if keep.any() else 0.0
        results.append((text, score))
    return results


def recogniser_decode(
    outputs: Mapping[str, Any], characters: Sequence[str]
) -> list[tuple[str, float]]:
    """``(text, score)`` per row of one recogniser call's outputs.

    From its CTC head's best classes and probabilities (:data:`REC_BEST`,
    :data:`REC_CONFIDENCE`) when it has them, else from its probabilities
    (:data:`REC_OUTPUT`, a graph without the head): the same texts and scores.

    Raises:
        TensorMismatch: neither is there, or they are malformed.

    """
    if REC_BEST in outputs:
        if REC_CONFIDENCE not in outputs:
            raise TensorMismatch(REC_CONFIDENCE, "missing beside the best classes",
                                 sorted(outputs))
        return ctc_best_decode(np.asarray(outputs[REC_BEST]),
                               np.asarray(outputs[REC_CONFIDENCE]), characters)
    if REC_OUTPUT not in outputs:
        raise TensorMismatch(REC_OUTPUT, "recogniser output missing", sorted(outputs))
    return ctc_greedy_decode(np.asarray(outputs[REC_OUTPUT]), characters)


def _carried(previous: Mapping[str, Any], name: str) -> np.ndarray:
    key = CARRY_PREFIX + name
    if key not in previous:
        raise TensorMismatch(key, "carried tensor missing", sorted(previous))
    return np.asarray(previous[key])


def _rows(previous: Mapping[str, Any], count: int) -> list[np.ndarray]:
    """The recogniser's ``T x C`` rows in crop order: gathered chunks, or one batch."""
    if count == 0:
        return []
    if REC_OUTPUT not in previous:
        raise TensorMismatch(REC_OUTPUT, "recogniser output missing", sorted(previous))
    output = previous[REC_OUTPUT]
    if isinstance(output, list):  # one array per chunk of a fan-out
        index = previous.get(CARRY_PREFIX + "index")
        if not isinstance(index, list):
            raise TensorMismatch(CARRY_PREFIX + "index", "the chunks' crop indices are missing",
                                 sorted(previous))
        return scatter(output, index, count)
    return list(output[:count])


def decode(
    previous: Mapping[str, Any],
    source: Mapping[str, np.ndarray],
    *,
    characters: Sequence[str],
    min_score: float = MIN_TEXT_SCORE,
) -> list[TextLine]:
    """Turn the recogniser's outputs (plus carried boxes) into recognised lines.

    ``previous`` holds the recogniser output — a list of per-chunk arrays gathered from a
    fan-out with their ``carry:index`` lists, or one batch — and the tensors carried by
    :func:`edge_ocr_example.transforms.classify_to_recognize`; ``source`` is unused and
    accepted so the final step has the same shape as a transform. A crop read both ways
    (``carry:second``, its second reading after the ``count`` first ones) keeps the reading
    :func:`~edge_ocr_example.directions.keep_second` picks. Blank padding rows are
    skipped; lines scoring below ``min_score`` or with no visible text are dropped. Boxes
    are in detection-bucket pixels (see :func:`edge_ocr_example.preprocess.to_image_coordinates`).

    Raises:
        TensorMismatch: a carried tensor or the recogniser's output is missing, or
            ``carry:second`` names a crop outside ``count`` or one crop twice.

    """
    del source
    count = int(_carried(previous, "count")[0])
    boxes = _carried(previous, "boxes")
    second = np.asarray(previous.get(CARRY_PREFIX + "second", np.zeros(0, np.int64)))
    if second.ndim != 1 or (second.size and (
            not np.issubdtype(second.dtype, np.integer) or int(second.min()) < 0
            or int(second.max()) >= count or len(set(second.tolist())) != second.size)):
        raise TensorMismatch(CARRY_PREFIX + "second", f"distinct crop indices below {count}",
                             second.tolist())
    readings = [ctc_greedy_decode(row[None], characters)[0]
                for row in _rows(previous, count + second.size)]
    for extra, crop in enumerate(second.tolist()):
        first, other = readings[crop], readings[count + extra]
        if keep_second((first[1], max(1, len(first[0].strip()))),
                       (other[1], max(1, len(other[0].strip())))):
            readings[crop] = other
    lines: list[TextLine] = []
    for (text, score), box in zip(readings[:count], boxes[:count], strict=True):
        if score >= min_score and text.strip():
            lines.append(TextLine(text, score, np.asarray(box, dtype=FLOAT)))
    return lines
