"""The direction rule both pipelines share: turn on the classifier's word, check small print."""

from __future__ import annotations

import pytest

from edge_ocr_example.directions import (
    ANGLE_THRESH,
    CHECK_HEIGHT,
    CHECK_MARGIN,
    CHECK_THRESH,
    Direction,
    keep_second,
    line_direction,
)
from edge_ocr_example.errors import TensorMismatch


@pytest.mark.parametrize(("upside_down", "height", "expected"), [
    (ANGLE_THRESH + 0.05, CHECK_HEIGHT - 1, Direction(turn=True, check=True)),
    (ANGLE_THRESH + 0.05, CHECK_HEIGHT, Direction(turn=True, check=False)),
    (ANGLE_THRESH, CHECK_HEIGHT - 1, Direction(turn=False, check=True)),
    (CHECK_THRESH * 1.5, CHECK_HEIGHT - 1, Direction(turn=False, check=True)),
    (CHECK_THRESH * 1.5, CHECK_HEIGHT, Direction(turn=False, check=False)),
    (CHECK_THRESH, CHECK_HEIGHT - 1, Direction(turn=False, check=False)),
    (0.0, 1, Direction(turn=False, check=False)),
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
    assert not keep_second(0.8, 0.8)
    assert not keep_second(0.8, 0.8 + CHECK_MARGIN * 0.9)
    assert keep_second(0.8, 0.8 + CHECK_MARGIN * 1.1)
    assert not keep_second(0.9, 0.5)
    assert keep_second(0.5, 0.55, margin=0.0)
