"""OCR of small print and sparse strips: edge-core's page pipeline against RapidOCR's own.

The pages :mod:`ocr_accuracy` reads are mostly large, and their print 12 px or more; this
benchmark reads what they leave out, four kinds of generated image, each file read by
both in the same run (edge through the runtime as ``edge run --input FILE`` does, or with
``--reader direct`` on in-process onnxruntime sessions; the peer is
``rapidocr_onnxruntime.RapidOCR`` with its defaults, called with the file's path):

* ``small``: images 160-520 px wide and 40-160 px high holding one to three lines of
  7-10 px text, in the fonts of :data:`edge_ocr_example.pages.FONTS`;
* ``maker``: the example's own image maker (:func:`edge_ocr_example.make_image.render_lines`,
  Pillow's Aileron) at 7, 8 and 9 px, one or two lines on 245 x 68 to 400 x 90 images;
* ``small_turned``: the ``small`` images turned 180 degrees (the direction classifier's
  share: RapidOCR turns a line only on its classifier's word, as edge does);
* ``sparse``: strips 1000-2600 px long and 50-300 px across holding one to three short
  lines (one to five words) of 8-16 px text at random places; every fifth stood on end.

Scoring as :mod:`ocr_accuracy` scores: per kind, the pooled page CER with all whitespace
removed (the lines in reading order); ``cer_ratio`` per kind is
``edge_cer / max(peer_cer, 0.005)``.

Run: ``.venv/bin/python benchmarks/ocr_small_print.py [--per-kind 24] [--seed 5]``. It
builds the page bundles into a temporary directory unless ``--bundles DIR`` names built
ones. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ocr_accuracy import edge_reader, peer_reader
from PIL import Image, ImageDraw, ImageFont

from edge_core.identity import host_identity
from edge_ocr_example.errors import OcrError
from edge_ocr_example.make_image import render_lines
from edge_ocr_example.pages import FONTS, load_font
from edge_ocr_example.quality import edit_distance, squeeze

WORDS = (
    "the", "of", "and", "to", "in", "is", "for", "on", "with", "by", "at", "from", "total",
    "invoice", "amount", "date", "number", "report", "table", "value", "paper", "reader",
    "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "account", "balance",
    "payment", "receipt", "customer", "street", "city", "service", "delivery", "price",
    "quantity", "discount", "summary", "section", "meeting", "office", "station", "river",
)

Page = tuple[str, Image.Image, tuple[str, ...]]


def _words(rng: random.Random, count: int) -> str:
    words = []
    for _ in range(count):
        word = rng.choice(WORDS) if rng.random() > 0.15 else str(rng.randrange(1, 10000))
        words.append(word.capitalize() if rng.random() < 0.2 else word)
    return " ".join(words)


def _fit(font: ImageFont.FreeTypeFont, text: str, width: int) -> str:
    while font.getbbox(text)[2] > width and " " in text:
        text = text.rsplit(" ", 1)[0]
    return text


def _small(rng: random.Random, index: int) -> Page:
    size = rng.randint(7, 10)
    font = load_font(FONTS[index % len(FONTS)], size)
    width, height = rng.randint(160, 520), rng.randint(40, 160)
    pitch = round(size * rng.uniform(1.4, 1.9))
    count = max(1, min(rng.randint(1, 3), (height - 8) // pitch))
    lines = tuple(_fit(font, _words(rng, rng.randint(2, 8)), width - 12) for _ in range(count))
    page = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(page)
    top = rng.randint(3, max(3, height - pitch * count - 3))
    for row, text in enumerate(lines):
        draw.text((6, top + row * pitch), text, font=font, fill=(20, 20, 20))
    return f"small{index:03d}-{size}px.png", page, lines


def _maker(rng: random.Random, index: int) -> Page:
    size = (7, 8, 9)[index % 3]
    width, height = rng.choice(((245, 68), (245, 68), (300, 68), (400, 90)))
    for _ in range(100):
        lines = tuple(_words(rng, rng.randint(2, 5)) for _ in range(rng.randint(1, 2)))
        try:
            pixels = render_lines(lines, height=height, width=width, font_size=size)
        except OcrError:  # the lines do not fit the image: draw others
            continue
        return f"maker{index:03d}-{size}px.png", Image.fromarray(pixels), lines
    raise RuntimeError("no lines fit the image")


def _sparse(rng: random.Random, index: int) -> Page:
    size = rng.choice((8, 9, 10, 10, 11, 12, 13, 14, 16))
    font = load_font(FONTS[index % len(FONTS)], size)
    width, height = rng.randint(1000, 2600), rng.randint(50, 300)
    page = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(page)
    pitch = round(size * 1.6)
    placed: list[tuple[int, int, str]] = []
    top = rng.randint(3, max(3, height // 3))
    for _ in range(rng.randint(1, 3)):
        if top + pitch > height - 3:
            break
        text = _words(rng, rng.randint(1, 5))
        left = rng.randint(5, max(5, width - int(font.getlength(text)) - 5))
        draw.text((left, top), text, font=font, fill=(20, 20, 20))
        placed.append((top, left, text))
        top += pitch * rng.randint(1, 3)
    if index % 5 == 4:
        page = page.rotate(90, expand=True)
    return f"sparse{index:03d}-{size}px.png", page, tuple(text for _, _, text in placed)


def generate(per_kind: int, seed: int) -> dict[str, list[Page]]:
    """``per_kind`` images of each kind from ``seed`` (the same seed, the same images)."""
    rng = random.Random(seed)
    small = [_small(rng, i) for i in range(per_kind)]
    return {
        "small": small,
        "maker": [_maker(rng, i) for i in range(per_kind)],
        "small_turned": [(name.replace("small", "turned"), page.rotate(180), lines)
                         for name, page, lines in small],
        "sparse": [_sparse(rng, i) for i in range(per_kind)],
    }


def _cer(pages: Sequence[Page], outputs: Sequence[list[str]]) -> float:
    errors = total = 0
    for (_, _, lines), read in zip(pages, outputs, strict=True):
        reference = squeeze(lines)
        errors += edit_distance(reference, squeeze(read))
        total += len(reference)
    return errors / max(1, total)


def main(argv: Sequence[str] | None = None) -> int:
    """Generate the images, read them with both, print per-kind rows and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=24)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--bundles", type=Path, help="built bundles (default: build afresh)")
    parser.add_argument("--reader", choices=("runtime", "direct"), default="runtime")
    parser.add_argument("--keep", type=Path, help="also keep the images in this directory")
    args = parser.parse_args(argv)

    kinds = generate(args.per_kind, args.seed)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ocr-small-print-") as scratch:
        work = Path(scratch)
        folder = args.keep or work / "images"
        folder.mkdir(parents=True, exist_ok=True)
        edge_read, close = edge_reader(args.bundles, args.reader, work)
        peer_read = peer_reader()
        try:
            for kind, pages in kinds.items():
                edge_out, peer_out = [], []
                for name, page, lines in pages:
                    path = folder / name
                    page.save(path)
                    edge_out.append(edge_read(path))
                    peer_out.append(peer_read(path))
                    reference = squeeze(lines)
                    e = edit_distance(reference, squeeze(edge_out[-1])) / max(1, len(reference))
                    p = edit_distance(reference, squeeze(peer_out[-1])) / max(1, len(reference))
                    print(f"{name:24s} {page.width:5d}x{page.height:<5d} edge CER {e:6.3f}  "
                          f"peer CER {p:6.3f}", flush=True)
                edge_cer, peer_cer = _cer(pages, edge_out), _cer(pages, peer_out)
                results[kind] = {"pages": len(pages), "edge_cer": round(edge_cer, 4),
                                 "peer_cer": round(peer_cer, 4),
                                 "cer_ratio": round(edge_cer / max(peer_cer, 0.005), 3)}
        finally:
            close()
    result = {
        "kinds": results,
        "worst_cer_ratio": max(r["cer_ratio"] for r in results.values()),
        "per_kind": args.per_kind,
        "seed": args.seed,
        "edge_reader": args.reader,
        "machine": host_identity(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
