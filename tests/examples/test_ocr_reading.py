"""Reading order (columns, rotation, upside-down pages) and long lines split and re-joined."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from edge_ocr_example.errors import OcrError, TensorMismatch
from edge_ocr_example.layout import page_angle, reading_order
from edge_ocr_example.line_input import fit_width, line_row, pick_width
from edge_ocr_example.line_split import LinePiece, join_pieces, split_line


def _box(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], float)


def _turn(quads: np.ndarray, degrees: float, centre: tuple[float, float]) -> np.ndarray:
    a = math.radians(degrees)
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    return (quads - centre) @ rot.T + centre


def _two_columns() -> tuple[np.ndarray, list[str]]:
    """A title over two columns of 4 and 3 lines; the left column's lines are longer."""
    names, boxes = ["title"], [_box(50, 10, 700, 50)]
    for i in range(4):
        names.append(f"L{i}")
        boxes.append(_box(50, 80 + 40 * i, 360 - (100 if i == 3 else 0), 110 + 40 * i))
    for i in range(3):
        names.append(f"R{i}")
        boxes.append(_box(420, 80 + 40 * i, 700, 110 + 40 * i))
    return np.stack(boxes), names


def test_columns_are_read_one_after_the_other() -> None:
    quads, names = _two_columns()
    shuffled = np.random.default_rng(3).permutation(len(names))
    order = reading_order(quads[shuffled])
    assert [names[shuffled[i]] for i in order] == [
        "title", "L0", "L1", "L2", "L3", "R0", "R1", "R2"]


def test_a_table_is_read_row_by_row() -> None:
    # label, quantity and price columns: the quantities are narrower than the gaps beside them
    names, boxes = [], []
    for row, (label, width) in enumerate((("Item", 60), ("Apples", 90), ("Coffee beans", 170),
                                          ("Milk", 55))):
        y = 30 + 50 * row
        names += [f"{label}", f"qty{row}", f"price{row}"]
        boxes += [_box(30, y, 30 + width, y + 30), _box(380, y, 400, y + 30),
                  _box(560, y, 640, y + 30)]
    shuffled = np.random.default_rng(5).permutation(len(names))
    order = reading_order(np.stack(boxes)[shuffled])
    assert [names[shuffled[i]] for i in order] == names


def test_three_columns_of_text_are_read_one_after_the_other() -> None:
    names, boxes = [], []
    for column in range(3):
        for line in range(3):
            names.append(f"C{column}L{line}")
            boxes.append(_box(30 + 330 * column, 30 + 40 * line, 330 + 330 * column,
                              60 + 40 * line))
    order = reading_order(np.stack(boxes))
    assert [names[i] for i in order] == names


def test_two_short_columns_far_apart_stay_columns() -> None:
    # two columns of single short words cannot be told from a two-column table: columns
    names = [f"L{i}" for i in range(3)] + [f"R{i}" for i in range(3)]
    boxes = [_box(40, 40 + 50 * i, 140, 70 + 50 * i) for i in range(3)]
    boxes += [_box(600, 40 + 50 * i, 700, 70 + 50 * i) for i in range(3)]
    order = reading_order(np.stack(boxes))
    assert [names[i] for i in order] == names


def test_a_single_column_reads_top_to_bottom_and_a_split_line_left_to_right() -> None:
    quads = np.stack([_box(400, 10, 700, 40), _box(10, 12, 380, 40),  # one line, two boxes
                      _box(10, 60, 120, 90),  # a short line below, on the left
                      _box(10, 110, 700, 140)])
    assert reading_order(quads).tolist() == [1, 0, 2, 3]


@pytest.mark.parametrize("degrees", [-10.0, 4.0, 9.0])
def test_a_slightly_rotated_page_keeps_its_line_and_column_order(degrees: float) -> None:
    quads, names = _two_columns()
    order = reading_order(_turn(quads, degrees, (400, 150)))
    assert [names[i] for i in order] == ["title", "L0", "L1", "L2", "L3", "R0", "R1", "R2"]


@pytest.mark.parametrize(("degrees", "turns"), [(180.0, 2), (90.0, 1), (270.0, 3)])
def test_a_turned_page_is_read_in_its_texts_direction(degrees: float, turns: int) -> None:
    quads, names = _two_columns()
    turned = _turn(quads, degrees, (400, 150))
    # re-order each box's corners as the detector reports them (by image position)
    from edge_ocr_example.quads import order_corners

    turned = np.stack([order_corners(q) for q in turned])
    assert page_angle(turned, [turns] * len(names)) == pytest.approx(
        math.radians(degrees if degrees <= 180 else degrees - 360), abs=1e-6)
    order = reading_order(turned, [turns] * len(names))
    assert [names[i] for i in order] == ["title", "L0", "L1", "L2", "L3", "R0", "R1", "R2"]


def test_reading_order_checks_its_inputs() -> None:
    assert reading_order(np.zeros((0, 4, 2))).tolist() == []
    with pytest.raises(TensorMismatch, match="quads"):
        reading_order(np.zeros((3, 2)))
    with pytest.raises(TensorMismatch, match="turns"):
        reading_order(np.zeros((2, 4, 2)), [0])


def _line(text: str, size: int = 32) -> np.ndarray:
    font = ImageFont.truetype("DejaVuSans.ttf", size)
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("RGB", (right - left + 20, bottom - top + 16), "white")
    ImageDraw.Draw(image).text((10 - left, 8 - top), text, font=font, fill="black")
    return np.asarray(image)


def test_a_line_that_fits_is_one_piece() -> None:
    crop = _line("short line")
    assert split_line(crop) == [LinePiece(0, crop.shape[1], False)]


def test_a_long_line_is_cut_in_word_spaces_into_pieces_that_fit() -> None:
    words = " ".join(f"word{i:02d}" for i in range(40))
    crop = _line(words)
    pieces = split_line(crop, max_width=640)
    room = 640 * crop.shape[0] / 48
    assert len(pieces) >= 2
    assert pieces[0].x0 == 0 and pieces[-1].x1 == crop.shape[1]
    for before, after in itertools.pairwise(pieces):
        assert before.x1 == after.x0 and after.space_before  # contiguous, cut in a space
    assert all(p.x1 - p.x0 <= room for p in pieces)
    for piece in pieces[1:]:  # no ink in the cut column
        column = crop[:, piece.x0].min()
        assert column > 200


def test_a_line_without_spaces_is_cut_between_letters_and_joined_directly() -> None:
    crop = _line("W" * 60)
    pieces = split_line(crop, max_width=320)
    assert len(pieces) >= 3 and not any(p.space_before for p in pieces)


def test_pieces_rejoin_in_order_with_spaces_only_where_cut_in_a_space() -> None:
    pieces = [LinePiece(0, 10, False), LinePiece(10, 20, True), LinePiece(20, 30, False)]
    assert join_pieces(["Hello ", "wor", "ld! "], pieces) == "Hello world!"
    assert join_pieces(["one"], [LinePiece(0, 5, False)]) == "one"
    with pytest.raises(OcrError, match="texts: expected one text per piece"):
        join_pieces(["a"], pieces)
    with pytest.raises(TensorMismatch):
        split_line(np.zeros((0, 5, 3), np.uint8))


def test_rows_are_48_high_aspect_kept_padded_with_mid_grey() -> None:
    crop = np.full((24, 100, 3), 255, np.uint8)
    row = line_row(crop, 48, 320)
    assert row.shape == (3, 48, 320) and row.dtype == np.float32
    np.testing.assert_array_equal(row[:, :, :200], 1.0)
    np.testing.assert_array_equal(row[:, :, 200:], 0.0)
    assert fit_width(24, 100, 48) == 200
    assert pick_width(200, (320, 640)) == 320 and pick_width(700, (320, 640)) == 640
    with pytest.raises(OcrError, match="widths: no recognition width"):
        pick_width(10, ())
