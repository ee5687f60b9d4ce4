"""The page pipeline for the edge runtime: its ends and transforms, around the page reader.

``pipeline.toml`` (written by :mod:`edge_ocr_example.page_bundle`) names them:

* :data:`prepare` reads an image file (:func:`~edge_ocr_example.images.read_image`) and
  returns the detection input at the page's own scale (``x``: ``1 x 3 x Hp x Wp``, the
  longer side at most ``limit``, padded to a multiple of 32, a long, thin page folded
  into bands, :mod:`~edge_ocr_example.page_scale`; the detect stage's shape set serves
  that range) plus, under ``carry:``, the original image and its frame, which the
  runtime keeps from the detect stage and hands to every transform as ``source``;
* :func:`detect_to_classify` finds the lines (rotated boxes in image pixels, crops cut
  from the original image) and fans the classifier out over them, up to
  :data:`BATCH` rows per call; the crops are carried on, so that each line is cut once;
* :func:`classify_to_recognize` turns upside-down lines (a line of small print the
  classifier may have misjudged is read both ways,
  :func:`~edge_ocr_example.directions.line_direction`), splits long ones and fans the
  recogniser out over the pieces, grouped by recognition width, up to :data:`REC_BATCH`
  rows per call (one row per call: each padded to its own width plus 15 %, a multiple of
  32, :func:`~edge_ocr_example.page_reader.own_width`; several: to 320, 640, 960 or 1280,
  so that similar pieces share a call). ``EDGE_OCR_REC_BATCH`` changes the rows per
  call: the recogniser's bundle must serve that many rows,
  ``python -m edge_ocr_example.page_bundle --rec-batch N``, or the stage refuses the
  larger call by name;
* :func:`finish` decodes every piece, re-joins the lines (a line read both ways as the
  recogniser is surer of) and returns them in reading order: ``[{"text", "score",
  "box"}]`` with the box's four corners in image pixels.

The detection limit is 960 by default; ``EDGE_OCR_DET_LIMIT`` changes it for
:data:`prepare` (the bundles must then be built with the same ``--det-limit``, or the
detect stage refuses the larger input by name).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from edge_core.runtime import Fanout
from edge_ocr_example.buckets import (
    CLS_INPUT,
    CLS_OUTPUT,
    DET_INPUT,
    DET_OUTPUT,
    REC_BEST,
    REC_CONFIDENCE,
    REC_INPUT,
    REC_OUTPUT,
)
from edge_ocr_example.decode import bundle_characters, recogniser_decode
from edge_ocr_example.errors import OcrError, TensorMismatch
from edge_ocr_example.images import IMAGE_SUFFIXES, read_image
from edge_ocr_example.line_split import LinePiece
from edge_ocr_example.page_reader import (
    REC_WIDTHS,
    Line,
    apply_directions,
    assemble,
    classifier_rows,
    cut_lines,
    find_lines,
    recognition_rows,
)
from edge_ocr_example.page_scale import DET_LIMIT, PageFrame, page_input

__all__ = [
    "BATCH",
    "IMAGE",
    "REC_BATCH",
    "REC_BATCH_ENV",
    "PagePrepare",
    "classify_to_recognize",
    "detect_to_classify",
    "detect_to_classify_padded",
    "finish",
    "prepare",
    "rec_batch",
]

BATCH: Final = 4
"""Most rows in one classifier call (the top of its batch range)."""
REC_BATCH: Final = 1
"""Most rows in one recogniser call by default (the top of the recogniser's batch range
as :mod:`edge_ocr_example.page_bundle` builds it). Chosen by measurement on the 2-vCPU
machine, ``benchmarks/ocr_throughput.py --sweep`` (docs/config.md, "Choosing admission,
replicas, threads and the recogniser batch"): on this CPU a row costs more in a larger
batch (the pieces of a width are padded alike, and the model's cost per row grows with
the batch), and single rows spread evenly over the recogniser's replicas."""
REC_BATCH_ENV: Final = "EDGE_OCR_REC_BATCH"
"""The environment variable that sets the recogniser's rows per call."""
IMAGE: Final = "carry:image"
"""The original page, ``H x W x 3`` uint8, carried past the detect stage."""
FRAME: Final = "carry:frame"
"""The page's :class:`PageFrame` as ten int64 (:meth:`PageFrame.as_array`): image h, w,
scaled h, w, padded h, w, folds, band, step, gap."""
_QUADS: Final = "carry:quads"
_SCORES: Final = "carry:det_scores"
_TURNS: Final = "carry:turns"
_OWNERS: Final = "carry:owners"
_PIECES: Final = "carry:pieces"
"""Per recogniser row, int64: line, x0, x1, space before, and 1 for a piece of the line
turned by 180 degrees (the second reading of a checked line; a 4-column array has none)."""
_CROPS: Final = "carry:crops"
"""The lines' upright crops (a tuple of ``h x w x 3`` uint8), cut once by
:func:`detect_to_classify` (perspective crops are most of the transforms' CPU time)."""
_CLS_ROWS: Final = "carry:cls_rows"
"""Real classifier rows when the calls were padded (:func:`detect_to_classify_padded`)."""
_INT: Final = np.int64


class PagePrepare:
    """The pipeline's ``prepare``: an image file -> detection input, image and frame."""

    input_suffixes: Final = IMAGE_SUFFIXES
    """File suffixes ``edge run --input DIR`` reads from a directory."""

    def __init__(self, limit: int | None = None) -> None:
        """Limit the detection input's longer side to ``limit`` (else the environment's
        ``EDGE_OCR_DET_LIMIT``, else 960).

        Raises:
            OcrError: the limit is not a whole number of at least 32.

        """
        raw: object = limit if limit is not None else os.environ.get("EDGE_OCR_DET_LIMIT")
        try:
            self.limit = DET_LIMIT if raw is None else int(str(raw))
        except ValueError:
            raise OcrError("EDGE_OCR_DET_LIMIT", "must be a whole number", raw) from None
        if self.limit < 32:
            raise OcrError("limit", "must be at least 32", self.limit)

    def __call__(self, source: str) -> dict[str, np.ndarray]:
        """Read the image at ``source``.

        Raises:
            ImageInputError: the file is missing, empty, not an image, truncated or too
                large.

        """
        image = read_image(source)
        detection, frame = page_input(image, limit=self.limit)
        return {
            DET_INPUT: detection,
            IMAGE: image,
            FRAME: frame.as_array(),
        }


prepare: Final = PagePrepare()
"""The instance ``pipeline.toml`` names as ``prepare``."""


def _source(source: Mapping[str, Any]) -> tuple[np.ndarray, PageFrame]:
    """The original image and its frame; without them, the detection input stands in.

    A request fed only the detection input (the detect bundle's example, say) has no
    carried image: the page is then the detection input itself, turned back into pixels,
    and boxes are in its pixels.
    """
    if IMAGE not in source or FRAME not in source:
        det = np.asarray(source.get(DET_INPUT))
        if det.ndim != 4 or det.shape[:2] != (1, 3):
            raise TensorMismatch(f"source[{IMAGE!r}]", "missing, and no 1x3xHxW detection "
                                 "input to stand in for it", sorted(source))
        pixels = np.clip((det[0].transpose(1, 2, 0) + 1.0) * 127.5, 0, 255)
        image = np.ascontiguousarray(pixels.round().astype(np.uint8))
        height, width = image.shape[:2]
        return image, PageFrame(height, width, height, width, height, width)
    image = np.asarray(source[IMAGE])
    frame = np.asarray(source[FRAME])
    if image.dtype != np.uint8 or image.ndim != 3 or frame.shape != (10,):
        raise TensorMismatch(IMAGE, "expected an HxWx3 uint8 image and a (10,) frame",
                             (image.shape, frame.shape))
    return image, PageFrame(*(int(v) for v in frame))


def _chunks(name: str, rows: np.ndarray) -> list[dict[str, np.ndarray]]:
    """One item per ``BATCH`` rows."""
    return [{name: np.ascontiguousarray(rows[i : i + BATCH])} for i in range(0, len(rows), BATCH)]


def _stacked(previous: Mapping[str, Any], name: str, empty: tuple[int, ...]) -> np.ndarray:
    """A fanned-out output gathered into one array (rows in item order)."""
    parts = previous.get(name, [])
    if isinstance(parts, np.ndarray):
        parts = [parts]
    arrays = [np.asarray(p) for p in parts]
    return np.concatenate(arrays) if arrays else np.zeros(empty, dtype=np.float32)


def detect_to_classify(previous: Mapping[str, Any], source: Mapping[str, Any]) -> Fanout:
    """Detection map -> classifier calls: lines found, their windows in chunks.

    Raises:
        TensorMismatch: the detection output or the carried image is missing or malformed.

    """
    image, frame = _source(source)
    prob = np.asarray(previous.get(DET_OUTPUT))
    if prob.ndim != 4 or prob.shape[:2] != (1, 1):
        raise TensorMismatch(f"previous[{DET_OUTPUT!r}]", "expected a 1x1xHxW map", prob.shape)
    lines = find_lines(prob[0, 0], frame, image)
    rows, owners = classifier_rows(lines)
    carry = {
        _QUADS: np.stack([line.quad for line in lines]) if lines
        else np.zeros((0, 4, 2), np.float32),
        _SCORES: np.array([line.score for line in lines], dtype=np.float32),
        _TURNS: np.array([line.turns for line in lines], dtype=_INT),
        _OWNERS: owners,
        _CROPS: tuple(line.crop for line in lines),
    }
    return Fanout(items=_chunks(CLS_INPUT, rows), carry=carry)


def detect_to_classify_padded(previous: Mapping[str, Any],
                              source: Mapping[str, Any]) -> Fanout:
    """As :func:`detect_to_classify`, every call exactly ``BATCH`` rows.

    The last chunk is padded by repeating its last row; the number of real rows is
    carried (``carry:cls_rows``) and :func:`classify_to_recognize` drops the padding's
    outputs. For a classifier served by one static ``BATCH``-row bucket
    (``pipeline-auto.toml``: the ``qnn`` candidate's derived bundle); a candidate serving
    ``[1..BATCH]`` rows accepts the same calls.
    """
    fanned = detect_to_classify(previous, source)
    items = []
    for item in fanned.items:
        rows = item[CLS_INPUT]
        if len(rows) < BATCH:
            rows = np.concatenate([rows, np.repeat(rows[-1:], BATCH - len(rows), axis=0)])
        items.append({CLS_INPUT: np.ascontiguousarray(rows)})
    real = sum(len(item[CLS_INPUT]) for item in fanned.items)
    return Fanout(items=items, carry={**fanned.carry, _CLS_ROWS: np.array(real, dtype=_INT)})


def rec_batch() -> int:
    """Rows per recogniser call: ``EDGE_OCR_REC_BATCH``, else :data:`REC_BATCH`.

    Raises:
        OcrError: the variable is not a whole number of at least 1.

    """
    raw = os.environ.get(REC_BATCH_ENV)
    if raw is None or raw == "":
        return REC_BATCH
    try:
        batch = int(raw)
    except ValueError:
        raise OcrError(REC_BATCH_ENV, "must be a whole number", raw) from None
    if batch < 1:
        raise OcrError(REC_BATCH_ENV, "must be at least 1", raw)
    return batch


def classify_to_recognize(previous: Mapping[str, Any], source: Mapping[str, Any]) -> Fanout:
    """Directions -> recogniser calls: lines turned, long ones split, pieces by width.

    Each call holds up to :func:`rec_batch` rows of one recognition width: with one row
    per call each row's own (:func:`~edge_ocr_example.page_reader.own_width`), else 320,
    640, 960 or 1280.

    Raises:
        TensorMismatch: a carried tensor is missing, or the classifier's rows do not match.
        OcrError: ``EDGE_OCR_REC_BATCH`` is not a whole number of at least 1.

    """
    batch = rec_batch()
    image, _ = _source(source)
    quads = np.asarray(previous[_QUADS], dtype=np.float32)
    owners = np.asarray(previous[_OWNERS], dtype=_INT)
    probabilities = _stacked(previous, CLS_OUTPUT, (0, 2))
    if _CLS_ROWS in previous:  # padded calls: the padding's outputs are dropped
        probabilities = probabilities[: int(np.asarray(previous[_CLS_ROWS]))]
    if len(probabilities) != len(owners):
        raise TensorMismatch(f"previous[{CLS_OUTPUT!r}]", f"expected {len(owners)} rows",
                             len(probabilities))
    scores = np.asarray(previous[_SCORES])
    crops = previous.get(_CROPS)
    if isinstance(crops, tuple) and len(crops) == len(quads):  # cut by detect_to_classify
        turns = np.asarray(previous[_TURNS], dtype=_INT)
        lines = [Line(quad, float(score), crop, int(turn))
                 for quad, score, crop, turn in zip(quads, scores, crops, turns, strict=True)]
    else:  # the same crops, cut again (deterministic)
        lines = cut_lines(image, quads, scores)
    apply_directions(lines, probabilities, owners)
    rows = recognition_rows(lines, widths=REC_WIDTHS if batch > 1 else None)
    by_width: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        by_width.setdefault(row.row.shape[2], []).append(index)
    items: list[dict[str, np.ndarray]] = []
    order: list[int] = []
    for width in sorted(by_width):
        members = by_width[width]
        for start in range(0, len(members), batch):
            chunk = members[start : start + batch]
            items.append({REC_INPUT: np.stack([rows[i].row for i in chunk])})
            order.extend(chunk)
    pieces = np.array([[rows[i].line, rows[i].piece.x0, rows[i].piece.x1,
                        int(rows[i].piece.space_before), int(rows[i].other)] for i in order],
                      dtype=_INT).reshape(-1, 5)
    carry = {
        _QUADS: quads,
        _TURNS: np.array([line.turns for line in lines], dtype=_INT),
        _PIECES: pieces,
    }
    return Fanout(items=items, carry=carry)


def _calls(outputs: Mapping[str, Any], names: Sequence[str]) -> list[dict[str, Any]]:
    """Each recogniser call's outputs ``names`` (gathered lists in item order, or one call).

    Raises:
        TensorMismatch: the names' lists differ in length.

    """
    columns = [outputs.get(name, []) for name in names]
    columns = [[c] if isinstance(c, np.ndarray) else list(c) for c in columns]
    if len({len(c) for c in columns}) > 1:
        raise TensorMismatch(f"outputs{list(names)}", "expected as many calls of each",
                             [len(c) for c in columns])
    return [dict(zip(names, parts, strict=True)) for parts in zip(*columns, strict=True)]


def finish(outputs: Mapping[str, Any], inputs: Mapping[str, Any],
           bundles: Mapping[str, Path | None]) -> list[dict[str, Any]]:
    """Recognised lines in reading order: text, score and box (image pixels, 4 corners).

    Raises:
        OcrError: the recognise stage has no bundle (its dictionary is in it).
        TensorMismatch: the recogniser's rows do not match the carried pieces.

    """
    characters = bundle_characters(bundles)
    pieces = np.asarray(outputs[_PIECES], dtype=_INT)
    pieces = pieces.reshape(-1, pieces.shape[-1] if pieces.ndim == 2 else 4)
    if pieces.shape[1] not in (4, 5):
        raise TensorMismatch(f"outputs[{_PIECES!r}]", "expected 4 or 5 columns",
                             pieces.shape)
    decoded: list[tuple[str, float]] = []
    name = REC_BEST if REC_BEST in outputs else REC_OUTPUT
    for call in _calls(outputs, (name, REC_CONFIDENCE) if name == REC_BEST else (name,)):
        decoded.extend(recogniser_decode(call, characters))
    if len(decoded) != len(pieces):
        raise TensorMismatch(f"outputs[{name!r}]", f"expected {len(pieces)} rows",
                             len(decoded))
    keyed: Sequence[tuple[int, LinePiece]] = [
        (int(row[0]), LinePiece(int(row[1]), int(row[2]), bool(row[3]))) for row in pieces
    ]
    other = [bool(row[4]) for row in pieces] if pieces.shape[1] == 5 else None
    lines = assemble(np.asarray(outputs[_QUADS]), np.asarray(outputs[_TURNS]), keyed, decoded,
                     other=other)
    return [{"text": line.text, "score": round(float(line.score), 4),
             "box": np.asarray(line.box, dtype=np.float64).round(1).tolist()}
            for line in lines]
