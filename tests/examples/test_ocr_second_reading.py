"""A line of small print the classifier may have misjudged is read both ways, without graphs.

:func:`apply_directions` marks it, :func:`recognition_rows` gives its turned pieces too,
:func:`assemble` keeps the reading the recogniser is surer of, and the page pipeline's
carried pieces say which reading each recogniser row is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_ocr_example.directions import CHECK_ALL_HEIGHT, CHECK_HEIGHT, CHECK_MARGIN
from edge_ocr_example.errors import TensorMismatch
from edge_ocr_example.line_split import LinePiece
from edge_ocr_example.page_reader import (
    Line,
    apply_directions,
    assemble,
    recognition_rows,
)


def _line(height: int, width: int = 120) -> Line:
    crop = np.full((height, width, 3), 255, np.uint8)
    crop[height // 3 : 2 * height // 3, 5 : width - 5] = 0  # one bar of ink
    quad = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    return Line(quad, 0.9, crop)


def _quads(count: int) -> np.ndarray:
    return np.stack([np.array([[0, 40 * i], [100, 40 * i], [100, 40 * i + 20],
                               [0, 40 * i + 20]], np.float32) for i in range(count)])


@pytest.mark.parametrize(("height", "p180", "turned", "checked"), [
    (CHECK_HEIGHT - 1, 0.95, True, True),    # small print, sure: turned, and read both ways
    (CHECK_HEIGHT - 1, 0.7, False, True),    # small print, leaning: not turned, read both ways
    (CHECK_HEIGHT - 1, 0.3, False, True),    # leaning upright, not surely: read both ways
    (CHECK_HEIGHT - 1, 0.01, False, False),  # surely upright: read once
    (CHECK_ALL_HEIGHT - 1, 0.01, False, True),  # too small to trust the classifier
    (CHECK_HEIGHT, 0.95, True, False),       # large print: the classifier decides alone
    (CHECK_HEIGHT, 0.3, False, False),
])
def test_small_print_the_classifier_may_have_misjudged_is_marked(
        height: int, p180: float, turned: bool, checked: bool) -> None:
    line = _line(height)
    original = line.crop.copy()
    apply_directions([line], np.array([[1 - p180, p180]], np.float32), np.zeros(1, np.int64))
    assert line.check is checked
    assert line.turns == (2 if turned else 0)
    assert np.array_equal(line.crop, original[::-1, ::-1] if turned else original)


def test_a_checked_line_gives_its_turned_pieces_too() -> None:
    plain, checked = _line(20), _line(20)
    checked.crop[:, :10] = 0  # not symmetric: the turned crop differs
    checked.check = True
    rows = recognition_rows([plain, checked], widths=None)
    assert [(row.line, row.other) for row in rows] == [(0, False), (1, False), (1, True)]
    turned = recognition_rows([Line(checked.quad, 0.9, checked.crop[::-1, ::-1].copy())],
                              widths=None)
    assert np.array_equal(rows[2].row, turned[0].row)


def test_the_surer_reading_is_kept_and_the_turn_follows_it() -> None:
    piece = LinePiece(0, 100, False)
    pieces = [(0, piece), (0, piece), (1, piece), (1, piece), (2, piece)]
    decoded = [("uoisia", 0.70), ("vision", 0.95),   # the turned reading is surer
               ("upright", 0.90), ("ʇɥƃᴉɹdn", 0.60),  # the first reading is surer
               ("once", 0.90)]
    other = [False, True, False, True, False]
    lines = assemble(_quads(3), [0, 0, 0], pieces, decoded, other=other)
    assert [(line.text, round(line.score, 2)) for line in lines] == [
        ("vision", 0.95), ("upright", 0.90), ("once", 0.90)]


@pytest.mark.parametrize(("second", "kept"), [
    (0.8, "and 6986"),
    (0.8 + CHECK_MARGIN * 0.9, "and 6986"),
    (0.8 + CHECK_MARGIN * 1.1, "9869 pue"),
])
def test_scores_within_the_margin_keep_the_first_reading(second: float, kept: str) -> None:
    piece = LinePiece(0, 100, False)
    lines = assemble(_quads(1), [0], [(0, piece), (0, piece)],
                     [("and 6986", 0.8), ("9869 pue", second)], other=[False, True])
    assert [line.text for line in lines] == [kept]


def test_the_turned_reading_counts_in_the_reading_order() -> None:
    # two lines of an upside-down page: bottom one first; both read better turned
    piece = LinePiece(0, 100, False)
    pieces = [(0, piece), (0, piece), (1, piece), (1, piece)]
    decoded = [("dn", 0.5), ("top", 0.9), ("umop", 0.5), ("bottom", 0.9)]
    lines = assemble(_quads(2)[::-1].copy(), [0, 0], pieces, decoded,
                     other=[False, True, False, True])
    assert [line.text for line in lines] == ["top", "bottom"]


def test_assemble_refuses_flags_that_do_not_match_the_pieces() -> None:
    with pytest.raises(TensorMismatch, match=r"^other: expected one flag per piece \(1\): 2$"):
        assemble(_quads(1), [0], [(0, LinePiece(0, 10, False))], [("a", 0.9)],
                 other=[False, True])


def test_finish_keeps_the_surer_reading_of_a_line_read_both_ways(page_bundles: Path) -> None:
    from edge_ocr_example.buckets import REC_BEST, REC_CONFIDENCE
    from edge_ocr_example.decode import load_characters
    from edge_ocr_example.page_pipeline import finish

    characters = load_characters(page_bundles / "recognize" / "characters.txt")
    index = {c: i for i, c in enumerate(characters) if c}

    def call(text: str, confidence: float) -> tuple[np.ndarray, np.ndarray]:
        # each character followed by a blank (class 0), so that "mm" is not collapsed
        best = np.array([[k for c in text for k in (index[c], 0)]], np.int64)
        return best, np.full(best.shape, confidence, np.float32)

    calls = [call("sunny", 0.6), call("summary", 0.97)]
    outputs = {"carry:pieces": np.array([[0, 0, 50, 0, 0], [0, 0, 50, 0, 1]], np.int64),
               "carry:quads": _quads(1), "carry:turns": np.zeros(1, np.int64),
               REC_BEST: [c[0] for c in calls], REC_CONFIDENCE: [c[1] for c in calls]}
    bundles = {"recognize": page_bundles / "recognize"}
    assert [line["text"] for line in finish(outputs, {}, bundles)] == ["summary"]
    outputs["carry:pieces"] = np.zeros((2, 3), np.int64)
    with pytest.raises(TensorMismatch, match=r"^outputs\['carry:pieces'\]: expected 4 or 5 "
                                             r"columns: \(2, 3\)$"):
        finish(outputs, {}, bundles)
