"""Generated pages with known text: varied fonts, sizes, layouts and damage, from a seed.

Each page is drawn with one of :data:`FONTS` (Debian's ``fonts-dejavu-core``, which the
workspace's Makefile installs, plus Aileron, which ships inside Pillow), at 12 to 120
pixels, with 1 to 30 lines of up to 120 characters, and then given one or two *traits*:

``plain``, ``rotate-small`` (within +-10 degrees), ``rotate-90``, ``rotate-180``,
``rotate-270``, ``columns`` (two columns: the reference reads the left column, then the
right), ``low-contrast``, ``noise``, ``blur``, ``rgba`` (black text on a transparent
background), ``gray`` (8-bit grayscale) and ``jpeg60`` (JPEG at quality 60).

:func:`generate_pages` makes a set from a seed (the same seed gives the same pages);
:func:`demo_page` draws the demo page ``make demo`` reads: 13 lines, one of them long, one
rotated and one upside down. ``python -m edge_ocr_example.pages demo OUT.png`` writes it;
``python -m edge_ocr_example.pages set DIR --count N --seed S`` writes a set with a
``reference.json`` (file -> lines in reading order).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from edge_ocr_example.errors import OcrError

__all__ = [
    "FONTS",
    "TRAITS",
    "GeneratedPage",
    "demo_page",
    "generate_pages",
    "load_font",
    "main",
]

FONTS: Final = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "pillow:Aileron",
)
"""The fonts pages are drawn with: fonts-dejavu-core's six faces and Pillow's own font."""

TRAITS: Final = (
    "plain", "rotate-small", "rotate-90", "rotate-180", "rotate-270", "columns",
    "low-contrast", "noise", "blur", "rgba", "gray", "jpeg60",
)
"""Every trait a generated page can have."""

MAX_SIDE: Final = 2400
"""Longest side of a generated page before rotation, in pixels."""

_WORDS: Final = (
    "the", "of", "and", "to", "in", "is", "for", "on", "with", "as", "by", "at", "from",
    "this", "that", "are", "be", "or", "an", "it", "we", "can", "all", "data", "page",
    "text", "line", "model", "edge", "core", "stage", "order", "total", "invoice", "amount",
    "date", "number", "report", "table", "value", "report", "paper", "reader", "sample",
    "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "account", "balance",
    "payment", "receipt", "customer", "address", "street", "city", "service", "delivery",
    "system", "result", "version", "memory", "device", "process", "worker", "request",
    "answer", "output", "input", "morning", "evening", "weather", "market", "product",
    "price", "quantity", "discount", "summary", "section", "chapter", "figure", "review",
    "project", "meeting", "office", "station", "garden", "window", "letter", "river",
)


@dataclass(frozen=True)
class GeneratedPage:
    """One generated page: the image as it would be saved, and the text drawn on it."""

    name: str
    """File name, with the suffix of the format the page is saved in."""
    image: Image.Image
    """The page (mode RGB, RGBA or L)."""
    lines: tuple[str, ...]
    """The drawn text, one entry per line, in reading order."""
    traits: tuple[str, ...]
    """Which of :data:`TRAITS` the page has."""
    font: str
    """The font it was drawn with."""
    size: int
    """The font size in pixels."""

    def save(self, directory: Path) -> Path:
        """Write the page into ``directory`` under :attr:`name`; returns the path."""
        path = directory / self.name
        if self.name.endswith(".jpg"):
            self.image.save(path, quality=60)
        else:
            self.image.save(path)
        return path


def load_font(name: str, size: int) -> ImageFont.FreeTypeFont:
    """Open one of :data:`FONTS` at ``size`` pixels.

    Raises:
        OcrError: the font is not installed (``make fonts`` installs fonts-dejavu-core).

    """
    try:
        if name == "pillow:Aileron":
            font = ImageFont.load_default(size=size)
            if not isinstance(font, ImageFont.FreeTypeFont):
                raise OSError("Pillow was built without FreeType")
            return font
        return ImageFont.truetype(name, size)
    except OSError as exc:
        raise OcrError("font", f"not installed ({exc}); install fonts-dejavu-core", name) from exc


def _number(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return f"{rng.randrange(1, 10000)}"
    if kind == 1:
        return f"{rng.randrange(1, 999)}.{rng.randrange(100):02d}"
    if kind == 2:
        return f"{rng.randrange(2000, 2031)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    return f"#{rng.randrange(100, 99999)}"


def _sentence(rng: random.Random, length: int) -> str:
    """Words (a few numbers, capitals and punctuation among them) up to ``length`` chars."""
    words: list[str] = []
    total = 0
    while True:
        word = _number(rng) if rng.random() < 0.15 else rng.choice(_WORDS)
        if rng.random() < 0.2:
            word = word.capitalize()
        if rng.random() < 0.08:
            word += rng.choice(",.:;!?")
        if words and total + 1 + len(word) > length:
            break
        words.append(word)
        total += len(word) + (1 if len(words) > 1 else 0)
        if total >= length:
            break
    return " ".join(words)[:length].rstrip()


def _text_width(font: ImageFont.FreeTypeFont, text: str) -> int:
    left, _, right, _ = font.getbbox(text)
    return math.ceil(right - left)


def _fit(font: ImageFont.FreeTypeFont, text: str, width: int) -> str:
    """The longest prefix of whole words of ``text`` that is at most ``width`` pixels wide."""
    while _text_width(font, text) > width and " " in text:
        text = text.rsplit(" ", 1)[0]
    return text


def _draw_lines(
    page: Image.Image, font: ImageFont.FreeTypeFont, lines: Sequence[str], x: int, y: int,
    pitch: int, ink: int | tuple[int, ...],
) -> None:
    draw = ImageDraw.Draw(page)
    for index, text in enumerate(lines):
        draw.text((x, y + index * pitch), text, font=font, fill=ink)


def _page(rng: random.Random, index: int, traits: tuple[str, ...]) -> GeneratedPage:
    font_name = FONTS[index % len(FONTS)]
    # sizes spread log-uniformly over 12..120, both ends included
    size = 12 if index % 10 == 0 else 120 if index % 10 == 5 else round(
        math.exp(rng.uniform(math.log(12), math.log(120))))
    font = load_font(font_name, size)
    pitch = round(size * rng.uniform(1.35, 1.8))
    margin = max(16, size)
    columns = 2 if "columns" in traits else 1
    gutter = max(3 * size, 40)
    avg = max(1.0, _text_width(font, "the quick brown fox 1234") / 24)  # px per character
    col_chars = min(120, max(4, int((MAX_SIDE - 2 * margin - gutter * (columns - 1))
                                    / columns / avg)))
    rows = min(30 // columns, max(1, (MAX_SIDE - 2 * margin) // pitch))
    rows = rng.randint(1, rows) if index % 7 else rows  # every 7th page is full
    if columns == 2:
        rows = max(2, rows)
    lengths = [rng.randint(max(3, col_chars // 4), col_chars) for _ in range(rows * columns)]
    if index % 3 == 0:
        lengths[0] = col_chars  # some pages start with a line as long as they allow
    col_width = max(_text_width(font, "W" * 3), math.ceil(col_chars * avg))
    texts = [_fit(font, _sentence(rng, n), col_width) for n in lengths]
    width = 2 * margin + columns * col_width + gutter * (columns - 1)
    height = 2 * margin + rows * pitch
    paper, ink = (255, 20) if "low-contrast" not in traits else (
        rng.randint(190, 215), rng.randint(110, 140))
    page = Image.new("L", (width, height), paper)
    for column in range(columns):
        _draw_lines(page, font, texts[column * rows : (column + 1) * rows],
                    margin + column * (col_width + gutter), margin, pitch, ink)
    image: Image.Image = page.convert("RGB")
    if "rgba" in traits:
        # the ink's darkness becomes opacity: black text on a transparent background
        darkness = (paper - np.asarray(page, dtype=np.float32)) / max(1, paper - ink)
        rgba = np.zeros((*darkness.shape, 4), np.uint8)
        rgba[..., 3] = np.clip(darkness * 255, 0, 255).round().astype(np.uint8)
        image = Image.fromarray(rgba, "RGBA")
    if "blur" in traits:
        image = image.filter(ImageFilter.GaussianBlur(radius=max(0.8, size / 30)))
    if "rotate-small" in traits:
        angle = rng.choice((-1, 1)) * rng.uniform(2.0, 10.0)
        fill = (0, 0, 0, 0) if image.mode == "RGBA" else (paper,) * 3
        image = image.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True,
                             fillcolor=fill)
    for trait, angle in (("rotate-90", 90), ("rotate-180", 180), ("rotate-270", 270)):
        if trait in traits:
            image = image.rotate(angle, expand=True)
    if "noise" in traits and image.mode == "RGB":
        pixels = np.asarray(image, dtype=np.float32)
        noise = np.random.default_rng(rng.randrange(2**32)).normal(0, 14, pixels.shape[:2])
        image = Image.fromarray(np.clip(pixels + noise[..., None], 0, 255).astype(np.uint8))
    if "gray" in traits and image.mode == "RGB":
        image = image.convert("L")
    suffix = ".jpg" if "jpeg60" in traits else ".png"
    name = f"page{index:03d}-{'+'.join(traits)}{suffix}"
    return GeneratedPage(name, image, tuple(texts), traits, font_name, size)


def generate_pages(count: int, seed: int = 17) -> list[GeneratedPage]:
    """``count`` pages from ``seed``; every trait appears, each page has one or two.

    Raises:
        OcrError: ``count`` is not positive, or a font is missing.

    """
    if count < 1:
        raise OcrError("count", "must be at least 1", count)
    rng = random.Random(seed)  # noqa: S311 - reproducible test pages, not secrets
    pages = []
    for index in range(count):
        first = TRAITS[index % len(TRAITS)]
        traits: tuple[str, ...] = (first,)
        if first != "plain" and rng.random() < 0.4:
            extras = ("low-contrast", "blur", "rotate-small", "columns") if first == "rgba" else (
                "low-contrast", "noise", "blur", "gray", "jpeg60", "rotate-small", "columns")
            extra = rng.choice([t for t in extras if t != first])
            if not ({first, extra} <= {"rotate-small", "rotate-90", "rotate-180", "rotate-270"}):
                traits = (first, extra)
        page_rng = random.Random(rng.randrange(2**32))  # noqa: S311 - reproducible pages
        pages.append(_page(page_rng, index, traits))
    return pages


DEMO_LINES: Final = (
    "Edge pipelines read whole pages",
    "Invoice 2024-0417 total 98.50",
    "Hello from the CPU",
    "Every line goes through the recogniser",
    "Detection runs at the page's own scale",
    "Boxes come back in image pixels",
    "Delivery to 12 Station Road, Riverside",
    "Quantity 3 at 14.99 each, discount 5%",
    "Columns, rotation and long lines are handled",
    "This line is turned a little",
    "This line is upside down",
    "The last line of the demo page",
)


def demo_page() -> tuple[Image.Image, tuple[str, ...]]:
    """The demo page (RGB) and its lines in reading order: 13 lines of DejaVu Sans at 28 px.

    The eleventh line is rotated by 6 degrees and the twelfth is upside down; a 105-character
    line comes fourth.
    """
    font = load_font("DejaVuSans.ttf", 28)
    long_line = ("A long line of text that is much wider than the widest recognition input, "
                 "so it is split and joined again")
    lines = (*DEMO_LINES[:3], long_line, *DEMO_LINES[3:])
    pitch, margin = 56, 40
    width = 2 * margin + _text_width(font, long_line)
    page = Image.new("RGB", (width, 2 * margin + pitch * len(lines) + 40), "white")
    draw = ImageDraw.Draw(page)
    for index, text in enumerate(lines):
        y = margin + index * pitch
        if text in (DEMO_LINES[9], DEMO_LINES[10]):
            left, top, right, bottom = (round(v) for v in font.getbbox(text))
            strip = Image.new("RGB", (right - left + 16, bottom - top + 16), "white")
            ImageDraw.Draw(strip).text((8 - left, 8 - top), text, font=font, fill=(20, 20, 20))
            turned = strip.rotate(6 if text == DEMO_LINES[9] else 180, expand=True,
                                  resample=Image.Resampling.BICUBIC, fillcolor="white")
            page.paste(turned, (margin, y - (turned.height - strip.height) // 2))
        else:
            draw.text((margin, y), text, font=font, fill=(20, 20, 20))
    return page, lines


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the demo page, or a generated set with its reference text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    demo = sub.add_parser("demo", help="write the demo page")
    demo.add_argument("output", type=Path)
    pages = sub.add_parser("set", help="write a generated set and reference.json")
    pages.add_argument("directory", type=Path)
    pages.add_argument("--count", type=int, default=40)
    pages.add_argument("--seed", type=int, default=17)
    args = parser.parse_args(argv)
    if args.what == "demo":
        image, _ = demo_page()
        image.save(args.output)
        print(args.output)
        return 0
    args.directory.mkdir(parents=True, exist_ok=True)
    reference = {}
    for page in generate_pages(args.count, args.seed):
        page.save(args.directory)
        reference[page.name] = list(page.lines)
    (args.directory / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    print(f"{len(reference)} pages in {args.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
