"""The direction rule both pipelines share: turn on the classifier's word, check small print."""

from __future__ import annotations

import numpy as np
import pytest

from edge_ocr_example.directions import (
    ANGLE_THRESH,
    CHECK_ALL_HEIGHT,
    CHECK_HEIGHT,
    CHECK_MARGIN,
    CHECK_THRESH,
    Direction,
    keep_second,
    line_direction,
)
from edge_ocr_example.errors import TensorMismatch
from edge_ocr_example.page_reader import Line, apply_directions


@pytest.mark.parametrize(("upside_down", "height", "expected"), [
    (ANGLE_THRESH + 0.05, CHECK_HEIGHT - 1, Direction(turn=True, check=True)),
    (ANGLE_THRESH + 0.05, CHECK_HEIGHT, Direction(turn=True, check=False)),
    (ANGLE_THRESH, CHECK_HEIGHT - 1, Direction(turn=False, check=True)),
    (CHECK_THRESH * 1.5, CHECK_HEIGHT - 1, Direction(turn=False, check=True)),
    (CHECK_THRESH * 1.5, CHECK_HEIGHT, Direction(turn=False, check=False)),
    (CHECK_THRESH, CHECK_HEIGHT - 1, Direction(turn=False, check=False)),
    (0.0, CHECK_ALL_HEIGHT, Direction(turn=False, check=False)),
    (0.0, CHECK_ALL_HEIGHT - 1, Direction(turn=False, check=True)),  # too small to trust
    (0.0, 1, Direction(turn=False, check=True)),
    (1.0, 1, Direction(turn=True, check=True)),
])
def test_a_line_turns_on_the_classifier_and_small_print_is_checked(
        upside_down: float, height: int, expected: Direction) -> None:
    assert line_direction(upside_down, height) == expected


@pytest.mark.parametrize(("upside_down", "height", "field"), [
    (float("nan"), 10, "upside_down"),
    (-0.1, 10, "upside_down"),
    (1.5, 10, "upside_down"),
    (0.5, 0, "height"),
])
def test_a_probability_or_height_out_of_range_is_refused_by_name(
        upside_down: float, height: int, field: str) -> None:
    with pytest.raises(TensorMismatch) as info:
        line_direction(upside_down, height)
    assert info.value.field == field


def test_the_second_reading_must_be_surer_by_more_than_the_margin() -> None:
    assert not keep_second((0.8, 8), (0.8, 8))
    assert not keep_second((0.8, 8), (0.8 + CHECK_MARGIN * 0.9, 8))
    assert keep_second((0.8, 8), (0.8 + CHECK_MARGIN * 1.1, 8))
    assert not keep_second((0.9, 8), (0.5, 8))
    assert keep_second((0.5, 8), (0.55, 8), margin=0.0)


@pytest.mark.parametrize(("first", "second", "kept"), [
    # upright small print whose turned reading scored higher on fewer characters
    ((0.822, 7), (0.977, 3), False),    # 'and thc' / 'pue'
    ((0.952, 15), (0.964, 14), False),  # 'balance summary' / 'Aewwns eouejeq'
    ((0.951, 14), (0.977, 8), False),   # '87 47 quantity' / 'Aquenb 8'
    # turned small print the classifier called upright: the turned reading wins
    ((0.625, 17), (0.987, 21), True),   # '0ud 6g Xze1 jo /q' / 'by of lazy 3971 price'
    ((0.0, 1), (0.997, 4), True),       # '' / 'city'
    ((0.593, 36), (0.950, 43), True),   # seed 11's turned014, its long line
])
def test_recorded_readings_keep_the_one_with_more_evidence(
        first: tuple[float, int], second: tuple[float, int], kept: bool) -> None:
    # scores and lengths as benchmarks/ocr_small_print.py's images gave them
    assert keep_second(first, second) is kept
    if not kept:  # the mean score alone turned these upright lines
        assert second[0] > first[0] + CHECK_MARGIN


# The classifier's windows ([p(0), p(180)] each) for lines the page reader cut from
# benchmarks/ocr_small_print.py's images and ocr_accuracy.py's pages: (crop height, windows,
# whether the recogniser read the line better turned by 180 degrees).
_RECORDED = [
    # turned lines the classifier calls upright (combined 180 degrees under 0.5)
    (11, [[0.9273892, 0.0726108], [0.9689233, 0.0310768]], True),  # seed 13, small013
    (10, [[0.9250396, 0.0749604], [0.8772947, 0.1227052], [0.5607406, 0.4392593]], True),
    (16, [[0.8034540, 0.1965460]], True),  # seed 7, sparse019 ('city')
    (20, [[0.4744549, 0.5255451], [0.8874312, 0.1125688]], True),  # seed 11, sparse004
    # upright lines it calls upright surely: read once
    (16, [[0.9975033, 0.0024967]], False),  # seed 13, sparse012 ('office To with')
    (19, [[0.4177420, 0.5822580], [0.9999770, 0.0000230], [0.9965494, 0.0034506]], False),
    (21, [[0.9999067, 0.0000934], [0.9999923, 0.0000078], [0.9999980, 0.0000020]], False),
]


@pytest.mark.parametrize(("height", "windows", "turned"), _RECORDED)
def test_recorded_turned_lines_the_classifier_calls_upright_are_read_both_ways(
        height: int, windows: list[list[float]], turned: bool) -> None:
    crop = np.zeros((height, 4 * height, 3), np.uint8)
    quad = np.zeros((4, 2), np.float32)
    line = Line(quad, 0.9, crop)
    probabilities = np.array(windows, np.float32)
    apply_directions([line], probabilities, np.zeros(len(windows), np.int64))
    assert line.turns == 0  # the classifier does not turn any of them
    assert line.check is turned  # the turned ones are read both ways, the sure ones once
