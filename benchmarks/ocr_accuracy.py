"""OCR accuracy on generated pages: edge-core's OCR pipeline against RapidOCR's own pipeline.

The pages come from :func:`edge_ocr_example.pages.generate_pages` (a fixed seed, the fonts
of fonts-dejavu-core plus Pillow's Aileron, 12-120 px, 1-30 lines of up to 120 characters,
small and quarter-turn rotations, two columns, low contrast, noise, blur, RGBA, grayscale,
JPEG at quality 60). Each page is saved as a file and read by both, in the same run:

* **edge**: the OCR example's page pipeline (:mod:`edge_ocr_example.page_bundle`) opened by
  the edge runtime (ort-cpu worker processes, admission, every shape-set entry gated, the
  classifier and recogniser fanned out over the lines), each file through the pipeline's
  own ``prepare``, ``Pipeline.run`` and ``finish`` - what ``edge run --input FILE`` does;
  ``--reader direct`` runs the example's page reader on onnxruntime sessions in this
  process instead (the same transforms, no runtime), to tell the two apart;
* **peer**: ``rapidocr_onnxruntime.RapidOCR`` (the installed package, the same PP-OCRv4
  graphs, the same onnxruntime) called with the file's path.

Scoring (page CER, pooled): per page, the reference (the generator's lines in reading
order: a two-column page's left column, then its right) and the output (the lines as
returned) are each concatenated with all whitespace removed; the sum over pages of the
edit distances divided by the sum of the reference lengths. ``cer_ratio`` =
``edge_page_cer / max(peer_page_cer, 0.005)`` (goal <= 1.0); ``edge_empty_where_peer_read``
counts pages where the peer read text and edge returned none (goal 0).

Run: ``.venv/bin/python benchmarks/ocr_accuracy.py [--pages 40] [--seed 17]`` (or
``make bench-ocr``). It builds the page bundles into a temporary directory unless
``--bundles DIR`` names built ones. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edge_core.identity import host_identity
from edge_ocr_example.pages import FONTS, GeneratedPage, generate_pages
from edge_ocr_example.quality import edit_distance, squeeze

Reader = Callable[[Path], list[str]]


def runtime_reader(pipeline_file: Path) -> tuple[Reader, Callable[[], None]]:
    """Read files through the edge runtime exactly as ``edge run --input FILE`` does."""
    from edge_core.config.transforms import resolve_input_transform
    from edge_core.runtime.pipeline_files import open_pipeline

    pipeline = open_pipeline(pipeline_file)
    prepare = resolve_input_transform(pipeline.config.prepare, "prepare")
    finish = resolve_input_transform(pipeline.config.finish, "finish")
    bundles = pipeline.bundle_directories()

    def read(path: Path) -> list[str]:
        inputs = dict(prepare(str(path)))
        with pipeline.run(inputs) as result:
            answer = finish(result.outputs, inputs, bundles)
        return [str(line["text"]) for line in answer]

    def close() -> None:
        pipeline.close()

    return read, close


def direct_reader(bundles: Path) -> tuple[Reader, Callable[[], None]]:
    """Read files with the example's page reader on in-process onnxruntime sessions."""
    from edge_ocr_example.decode import CHARACTERS_FILE, load_characters
    from edge_ocr_example.images import read_image
    from edge_ocr_example.page_reader import read_page
    from edge_ocr_example.reference import DirectRunner

    runner = DirectRunner.from_bundles(bundles)
    characters = load_characters(bundles / "recognize" / CHARACTERS_FILE)

    def read(path: Path) -> list[str]:
        return [line.text for line in read_page(read_image(path), runner,
                                                characters=characters)]

    return read, lambda: None


def edge_reader(bundles: Path | None, reader: str,
                work: Path) -> tuple[Reader, Callable[[], None]]:
    """The edge side of a comparison: ``reader`` (``runtime`` or ``direct``) over
    ``bundles``, built afresh in ``work`` when none are given."""
    if bundles is None:
        from edge_ocr_example.page_bundle import build_page_bundles

        bundles = work / "bundles"
        build_page_bundles(bundles)
    if reader == "runtime":
        return runtime_reader(bundles / "pipeline.toml")
    return direct_reader(bundles)


def peer_reader() -> Reader:
    """RapidOCR's own pipeline, from the installed ``rapidocr-onnxruntime`` package."""
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR()

    def read(path: Path) -> list[str]:
        result, _ = engine(str(path))
        return [str(item[1]) for item in result or []]

    return read


def score(pages: Sequence[GeneratedPage], outputs: Sequence[list[str]]) -> tuple[int, int]:
    """``(sum of edit distances, sum of reference lengths)`` over the pages."""
    errors = total = 0
    for page, lines in zip(pages, outputs, strict=True):
        reference = squeeze(page.lines)
        errors += edit_distance(reference, squeeze(lines))
        total += len(reference)
    return errors, total


def main(argv: Sequence[str] | None = None) -> int:
    """Generate the pages, read them with both, print per-page rows and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--bundles", type=Path, help="built bundles (default: build afresh)")
    parser.add_argument("--reader", choices=("runtime", "direct"), default="runtime")
    parser.add_argument("--keep", type=Path, help="also keep the pages in this directory")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ocr-accuracy-") as scratch:
        work = Path(scratch)
        folder = args.keep or work / "pages"
        folder.mkdir(parents=True, exist_ok=True)
        pages = generate_pages(args.pages, args.seed)
        files = [page.save(folder) for page in pages]
        edge_read, close = edge_reader(args.bundles, args.reader, work)
        peer_read = peer_reader()
        edge_out: list[list[str]] = []
        peer_out: list[list[str]] = []
        edge_s = peer_s = 0.0
        try:
            for page, path in zip(pages, files, strict=True):
                t0 = time.perf_counter()
                edge_lines = edge_read(path)
                t1 = time.perf_counter()
                peer_lines = peer_read(path)
                t2 = time.perf_counter()
                edge_s += t1 - t0
                peer_s += t2 - t1
                edge_out.append(edge_lines)
                peer_out.append(peer_lines)
                ref = squeeze(page.lines)
                e = edit_distance(ref, squeeze(edge_lines)) / max(1, len(ref))
                p = edit_distance(ref, squeeze(peer_lines)) / max(1, len(ref))
                print(f"{page.name:40s} {page.font:24s} {page.size:4d}px "
                      f"{len(page.lines):3d} lines  edge CER {e:6.3f} ({len(edge_lines):2d})  "
                      f"peer CER {p:6.3f} ({len(peer_lines):2d})", flush=True)
        finally:
            close()

    edge_errors, total = score(pages, edge_out)
    peer_errors, _ = score(pages, peer_out)
    edge_cer = edge_errors / total
    peer_cer = peer_errors / total
    by_trait: dict[str, dict[str, Any]] = {}
    for page, e_lines, p_lines in zip(pages, edge_out, peer_out, strict=True):
        for trait in page.traits:
            entry = by_trait.setdefault(trait, {"pages": 0, "ref": 0, "edge": 0, "peer": 0})
            ref = squeeze(page.lines)
            entry["pages"] += 1
            entry["ref"] += len(ref)
            entry["edge"] += edit_distance(ref, squeeze(e_lines))
            entry["peer"] += edit_distance(ref, squeeze(p_lines))
    traits = {t: {"pages": v["pages"], "edge_cer": round(v["edge"] / v["ref"], 4),
                  "peer_cer": round(v["peer"] / v["ref"], 4)} for t, v in by_trait.items()}
    result = {
        "edge_page_cer": round(edge_cer, 4),
        "peer_page_cer": round(peer_cer, 4),
        "cer_ratio": round(edge_cer / max(peer_cer, 0.005), 3),
        "edge_empty_where_peer_read": sum(
            1 for e, p in zip(edge_out, peer_out, strict=True)
            if not squeeze(e) and squeeze(p)),
        "pages": len(pages),
        "edge_pages_per_s": round(len(pages) / edge_s, 3),
        "peer_pages_per_s": round(len(pages) / peer_s, 3),
        "reference_chars": total,
        "edge_reader": args.reader,
        "seed": args.seed,
        "fonts": list(FONTS),
        "by_trait": traits,
        "machine": host_identity(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
