"""A whole page through detect -> classify -> recognise, with any stage runner.

The steps, each a function so that a runtime can call the stages its own way (in
batches, fanned out) and still share every transform:

1. :func:`page_input` (from :mod:`~edge_ocr_example.page_scale`): the page at its own
   scale, padded to a multiple of 32 (a long, thin page folded into bands);
2. :func:`find_lines`: DB boxes as rotated rectangles, mapped to the image's pixels, each
   cut out of the *original* image by a perspective transform and turned upright when tall;
3. :func:`classifier_rows` / :func:`apply_directions`: the direction classifier's rows
   (48 x 192) and its decisions (:func:`~edge_ocr_example.directions.line_direction`),
   turning a line by 180 degrees when it is sure, and marking a line of small print it
   may have misjudged to be read both ways;
4. :func:`recognition_rows`: each line at height 48, split where it exceeds the widest
   recognition input, each piece padded to the narrowest width that holds it (for calls
   of several rows) or to its own width plus :data:`REC_ROOM` (:func:`own_width`, for
   calls of one row); a marked line's pieces also turned the other way;
5. :func:`assemble`: pieces decoded and re-joined (a marked line the way the recogniser
   is surer of), weak lines dropped, the rest in reading order, each with its box in
   image pixels.

:func:`read_page` runs all five with a ``run_stage(stage_id, inputs) -> outputs`` callable
and a batch size; :mod:`edge_ocr_example.reference` runs it on onnxruntime directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from edge_ocr_example.band_join import page_quads
from edge_ocr_example.buckets import (
    CLS_INPUT,
    CLS_OUTPUT,
    DET_INPUT,
    DET_OUTPUT,
    REC_INPUT,
)
from edge_ocr_example.decode import MIN_TEXT_SCORE, TextLine, recogniser_decode
from edge_ocr_example.directions import CHECK_MARGIN, keep_second, line_direction
from edge_ocr_example.errors import TensorMismatch
from edge_ocr_example.layout import reading_order
from edge_ocr_example.line_input import fit_width, line_row, pick_width
from edge_ocr_example.line_split import REC_MAX_WIDTH, LinePiece, join_pieces, split_line
from edge_ocr_example.page_scale import DET_LIMIT, PageFrame, page_input, to_image_points
from edge_ocr_example.perspective import crop_quad, upright_crop
from edge_ocr_example.quads import quad_size

__all__ = [
    "CLS_ROW",
    "CLS_WINDOWS",
    "REC_HEIGHT",
    "REC_ROOM",
    "REC_STEP",
    "REC_WIDTHS",
    "Line",
    "PieceRow",
    "apply_directions",
    "assemble",
    "classifier_rows",
    "cut_lines",
    "find_lines",
    "own_width",
    "read_page",
    "recognition_rows",
]

CLS_ROW: Final = (48, 192)
"""The direction classifier's row: height and width."""
CLS_WINDOWS: Final = 3
"""At most this many classifier rows per line (their verdicts are averaged)."""
REC_HEIGHT: Final = 48
"""The recogniser's row height."""
REC_WIDTHS: Final = (320, 640, 960, REC_MAX_WIDTH)
"""Recognition widths for calls of several rows: a piece goes to the narrowest that holds
it, so that pieces of similar length are padded alike and share a call."""
REC_STEP: Final = 32
"""A row sent alone (:func:`own_width`) is padded to a multiple of this many columns."""
REC_ROOM: Final = 1.15
"""A row sent alone is at least this many times as wide as its text (:func:`own_width`).

The recogniser emits one step per 8 columns and mixes the whole row, so padding changes
what it reads: measured on the 40 generated pages of ``benchmarks/ocr_accuracy.py``
(direct onnxruntime, one row per call), padding to the next multiple of 32 read 616 wrong
characters where the four widths read 379 (dense small print lost characters), the
widths with 64 or 96 columns of room 388 and 354, a quarter more 342, and 15 % more
316, at 3 % fewer recogniser columns than the four widths (docs/config.md)."""
_MIN_SIDE: Final = 3.0

StageRunner = Callable[[str, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass
class Line:
    """One detected text line: its box in image pixels and its upright crop."""

    quad: np.ndarray
    """``(4, 2)`` float32 corners in image pixels (top-left, top-right, ...)."""
    score: float
    """The detector's mean probability inside the box."""
    crop: np.ndarray
    """The ``h x w x 3`` uint8 crop, turned upright as far as known."""
    turns: int = 0
    """Counter-clockwise quarter turns applied to the crop (1: tall, +2: upside down)."""
    angle_score: float = field(default=0.0)
    """The classifier's confidence in its decision (0 before classification)."""
    check: bool = False
    """Read both ways (:attr:`edge_ocr_example.directions.Direction.check`)."""


@dataclass(frozen=True)
class PieceRow:
    """One recogniser input row: which line and piece it is, and the row itself."""

    line: int
    """Index of the line in the list given to :func:`recognition_rows`."""
    piece: LinePiece
    """The columns of the line crop this row holds."""
    row: np.ndarray
    """``3 x 48 x W`` float32."""
    other: bool = False
    """The piece is of the line's crop turned by 180 degrees (a checked line's second
    reading, :attr:`Line.check`); its columns count in that turned crop."""


def find_lines(prob: np.ndarray, frame: PageFrame, image: np.ndarray) -> list[Line]:
    """Boxes from the detector's ``H x W`` map, in image pixels, with their upright crops.

    A folded page's map is read band by band (:func:`~edge_ocr_example.band_join.page_quads`).
    """
    quads, scores = page_quads(prob, frame)
    mapped = [to_image_points(quad, frame) for quad in quads]
    keep = [i for i, quad in enumerate(mapped) if min(quad_size(quad)) > _MIN_SIDE]
    if not keep:
        return []
    return cut_lines(image, np.stack([mapped[i] for i in keep]), scores[keep])


def cut_lines(image: np.ndarray, quads: np.ndarray, scores: np.ndarray) -> list[Line]:
    """Lines again from their boxes: the same crops :func:`find_lines` cut (deterministic)."""
    lines: list[Line] = []
    for quad, score in zip(quads, scores, strict=True):
        crop, turned = upright_crop(crop_quad(image, quad))
        lines.append(Line(np.asarray(quad, dtype=np.float32), float(score), crop,
                          1 if turned else 0))
    return lines


def classifier_rows(lines: Sequence[Line]) -> tuple[np.ndarray, np.ndarray]:
    """The classifier's ``N x 3 x 48 x 192`` input for ``lines``, and each row's line index.

    The classifier was trained on rows of at most 4:1; a long line squeezed into one row is
    unreadable to it, so a line gives up to :data:`CLS_WINDOWS` windows of its own height
    times four, spread evenly along it, whose verdicts :func:`apply_directions` averages.
    """
    height, width = CLS_ROW
    rows: list[np.ndarray] = []
    owners: list[int] = []
    for index, line in enumerate(lines):
        h, w = line.crop.shape[:2]
        window = min(w, max(1, round(h * width / height)))
        count = min(CLS_WINDOWS, max(1, round(w / window)))
        for start in np.linspace(0, w - window, count).round().astype(int).tolist():
            rows.append(line_row(line.crop[:, start : start + window], height, width))
            owners.append(index)
    if not rows:
        return np.zeros((0, 3, height, width), dtype=np.float32), np.zeros(0, np.int64)
    return np.stack(rows), np.asarray(owners, dtype=np.int64)


def apply_directions(lines: Sequence[Line], probabilities: np.ndarray, owners: np.ndarray) -> None:
    """Turn each line whose rows say 180 degrees in place, and mark those to read both ways.

    A line's windows are independent evidence: their log-odds add up (each capped at
    +-log(999)), and the combined probability of 180 degrees and the crop's height decide
    (:func:`~edge_ocr_example.directions.line_direction`): the line turns when the
    classifier is sure, and a line of small print it may have misjudged is marked
    :attr:`Line.check` (turned or not).
    """
    cap = float(np.log(999.0))
    for index, line in enumerate(lines):
        mine = np.asarray(probabilities[owners == index], dtype=np.float64)
        if len(mine) == 0:
            continue
        odds = np.log(np.maximum(mine[:, 1], 1e-12) / np.maximum(mine[:, 0], 1e-12))
        total = float(np.clip(odds, -cap, cap).sum())
        upside_down = 1.0 / (1.0 + float(np.exp(-np.clip(total, -50.0, 50.0))))
        line.angle_score = max(upside_down, 1.0 - upside_down)
        direction = line_direction(upside_down, line.crop.shape[0])
        line.check = direction.check
        if direction.turn:
            line.crop = np.ascontiguousarray(line.crop[::-1, ::-1])
            line.turns += 2


def own_width(needed: int, widest: int = REC_MAX_WIDTH) -> int:
    """The width of a row sent alone: ``needed`` columns plus :data:`REC_ROOM`, rounded up
    to a multiple of :data:`REC_STEP`, at most ``widest``."""
    return min(widest, REC_STEP * math.ceil(needed * REC_ROOM / REC_STEP))


def recognition_rows(
    lines: Sequence[Line], *, widths: Sequence[int] | None = REC_WIDTHS
) -> list[PieceRow]:
    """Every line's pieces as recogniser rows, split beyond the widest of ``widths``.

    Each row is padded to the narrowest of ``widths`` that holds it, or with ``widths``
    None (calls of one row, nothing to share a width with) to :func:`own_width`. A checked
    line (:attr:`Line.check`) also gives the pieces of its crop turned by 180 degrees
    (:attr:`PieceRow.other`).
    """
    widest = REC_MAX_WIDTH if widths is None else max(widths)
    rows: list[PieceRow] = []
    for index, line in enumerate(lines):
        crops = [(line.crop, False)]
        if line.check:
            crops.append((np.ascontiguousarray(line.crop[::-1, ::-1]), True))
        for crop, other in crops:
            for piece in split_line(crop, height=REC_HEIGHT, max_width=widest):
                part = crop[:, piece.x0 : piece.x1]
                needed = fit_width(part.shape[0], part.shape[1], REC_HEIGHT)
                width = (own_width(needed, widest) if widths is None
                         else pick_width(needed, widths))
                rows.append(PieceRow(index, piece, line_row(part, REC_HEIGHT, width), other))
    return rows


def assemble(
    quads: np.ndarray,
    turns: Sequence[int] | np.ndarray,
    pieces: Sequence[tuple[int, LinePiece]],
    decoded: Sequence[tuple[str, float]],
    *,
    min_score: float = MIN_TEXT_SCORE,
    other: Sequence[bool] | None = None,
    margin: float = CHECK_MARGIN,
) -> list[TextLine]:
    """Join each line's decoded pieces, drop weak or empty lines, order the rest for reading.

    ``quads`` and ``turns`` describe the lines; ``pieces[i]`` is ``(line, piece)`` of the
    ``i``-th decoded row, in any order (a line's pieces are joined left to right). A line's
    score is the mean of its pieces' scores weighted by their text lengths. ``other[i]``
    (default all False) says the ``i``-th row reads the line turned by 180 degrees
    (:attr:`PieceRow.other`): a line read both ways keeps the second reading only when
    :func:`~edge_ocr_example.directions.keep_second` says so (its score and its characters,
    the pieces' text lengths as weighted, against the first's), and then counts two more
    turns.
    """
    count = len(quads)
    flags = [False] * len(pieces) if other is None else [bool(flag) for flag in other]
    if len(flags) != len(pieces):
        raise TensorMismatch("other", f"expected one flag per piece ({len(pieces)})",
                             len(flags))
    texts: list[list[list[str]]] = [[[], []] for _ in range(count)]
    parts: list[list[list[LinePiece]]] = [[[], []] for _ in range(count)]
    weights: list[list[list[tuple[float, int]]]] = [[[], []] for _ in range(count)]
    for (line, piece), (text, score), flag in zip(pieces, decoded, flags, strict=True):
        side = int(flag)
        texts[line][side].append(text)
        parts[line][side].append(piece)
        weights[line][side].append((score, max(1, len(text.strip()))))
    final_turns = np.asarray(turns, dtype=np.int64).copy()
    kept: list[int] = []
    results: list[TextLine] = []
    for index in range(count):
        readings = []
        for side in (0, 1):
            if not parts[index][side]:
                continue
            mine = parts[index][side]
            by_x = sorted(range(len(mine)), key=lambda i: mine[i].x0)
            text = join_pieces([texts[index][side][i] for i in by_x],
                               [mine[i] for i in by_x]).strip()
            total = sum(n for _, n in weights[index][side])
            score = sum(s * n for s, n in weights[index][side]) / total if total else 0.0
            readings.append((score, total, side, text))
        if not readings:
            continue
        score, total, side, text = readings[0]  # the first reading, or the only one
        if len(readings) == 2 and keep_second((score, total), readings[1][:2], margin):
            score, total, side, text = readings[1]
        if side:
            final_turns[index] += 2
        if score >= min_score and text:
            kept.append(index)
            results.append(TextLine(text, score, np.asarray(quads[index], dtype=np.float32)))
    if not results:
        return []
    order = reading_order(np.asarray(quads)[kept], final_turns[kept])
    return [results[i] for i in order]


def _batched(run_stage: StageRunner, stage: str, name: str, output: str, rows: np.ndarray,
             batch: int) -> np.ndarray:
    outputs = [np.asarray(run_stage(stage, {name: rows[i : i + batch]})[output])
               for i in range(0, len(rows), batch)]
    return np.concatenate(outputs)


def read_page(
    image: np.ndarray,
    run_stage: StageRunner,
    *,
    characters: Sequence[str],
    limit: int = DET_LIMIT,
    widths: Sequence[int] = REC_WIDTHS,
    batch: int = 8,
) -> list[TextLine]:
    """Read an ``H x W x 3`` uint8 RGB page; lines in reading order, boxes in image pixels."""
    det, frame = page_input(image, limit=limit)
    prob = np.asarray(run_stage("detect", {DET_INPUT: det})[DET_OUTPUT])[0, 0]
    lines = find_lines(prob, frame, image)
    if not lines:
        return []
    cls_rows, owners = classifier_rows(lines)
    probabilities = _batched(run_stage, "classify", CLS_INPUT, CLS_OUTPUT, cls_rows, batch)
    apply_directions(lines, probabilities, owners)
    rows = recognition_rows(lines, widths=widths)
    decoded: list[tuple[str, float] | None] = [None] * len(rows)
    by_width: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        by_width.setdefault(row.row.shape[2], []).append(index)
    for members in by_width.values():
        stacked = np.stack([rows[i].row for i in members])
        results = [result for start in range(0, len(stacked), batch)
                   for result in recogniser_decode(
                       run_stage("recognize", {REC_INPUT: stacked[start : start + batch]}),
                       characters)]
        for i, result in zip(members, results, strict=True):
            decoded[i] = result
    return assemble(np.stack([line.quad for line in lines]), [line.turns for line in lines],
                    [(row.line, row.piece) for row in rows], [d for d in decoded if d is not None],
                    other=[row.other for row in rows])
