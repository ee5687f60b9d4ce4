"""A folded page's boxes: found band by band, moved into the page, cut text joined again."""

from __future__ import annotations

import numpy as np
import pytest

from edge_ocr_example.band_join import join_cut_quads, page_quads
from edge_ocr_example.errors import TensorMismatch
from edge_ocr_example.page_scale import PageFrame, band_windows, page_frame
from edge_ocr_example.regions import detect_quads


def _box(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)


def _join(*boxes: tuple[int, tuple[float, float, float, float]]) -> list[list[float]]:
    quads = np.stack([_box(*b) for _, b in boxes])
    bands = np.array([band for band, _ in boxes], np.int64)
    joined, scores = join_cut_quads(quads, np.full(len(boxes), 0.8, np.float32), bands)
    assert joined.dtype == np.float32 and scores.shape == (len(joined),)
    return sorted(np.concatenate([j.min(0), j.max(0)]).round(1).tolist() for j in joined)


def test_a_line_a_cut_crosses_is_joined_from_its_two_parts() -> None:
    # band 0 ends at 960, band 1 starts at 896: each part reaches into the shared columns
    assert _join((0, (100, 10, 958, 40)), (1, (898, 11, 1500, 41))) == [[100, 10, 1500, 41]]


def test_a_line_in_both_bands_and_its_part_become_one_box() -> None:
    # a tall page: a line lies whole in the overlap of band 0 and band 1, and band 0's
    # next line is cut at the band's end: its upper half is all band 0 saw of it
    got = _join((0, (10, 900, 280, 930)), (1, (11, 901, 281, 929)),
                (0, (10, 946, 280, 960)), (1, (10, 944, 282, 974)))
    assert got == [[10, 900, 281, 930], [10, 944, 282, 974]]


def test_lines_one_above_the_other_and_boxes_of_one_band_stay_apart() -> None:
    got = _join((0, (100, 10, 958, 40)), (1, (898, 36, 1500, 66)),  # next line down
                (0, (10, 80, 300, 110)), (0, (290, 80, 600, 110)))  # one band: not joined
    assert got == [[10, 80, 300, 110], [100, 10, 958, 40], [290, 80, 600, 110],
                   [898, 36, 1500, 66]]


def test_vertical_text_in_both_bands_is_joined_and_its_neighbour_is_not() -> None:
    # a wide page of vertical lines (a receipt turned a quarter): the cut runs along them
    got = _join((0, (900, 10, 930, 280)), (1, (901, 12, 931, 281)),
                (1, (926, 10, 956, 280)))
    assert got == [[900, 10, 931, 281], [926, 10, 956, 280]]


def test_a_line_over_three_bands_is_one_box_scored_by_area() -> None:
    quads = np.stack([_box(0, 0, 960, 30), _box(896, 0, 1856, 30), _box(1792, 0, 2000, 30)])
    joined, scores = join_cut_quads(quads, np.array([0.6, 0.9, 0.9], np.float32),
                                    np.array([0, 1, 2]))
    assert len(joined) == 1
    np.testing.assert_allclose(joined[0], _box(0, 0, 2000, 30), atol=1e-3)
    assert scores[0] == pytest.approx((0.6 * 960 + 0.9 * 960 + 0.9 * 208) / 2128)


def test_join_checks_its_inputs() -> None:
    empty, scores = join_cut_quads(np.zeros((0, 4, 2), np.float32), np.zeros(0), np.zeros(0))
    assert empty.shape == (0, 4, 2) and scores.shape == (0,)
    with pytest.raises(TensorMismatch, match="quads"):
        join_cut_quads(np.zeros((2, 4, 2)), np.zeros(2), np.zeros(1))


def test_a_folded_maps_line_comes_back_whole_in_page_pixels() -> None:
    frame = page_frame(40, 3000)  # enlarged twice: seven bands of 960, one under the other
    assert frame.folds == 7 and (frame.height, frame.width) == (80, 6000)
    prob = np.zeros((frame.padded_height, frame.padded_width), np.float32)
    line = (300, 2500)  # page columns of a line's shrunk core, rows 15 .. 25
    for w in band_windows(frame):
        lo, hi = max(line[0], w.x), min(line[1], w.x + w.width)
        if lo < hi:
            prob[w.row + 15 : w.row + 25, lo - w.x : hi - w.x] = 0.9
    quads, scores = page_quads(prob, frame)
    assert len(quads) == 1 and 0.75 < scores[0] < 0.9  # the dilated rim counts in
    x0, y0 = quads[0].min(0)
    x1, y1 = quads[0].max(0)
    assert x0 < 300 and x1 > 2500 and y0 < 15 and y1 > 25  # the whole line, unclipped
    assert x1 - x0 < 2200 + 40 and y1 - y0 < 10 + 40


def test_an_unfolded_map_is_read_whole_as_before() -> None:
    prob = np.zeros((64, 96), np.float32)
    prob[10:20, 5:90] = 0.8
    frame = PageFrame(60, 90, 60, 90, 64, 96)
    got, scores = page_quads(prob, frame)
    want, want_scores = detect_quads(prob)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(scores, want_scores)


def test_a_map_not_of_the_folded_frames_size_is_refused() -> None:
    frame = page_frame(40, 3000)
    with pytest.raises(TensorMismatch, match="prob: expected the folded frame's padded size"):
        page_quads(np.zeros((32, 960), np.float32), frame)
