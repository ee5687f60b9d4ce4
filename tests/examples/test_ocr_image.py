"""The generated page: deterministic, at the detection bucket, refusing what cannot fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_ocr_example.buckets import DET_HEIGHT, DET_WIDTH
from edge_ocr_example.errors import OcrError
from edge_ocr_example.make_image import main, render_lines


def test_page_is_deterministic_rgb_at_the_detection_bucket() -> None:
    first, second = render_lines(), render_lines()
    assert first.shape == (DET_HEIGHT, DET_WIDTH, 3) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, second)
    ink = first.min(axis=2) < 128
    assert 0.01 < ink.mean() < 0.2  # text is there, and it is not a black page


def test_each_line_lands_in_its_own_band() -> None:
    page = render_lines(["one", "two"])
    rows_with_ink = np.flatnonzero((page.min(axis=2) < 128).any(axis=1))
    gaps = np.flatnonzero(np.diff(rows_with_ink) > 1)
    assert len(gaps) == 1  # two separated bands of ink


def test_page_refuses_lines_that_do_not_fit() -> None:
    with pytest.raises(OcrError, match=r"^lines: widest line needs \d+ px > width: 640$"):
        render_lines(["W" * 80])
    with pytest.raises(OcrError, match=r"^lines: lines need \d+ px > height: 640$"):
        render_lines(["x"] * 20)
    with pytest.raises(OcrError, match=r"^lines\[1\]: a line must hold visible text: ' '$"):
        render_lines(["a", " "])


def test_command_writes_the_page_as_png(tmp_path: Path) -> None:
    out = tmp_path / "page.png"
    assert main([str(out)]) == 0
    with Image.open(out) as written:
        np.testing.assert_array_equal(np.asarray(written), render_lines())
