"""The parity baseline: the three graphs run directly with onnxruntime on the CPU.

:class:`DirectRunner` holds one ``InferenceSession`` per stage (CPUExecutionProvider,
default session options: full graph optimisation; results were measured identical for 1, 2
and all intra-op threads, but differ in the last bits with optimisation disabled, so an
edge worker must keep the default level to match). :func:`recognize` pushes an image
through preprocess -> detect -> transform -> classify -> transform -> recognise -> decode.

``python -m edge_ocr_example.reference BUNDLES [--image PNG] [--check]`` prints the
recognised lines; ``--check`` also runs the bundles' example inputs and requires every
stage's outputs to equal the stored ``expected_outputs.npz`` bit for bit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from edge_ocr_example.bucket_examples import BUCKET_DIR
from edge_ocr_example.bundle_layout import (
    EXAMPLE_INPUTS,
    EXPECTED_OUTPUTS,
    graph_path,
    stage_dir,
)
from edge_ocr_example.chain import STAGES, ChainTrace, run_chain
from edge_ocr_example.decode import CHARACTERS_FILE, TextLine, decode, load_characters
from edge_ocr_example.errors import OcrError, TensorMismatch
from edge_ocr_example.make_image import render_lines
from edge_ocr_example.npz import load_npz
from edge_ocr_example.preprocess import preprocess

__all__ = ["PROVIDER", "DirectRunner", "check_bundles", "main", "recognize"]

PROVIDER = "CPUExecutionProvider"
"""The one execution provider the reference uses."""


class DirectRunner:
    """Runs each stage's graph in its own onnxruntime CPU session."""

    def __init__(self, graphs: Mapping[str, bytes | Path]) -> None:
        """Open one session per stage id from the graph bytes or file paths."""
        self._sessions: dict[str, ort.InferenceSession] = {}
        for stage_id, graph in graphs.items():
            model = str(graph) if isinstance(graph, Path) else graph
            self._sessions[stage_id] = ort.InferenceSession(model, providers=[PROVIDER])

    @classmethod
    def from_bundles(cls, bundles: Path) -> DirectRunner:
        """Open the graphs of a bundle directory written by :mod:`edge_ocr_example.bundle`."""
        return cls({stage.id: graph_path(bundles, stage) for stage in STAGES})

    def __call__(self, stage_id: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one stage; returns its outputs by name.

        Raises:
            TensorMismatch: the input names differ from the graph's.

        """
        session = self._sessions[stage_id]
        expected = sorted(node.name for node in session.get_inputs())
        if sorted(inputs) != expected:
            raise TensorMismatch(f"{stage_id}.inputs", f"expected names {expected}", sorted(inputs))
        names = [node.name for node in session.get_outputs()]
        return dict(zip(names, session.run(names, dict(inputs)), strict=True))

    def metadata(self, stage_id: str, key: str) -> str | None:
        """One entry of a stage graph's custom metadata, or ``None``."""
        value: str | None = self._sessions[stage_id].get_modelmeta().custom_metadata_map.get(key)
        return value

    def producer(self, stage_id: str) -> str:
        """The tool that produced a stage's graph, as the graph records it (or ``""``).

        The PP-OCR graphs leave ``producer_name`` empty in places but name PaddlePaddle in
        their graph name; their model version is unset (INT64_MAX), so it is not reported.
        """
        meta = self._sessions[stage_id].get_modelmeta()
        return str(meta.producer_name or meta.graph_name or "")


def recognize(
    runner: DirectRunner, image: np.ndarray, characters: Sequence[str]
) -> tuple[list[TextLine], ChainTrace]:
    """Recognise the text in an RGB uint8 image; also returns every stage's inputs/outputs."""
    source = preprocess(image)
    trace = run_chain(runner, source)
    return decode(trace.final, source, characters=characters), trace


def check_bundles(runner: DirectRunner, bundles: Path) -> list[str]:
    """Run each stage on its stored examples (per bucket too); a line per mismatching output."""
    problems: list[str] = []
    pairs = []
    for stage in STAGES:
        folder = stage_dir(bundles, stage)
        pairs.append((stage.id, folder / EXAMPLE_INPUTS, folder / EXPECTED_OUTPUTS))
        for expected_file in sorted((folder / BUCKET_DIR).glob("*.expected.npz")):
            example = expected_file.with_name(expected_file.name.replace(".expected", ""))
            pairs.append((stage.id, example, expected_file))
    for stage_id, example_file, expected_file in pairs:
        outputs = runner(stage_id, load_npz(example_file))
        expected = load_npz(expected_file)
        stage = next(s for s in STAGES if s.id == stage_id)
        for name in sorted(set(expected) | set(outputs)):
            got, want = outputs.get(name), expected.get(name)
            if got is None or want is None:
                problems.append(f"{stage.id}.{name}: present on one side only")
            elif got.dtype != want.dtype or got.shape != want.shape:
                problems.append(
                    f"{stage.id}.{name}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
                )
            elif not np.array_equal(got, want):
                error = float(np.abs(got.astype(np.float64) - want).max())
                problems.append(f"{stage.id}.{name}: max abs error {error:g}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the text recognised in an image (the demo image by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", type=Path, help="directory written by edge_ocr_example.bundle")
    parser.add_argument("--image", type=Path, help="RGB image (default: the rendered demo page)")
    parser.add_argument("--check", action="store_true", help="compare with expected outputs")
    args = parser.parse_args(argv)
    try:
        runner = DirectRunner.from_bundles(args.bundles)
        characters = load_characters(stage_dir(args.bundles, STAGES[-1]) / CHARACTERS_FILE)
        if args.image is None:
            image = render_lines()
        else:
            with Image.open(args.image) as opened:
                image = np.asarray(opened.convert("RGB"))
        lines, _trace = recognize(runner, image, characters)
        for line in lines:
            print(line.text)
        if args.check:
            problems = check_bundles(runner, args.bundles)
            for problem in problems:
                print(f"MISMATCH {problem}", file=sys.stderr)
            if problems:
                return 1
    except (OcrError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
