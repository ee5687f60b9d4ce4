"""The page pipeline cuts each line once: the crops travel from one transform to the next.

:func:`detect_to_classify` cuts every line's upright crop from the page and carries the
crops on; :func:`classify_to_recognize` reads them instead of cutting them again (the
perspective crops were most of the controller's CPU per page). The recogniser's calls and
the carried pieces are exactly those of cutting again, which is still what it does when
no crops were carried.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw

import edge_ocr_example.page_pipeline as page_pipeline
from edge_ocr_example.buckets import CLS_INPUT, CLS_OUTPUT, DET_OUTPUT, REC_INPUT
from edge_ocr_example.page_pipeline import (
    FRAME,
    IMAGE,
    classify_to_recognize,
    detect_to_classify,
)
from edge_ocr_example.page_scale import PageFrame
from edge_ocr_example.pages import load_font

LINES = ("Invoice 1042", "Total 12.75 for 3 pages", "Paid", "Thank you for your order",
         "A longer line of text, in one piece")


def _page() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A drawn page (one line upside down) and a detection map over its lines."""
    width, pitch = 1400, 44
    image = Image.new("RGB", (width, pitch * len(LINES) + 20), "white")
    draw = ImageDraw.Draw(image)
    font = load_font("DejaVuSans.ttf", 24)
    prob = np.zeros((image.height, image.width), dtype=np.float32)
    for index, text in enumerate(LINES):
        top = 10 + pitch * index
        right = 12 + int(draw.textlength(text, font=font))
        if index == 2:  # upside down: drawn on its own, turned a half turn
            line = Image.new("RGB", (right - 8, 34), "white")
            ImageDraw.Draw(line).text((2, 2), text, font=font, fill="black")
            image.paste(line.rotate(180), (8, top))
        else:
            draw.text((10, top), text, font=font, fill="black")
        prob[top + 6 : top + 28, 12 : right - 2] = 0.95
    pixels = np.asarray(image)
    height, width = pixels.shape[:2]
    source = {IMAGE: pixels,
              FRAME: PageFrame(height, width, height, width, height, width).as_array()}
    return {DET_OUTPUT: prob[None, None]}, source


def _recognise_calls(fanned: Any) -> list[np.ndarray]:
    return [item[REC_INPUT] for item in fanned.items]


def test_the_recogniser_gets_exactly_the_calls_of_cutting_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    detected, source = _page()
    fan = detect_to_classify(detected, source)
    crops = fan.carry["carry:crops"]
    assert isinstance(crops, tuple) and len(crops) == len(LINES)
    rows = sum(len(item[CLS_INPUT]) for item in fan.items)
    verdicts = np.tile(np.array([[0.99, 0.01]], np.float32), (rows, 1))
    owners = np.asarray(fan.carry["carry:owners"])
    verdicts[owners == 2] = [0.01, 0.99]  # the upside-down line is turned
    previous = {**fan.carry, CLS_OUTPUT: [verdicts]}
    recut = {name: value for name, value in previous.items() if name != "carry:crops"}
    again = classify_to_recognize(recut, source)

    def no_cutting(*args: object) -> None:
        raise AssertionError("a carried line was cut again")

    monkeypatch.setattr(page_pipeline, "cut_lines", no_cutting)
    carried = classify_to_recognize(previous, source)
    assert carried.carry.keys() == again.carry.keys()
    for name, value in again.carry.items():
        np.testing.assert_array_equal(carried.carry[name], value)
        assert carried.carry[name].dtype == value.dtype
    assert [call.shape for call in _recognise_calls(carried)] == \
        [call.shape for call in _recognise_calls(again)]
    for call, expected in zip(_recognise_calls(carried), _recognise_calls(again),
                              strict=True):
        np.testing.assert_array_equal(call, expected)
    assert int(np.asarray(carried.carry["carry:turns"])[2]) >= 2  # turned, as cut again
    for crop in crops:  # reading them left the carried crops as they were
        assert crop.dtype == np.uint8 and crop.ndim == 3
    assert len(_recognise_calls(carried)) >= len(LINES)
