"""The page pipeline's recogniser batch: ``EDGE_OCR_REC_BATCH`` sets the rows per call.

The same lines (boxes on a drawn image, classified upright) are fanned out to the
recogniser with 1, 2, 4 and 8 rows a call: every call holds rows of one width and at most
the batch, and the rows, in order, are the same whatever the batch of several rows; a row
sent alone (calls ordered by width, so in another order) holds the same pixels, padded
only to its own width plus ``REC_ROOM`` (a multiple of ``REC_STEP``) instead of 320,
640, 960 or 1280. A value that is not a whole
number of at least 1 is refused naming the variable.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from edge_ocr_example.buckets import CLS_OUTPUT, REC_INPUT
from edge_ocr_example.errors import OcrError
from edge_ocr_example.page_pipeline import (
    FRAME,
    IMAGE,
    REC_BATCH,
    REC_BATCH_ENV,
    classify_to_recognize,
    rec_batch,
)
from edge_ocr_example.page_reader import REC_ROOM, REC_STEP, REC_WIDTHS, own_width
from edge_ocr_example.page_scale import PageFrame
from edge_ocr_example.pages import load_font

LINES = ("Invoice 1042", "Total 12.75 for 3 pages", "Paid", "Thank you for your order",
         "Ref 77-310", "A", "Served over HTTP today")


def _previous() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The classifier's gathered outputs and the carried page for LINES, one per row."""
    image = Image.new("RGB", (640, 40 * len(LINES) + 20), "white")
    draw = ImageDraw.Draw(image)
    font = load_font("DejaVuSans.ttf", 24)
    quads = []
    for index, text in enumerate(LINES):
        top = 10 + 40 * index
        draw.text((10, top), text, font=font, fill="black")
        right = 20 + draw.textlength(text, font=font)
        quads.append([[5, top - 2], [right, top - 2], [right, top + 32], [5, top + 32]])
    pixels = np.asarray(image)
    height, width = pixels.shape[:2]
    count = len(LINES)
    previous = {
        "carry:quads": np.asarray(quads, dtype=np.float32),
        "carry:det_scores": np.full(count, 0.9, dtype=np.float32),
        "carry:turns": np.zeros(count, dtype=np.int64),
        "carry:owners": np.arange(count, dtype=np.int64),
        CLS_OUTPUT: [np.tile(np.array([[0.99, 0.01]], np.float32), (count, 1))],
    }
    source = {IMAGE: pixels,
              FRAME: PageFrame(height, width, height, width, height, width).as_array()}
    return previous, source


def test_the_recogniser_batch_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    previous, source = _previous()
    monkeypatch.delenv(REC_BATCH_ENV, raising=False)
    assert rec_batch() == REC_BATCH
    rows_by_batch = {}
    for batch in (1, 2, 4, 8):
        monkeypatch.setenv(REC_BATCH_ENV, str(batch))
        fanned = classify_to_recognize(previous, source)
        calls = [item[REC_INPUT] for item in fanned.items]
        assert all(1 <= len(call) <= batch for call in calls), batch
        if batch == 1:
            assert len(calls) == len(LINES)
        assert all(len({row.shape for row in call}) == 1 for call in calls)
        rows_by_batch[batch] = ([row for call in calls for row in call],
                                fanned.carry["carry:pieces"])
    first_rows, first_pieces = rows_by_batch[2]
    for batch, (rows, pieces) in rows_by_batch.items():
        assert len(rows) == len(first_rows)
        if batch == 1:
            continue
        np.testing.assert_array_equal(pieces, first_pieces)
        for row, first in zip(rows, first_rows, strict=True):
            np.testing.assert_array_equal(row, first)
    alone_rows, alone_pieces = rows_by_batch[1]
    wide_by_piece = {tuple(piece): row for piece, row
                     in zip(first_pieces.tolist(), first_rows, strict=True)}
    assert sorted(wide_by_piece) == sorted(tuple(p) for p in alone_pieces.tolist())
    assert [row.shape[2] for row in alone_rows] == sorted(row.shape[2] for row in alone_rows)
    narrower = 0
    for piece, row in zip(alone_pieces.tolist(), alone_rows, strict=True):
        wide = wide_by_piece[tuple(piece)]
        width = row.shape[2]
        assert width % REC_STEP == 0 and wide.shape[2] in REC_WIDTHS
        np.testing.assert_array_equal(row, wide[:, :, :width])  # the same pixels
        assert not wide[:, :, width:].any()  # the wide row only adds padding
        text = int(np.flatnonzero(row.any(axis=(0, 1)))[-1]) + 1  # columns up to the last ink
        assert text * REC_ROOM <= width  # room kept after the text
        narrower += width < wide.shape[2]
    assert narrower == len(LINES)  # short lines: none is padded to 320
    monkeypatch.setenv(REC_BATCH_ENV, "8")
    assert len(classify_to_recognize(previous, source).items) < len(LINES)


def test_a_row_sent_alone_gets_room_rounded_to_the_step() -> None:
    assert own_width(1) == 32
    assert own_width(200) == 256  # 230 columns with room, rounded up
    assert own_width(700) == 832  # 805
    assert own_width(832) == 960  # 956.8
    assert own_width(1200) == 1280 and own_width(1280) == 1280  # never beyond the widest
    assert own_width(700, widest=640) == 640


@pytest.mark.parametrize("wrong", ["0", "-2", "four", "1.5"])
def test_a_bad_recogniser_batch_is_refused_by_name(monkeypatch: pytest.MonkeyPatch,
                                                   wrong: str) -> None:
    previous, source = _previous()
    monkeypatch.setenv(REC_BATCH_ENV, wrong)
    with pytest.raises(OcrError) as info:
        classify_to_recognize(previous, source)
    assert info.value.field == REC_BATCH_ENV
    assert wrong in str(info.value)
