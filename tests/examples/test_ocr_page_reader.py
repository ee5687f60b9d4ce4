"""Whole pages through the page reader on the real PP-OCRv4 graphs (direct onnxruntime).

The demo page (13 lines: a long one, a rotated one, an upside-down one) is read exactly;
turned, transparent and two-column pages keep their reading order; boxes are in the
original image's pixels.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from edge_ocr_example.buckets import CLS_INPUT, CLS_OUTPUT, DET_INPUT, DET_OUTPUT
from edge_ocr_example.decode import CHARACTERS_FILE, load_characters
from edge_ocr_example.images import to_rgb
from edge_ocr_example.make_image import DEFAULT_LINES, render_lines
from edge_ocr_example.page_reader import apply_directions, classifier_rows, find_lines, read_page
from edge_ocr_example.page_scale import page_input
from edge_ocr_example.pages import demo_page, load_font
from edge_ocr_example.quality import edit_distance
from edge_ocr_example.reference import DirectRunner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runner(ocr_bundles: Path) -> DirectRunner:
    return DirectRunner.from_bundles(ocr_bundles)


@pytest.fixture(scope="module")
def reader(ocr_bundles: Path, runner: DirectRunner):  # type: ignore[no-untyped-def]
    characters = load_characters(ocr_bundles / "recognize" / CHARACTERS_FILE)

    def read(image: Image.Image) -> list[tuple[str, np.ndarray]]:
        lines = read_page(to_rgb(image), runner, characters=characters)
        return [(line.text, line.box) for line in lines]

    return read


def test_the_demo_page_is_read_exactly_in_order(reader) -> None:  # type: ignore[no-untyped-def]
    image, lines = demo_page()
    assert [text for text, _ in reader(image)] == list(lines)


def _squeeze(lines: list[str]) -> str:
    return re.sub(r"\s+", "", "".join(lines))


def _columns_page() -> tuple[Image.Image, list[str]]:
    font = load_font("DejaVuSerif.ttf", 24)
    left = ["Left column first line", "left column second", "left column third line"]
    right = ["Right column opens here", "right column continues", "and it ends here"]
    page = Image.new("RGBA", (1100, 260), (0, 0, 0, 0))  # transparent paper
    draw = ImageDraw.Draw(page)
    for i, (a, b) in enumerate(zip(left, right, strict=True)):
        draw.text((40, 40 + 60 * i), a, font=font, fill=(0, 0, 0, 255))
        draw.text((600, 40 + 60 * i), b, font=font, fill=(0, 0, 0, 255))
    return page, left + right


@pytest.mark.parametrize("turn", [0, 7, 180, 90, 270])
def test_a_transparent_two_column_page_reads_column_by_column_at_any_turn(
    reader, turn: int,  # type: ignore[no-untyped-def]
) -> None:
    page, expected = _columns_page()
    turned = page.rotate(turn, expand=True, resample=Image.Resampling.BICUBIC)
    got = [text for text, _ in reader(turned)]
    assert _squeeze(got) == _squeeze(expected), got


@pytest.mark.parametrize("turn", [0, 90])
def test_a_long_thin_line_is_read_whole(reader, turn: int) -> None:  # type: ignore[no-untyped-def]
    # 24 px text 4000-odd px long: scaled to 960 it was 5 px high and found nowhere; the
    # page is folded into bands instead (enlarged as far as they fit, at most twice)
    text = " ".join(f"word{i} {i * 37 % 1000}" for i in range(1, 41))
    font = load_font("DejaVuSans.ttf", 24)
    page = Image.new("RGB", (int(font.getlength(text)) + 20, 44), "white")
    ImageDraw.Draw(page).text((10, 8), text, font=font, fill="black")
    assert page.width > 3000
    got = [text for text, _ in reader(page.rotate(turn, expand=True))]
    # the detector may cut a line into two boxes that share a letter, folded or not
    assert edit_distance(_squeeze([text]), _squeeze(got)) <= 0.01 * len(_squeeze([text])), got


def test_boxes_are_in_the_original_images_pixels(reader) -> None:  # type: ignore[no-untyped-def]
    font = load_font("DejaVuSans.ttf", 40)
    page = Image.new("RGB", (3000, 1200), "white")
    ImageDraw.Draw(page).text((1500, 800), "Total 98.50", font=font, fill="black")
    (text, box), = reader(page)
    assert text == "Total 98.50"
    x0, y0 = box.min(axis=0)
    x1, y1 = box.max(axis=0)
    assert 1470 < x0 < 1505 and 780 < y0 < 815  # ink starts at about (1502, 810)
    assert 1700 < x1 < 1790 and 840 < y1 < 870


def _pooled_cer(reader, pages: list[tuple[Image.Image, tuple[str, ...]]]) -> float:  # type: ignore[no-untyped-def]
    errors = total = 0
    for page, lines in pages:
        reference = _squeeze(list(lines))
        errors += edit_distance(reference, _squeeze([text for text, _ in reader(page)]))
        total += len(reference)
    return errors / total


def _small_print_pages() -> list[tuple[Image.Image, tuple[str, ...]]]:
    """8 px text on 245 x 68 images: the example's own image maker (Pillow's Aileron) and
    three DejaVu faces, two lines each."""
    pages = [(Image.fromarray(render_lines(lines, height=68, width=245, font_size=8)), lines)
             for lines in (DEFAULT_LINES[:2], DEFAULT_LINES[1:], DEFAULT_LINES[::-2])]
    for face, lines in (("DejaVuSans.ttf", ("Invoice 2024-0417 total 98.50", "Hello from the CPU")),
                        ("DejaVuSerif.ttf", ("Boxes come back in image pixels",
                                             "Delivery to 12 Station Road")),
                        ("DejaVuSansMono.ttf", ("Hello from the CPU", "Quantity 3 at 14.99 each"))):
        font = load_font(face, 8)
        page = Image.new("RGB", (245, 68), "white")
        draw = ImageDraw.Draw(page)
        for index, text in enumerate(lines):
            draw.text((10, 14 + 20 * index), text, font=font, fill=(20, 20, 20))
        pages.append((page, lines))
    return pages


def test_small_print_on_a_small_image_is_read(reader) -> None:  # type: ignore[no-untyped-def]
    # Read at its own size, 8 px text gave the detector boxes far taller than the text:
    # lines turned upside down, misread or dropped. The page is enlarged for detection
    # now (page_scale.MAX_ENLARGE). Measured against RapidOCR: benchmarks/RESULTS.md,
    # ocr_small_print.
    assert _pooled_cer(reader, _small_print_pages()) <= 0.12


def test_a_short_line_of_small_print_on_a_wide_empty_strip_is_read_whole(
        reader) -> None:  # type: ignore[no-untyped-def]
    # 1400 x 120, one line of 10 px text: scaled to the 960 limit it was 7 px high and its
    # first word was lost; folded (and enlarged up to page_scale.FOLD_MAX_SCALE) it is read
    # whole
    text = "Invoice 2024-0417 total 98.50"
    pages = []
    for face in ("DejaVuSans.ttf", "DejaVuSerif.ttf", "pillow:Aileron"):
        page = Image.new("RGB", (1400, 120), "white")
        ImageDraw.Draw(page).text((40, 55), text, font=load_font(face, 10), fill=(20, 20, 20))
        pages.append((page, (text,)))
        pages.append((page.rotate(90, expand=True), (text,)))  # the same strip standing up
    assert _pooled_cer(reader, pages) <= 0.03


def _strip(size: tuple[int, int], face: str, px: int,
           placed: tuple[tuple[tuple[int, int], str], ...]) -> tuple[Image.Image, tuple[str, ...]]:
    font = load_font(face, px)
    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    for xy, text in placed:
        draw.text(xy, text, font=font, fill=(20, 20, 20))
    return page, tuple(text for _, text in placed)


# sparse strips of benchmarks/ocr_small_print.py (seed 5): upright 8-10 px lines whose
# classifier windows say 180 degrees with 0.95-0.999; they were read upside down
# ('fewwns' for 'summary') or dropped as weak
_UPRIGHT_SMALL_PRINT = (
    ((1476, 284), "pillow:Aileron", 9, (((1245, 57), "station total meeting 8741 Discount"),)),
    ((2023, 58), "DejaVuSans-Bold.ttf", 10, (((1304, 11), "amount paper and for date"),
                                             ((1747, 27), "quick at Jumps payment balance"))),
    ((1579, 243), "DejaVuSans.ttf", 8, (((305, 32), "River balance service station"),
                                        ((1337, 45), "summary"))),
    ((1610, 198), "DejaVuSans-Bold.ttf", 9, (((1072, 35), "street 389 discount"),
                                             ((403, 77), "to 6883 with"), ((860, 119), "2616"))),
)


@pytest.mark.parametrize("case", range(len(_UPRIGHT_SMALL_PRINT)))
def test_upright_small_print_the_classifier_calls_upside_down_is_read_upright(
        reader, case: int) -> None:  # type: ignore[no-untyped-def]
    # the line is read both ways (directions.CHECK_THRESH) and the recogniser's surer
    # reading kept
    page, lines = _strip(*_UPRIGHT_SMALL_PRINT[case])
    assert [text for text, _ in reader(page)] == list(lines)


@pytest.mark.parametrize("case", [0, 1])
def test_the_same_small_print_upside_down_is_turned(
        reader, case: int) -> None:  # type: ignore[no-untyped-def]
    # the second reading must not undo a right turn (the first strip upside down was
    # read upside down before it: its classifier windows fell short of 0.9)
    page, lines = _strip(*_UPRIGHT_SMALL_PRINT[case])
    assert [text for text, _ in reader(page.rotate(180))] == list(lines)


# Turned small print the classifier calls upright (benchmarks/ocr_small_print.py's images):
# seed 13's small013 turned by 180 degrees, two lines 11 px high whose windows give 180
# degrees about 0.003 and 0.4; and a strip of seed 7's sparse kind stood on end, whose
# line (16 px high) stands upside down at about 0.2. Read as the classifier says, they came
# out upside down ('0ud 6g Xze1 jo /q') or empty; now the first is read both ways for its
# height (directions.CHECK_ALL_HEIGHT), the second for its probability (CHECK_THRESH).
_TURNED_SMALL_PRINT = (
    (((466, 95), "pillow:Aileron", 7, (((6, 21), "by of lazy 3971 price"),
                                       ((6, 33), "Dog receipt"))), 180),
    (((1102, 143), "DejaVuSansMono-Bold.ttf", 10, (((948, 47), "city"),)), 90),
)


@pytest.mark.parametrize("case", range(len(_TURNED_SMALL_PRINT)))
def test_turned_small_print_the_classifier_calls_upright_is_turned(
        reader, runner: DirectRunner, case: int) -> None:  # type: ignore[no-untyped-def]
    strip, angle = _TURNED_SMALL_PRINT[case]
    page, lines = _strip(*strip)
    page = page.rotate(angle, expand=True)
    # the premise: the classifier turns none of the lines, and each is read both ways
    image = to_rgb(page)
    det, frame = page_input(image)
    found = find_lines(np.asarray(runner("detect", {DET_INPUT: det})[DET_OUTPUT])[0, 0],
                       frame, image)
    rows, owners = classifier_rows(found)
    probabilities = np.asarray(runner("classify", {CLS_INPUT: rows})[CLS_OUTPUT])
    odds = [np.log(probabilities[owners == i, 1] / probabilities[owners == i, 0]).sum()
            for i in range(len(found))]
    assert len(found) == len(lines) and max(odds) < 0  # each leans to upright
    apply_directions(found, probabilities, owners)
    assert all(line.turns < 2 and line.check for line in found)
    read = [text for text, _ in reader(page)]
    assert read[0] == lines[0]
    assert edit_distance(_squeeze(list(lines)), _squeeze(read)) <= 2  # 'Dogrecep1'
