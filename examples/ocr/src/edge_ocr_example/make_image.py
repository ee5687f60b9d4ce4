"""Render known lines of text into an RGB image with Pillow, deterministically.

Uses Pillow's built-in scalable font (``ImageFont.load_default(size=...)``, Aileron, shipped
inside Pillow, so a fresh machine needs no system fonts). A Pillow built without FreeType
only has the small bitmap font; then each line is rendered with it and enlarged by an
integer factor with nearest-neighbour sampling, which keeps glyph edges sharp.

Run ``python -m edge_ocr_example.make_image OUT.png`` to write the demo image.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from edge_ocr_example.buckets import DET_HEIGHT, DET_WIDTH
from edge_ocr_example.errors import OcrError

__all__ = ["DEFAULT_LINES", "FONT_SIZE", "main", "render_lines"]

DEFAULT_LINES: Final = (
    "Edge pipelines read text",
    "Invoice 2024-0417 total 98.50",
    "Hello from the CPU",
)
"""The lines of the demo image, top to bottom."""

FONT_SIZE: Final = 36
"""Default glyph size in pixels."""

_INK: Final = (20, 20, 20)
_PAPER: Final = (255, 255, 255)


def _line_image(text: str, size: int) -> Image.Image:
    """Render one line tightly (plus a small margin) on white paper."""
    font = ImageFont.load_default(size=size)
    if isinstance(font, ImageFont.FreeTypeFont):
        bounds = font.getbbox(text)
        left, top = math.floor(bounds[0]), math.floor(bounds[1])
        right, bottom = math.ceil(bounds[2]), math.ceil(bounds[3])
        pad = max(2, size // 8)
        line = Image.new("RGB", (right - left + 2 * pad, bottom - top + 2 * pad), _PAPER)
        ImageDraw.Draw(line).text((pad - left, pad - top), text, font=font, fill=_INK)
        return line
    # Pillow without FreeType: the bitmap font, enlarged without smoothing.
    left, top, right, bottom = font.getbbox(text)
    small = Image.new("RGB", (right - left + 4, bottom - top + 4), _PAPER)
    ImageDraw.Draw(small).text((2 - left, 2 - top), text, font=font, fill=_INK)
    factor = max(1, round(size / max(1, bottom - top)))
    return small.resize((small.width * factor, small.height * factor), Image.Resampling.NEAREST)


def render_lines(
    lines: Sequence[str] = DEFAULT_LINES,
    *,
    height: int = DET_HEIGHT,
    width: int = DET_WIDTH,
    font_size: int = FONT_SIZE,
) -> np.ndarray:
    """Return an ``height x width x 3`` uint8 RGB image with ``lines`` rendered top to bottom.

    Lines are left-aligned at a margin and spaced evenly down the page.

    Raises:
        OcrError: there are no lines, a line is empty, or the lines do not fit the page.

    """
    if not lines:
        raise OcrError("lines", "at least one line of text is needed", list(lines))
    rendered = []
    for index, text in enumerate(lines):
        if not text.strip():
            raise OcrError(f"lines[{index}]", "a line must hold visible text", text)
        rendered.append(_line_image(text, font_size))
    margin = font_size
    widest = max(line.width for line in rendered)
    if widest + 2 * margin > width:
        raise OcrError("lines", f"widest line needs {widest + 2 * margin} px > width", width)
    gap = font_size
    total = sum(line.height for line in rendered) + gap * (len(rendered) - 1)
    if total + 2 * margin > height:
        raise OcrError("lines", f"lines need {total + 2 * margin} px > height", height)
    page = Image.new("RGB", (width, height), _PAPER)
    y = margin
    for line in rendered:
        page.paste(line, (margin, y))
        y += line.height + gap
    return np.asarray(page, dtype=np.uint8).copy()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the demo image (or the given lines) as a PNG file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="PNG file to write")
    parser.add_argument("--line", action="append", dest="lines", help="a line of text (repeat)")
    parser.add_argument("--font-size", type=int, default=FONT_SIZE)
    args = parser.parse_args(argv)
    image = render_lines(tuple(args.lines or DEFAULT_LINES), font_size=args.font_size)
    Image.fromarray(image).save(args.output)
    print(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
