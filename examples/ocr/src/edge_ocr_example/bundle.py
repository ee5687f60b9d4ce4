"""Build the three stage bundles: graph, examples per bucket, expected outputs, metadata.

For a generated page (or a given image) the builder runs the whole chain directly with
onnxruntime on the CPU, and writes for every stage the graph exactly as the pinned wheel
ships it, ``example_inputs.npz`` (the stage's first call on that page) and
``expected_outputs.npz`` (the graph's outputs on them), and for the classifier and the
recogniser an example per bucket of their shape sets under ``buckets/``
(:mod:`edge_ocr_example.bucket_examples`), declared in ``metadata.validation.shapes``.
The recogniser's dictionary is taken from its graph metadata into ``characters.txt``.
``bundle.json`` at the top describes the pipeline (stage order, transforms, shapes,
provenance) for whoever wires it.

A manifest per stage (``edge-manifest.json``) is written by the ``write_manifest`` hook,
called with the stage directory and its metadata once the stage's files are final; the
default is :func:`edge_manifest` (``edge_core.artifacts.create_manifest``); ``None``
writes no manifest.

``python -m edge_ocr_example.bundle OUT [--wheel WHL] [--cache DIR]`` builds into ``OUT``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from PIL import Image

from edge_ocr_example.bucket_examples import write_bucket_examples
from edge_ocr_example.buckets import CARRY_PREFIX, DET_SHAPE, STAGE_RAM
from edge_ocr_example.bundle_layout import (
    DESCRIPTION,
    EXAMPLE_INPUTS,
    EXPECTED_OUTPUTS,
    IMAGE,
    MANIFEST,
    PIPELINE,
    graph_name,
    graph_path,
    stage_dir,
)
from edge_ocr_example.chain import STAGES
from edge_ocr_example.decode import CHARACTERS_FILE, TextLine, character_table
from edge_ocr_example.errors import OcrError
from edge_ocr_example.make_image import render_lines
from edge_ocr_example.models import RAPIDOCR_VERSION, WHEEL_SHA256, read_graph
from edge_ocr_example.npz import save_npz
from edge_ocr_example.reference import PROVIDER, DirectRunner, recognize

__all__ = [
    "BuildResult",
    "ManifestWriter",
    "StageBundle",
    "build_bundles",
    "edge_manifest",
    "main",
    "pipeline_toml",
]

ManifestWriter = Callable[[Path, Mapping[str, Any]], object]
"""Writes a stage's manifest: called with the stage directory and its metadata."""



@dataclass(frozen=True)
class StageBundle:
    """One stage's bundle as written."""

    stage_id: str
    """Stage id (and directory name)."""
    directory: Path
    """The stage's bundle directory."""
    graph: str
    """Graph file name, relative to ``directory``."""
    metadata: Mapping[str, Any]
    """What the manifest records: the keyword arguments of ``create_manifest``."""


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build_bundles` wrote and what the reference read on the example page."""

    root: Path
    """The bundle directory."""
    stages: tuple[StageBundle, ...]
    """The stage bundles in data-flow order."""
    lines: tuple[TextLine, ...]
    """Lines recognised on the example page by the direct onnxruntime run."""


def _prepare(out: Path) -> None:
    """Create ``out``, or clear an earlier build in it; refuse any other non-empty directory."""
    if out.exists() and not out.is_dir():
        raise OcrError("out", "exists and is not a directory", str(out))
    if out.is_dir() and any(out.iterdir()) and not (out / DESCRIPTION).is_file():
        raise OcrError(
            "out", f"non-empty directory without {DESCRIPTION}; refusing to mix", str(out)
        )
    out.mkdir(parents=True, exist_ok=True)
    for stage in STAGES:
        shutil.rmtree(stage_dir(out, stage), ignore_errors=True)


def _metadata(stage_id: str, producer: str,
              shapes: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The manifest metadata of one stage (keyword arguments of ``create_manifest``)."""
    stage = next(spec for spec in STAGES if spec.id == stage_id)
    validation: dict[str, Any] = {
        "expected_outputs": EXPECTED_OUTPUTS,
        "reference": f"onnxruntime {ort.__version__} {PROVIDER}",
        "session_options": "defaults (graph optimisation level ORT_ENABLE_ALL)",
        "comparison": "exact (bit for bit)",
    }
    if shapes:
        validation["shapes"] = [dict(entry) for entry in shapes]
    else:
        validation["bucket"] = {"x": list(DET_SHAPE)}
    if stage.transform_ref is not None:
        validation["input_transform"] = stage.transform_ref
    if stage is STAGES[-1]:
        validation["characters"] = CHARACTERS_FILE
    return {
        "component": f"ocr-{stage_id}",
        "graph": graph_name(stage),
        "example_inputs": EXAMPLE_INPUTS,
        "expected_outputs": EXPECTED_OUTPUTS,
        "checkpoint_revision": (
            f"rapidocr-onnxruntime=={RAPIDOCR_VERSION} (wheel sha256:{WHEEL_SHA256}) "
            f"{stage.graph_member}"
        ),
        "precision": "float32",
        "layout": "NCHW",
        "exporter": producer or "unrecorded in the graph",
        "calibration": None,
        "validation": validation,
    }


def edge_manifest(directory: Path, metadata: Mapping[str, Any]) -> object:
    """The default manifest writer: ``edge_core.artifacts.create_manifest`` (overwriting)."""
    from edge_core.artifacts import create_manifest  # imported on use: edge-core is optional

    return create_manifest(directory, overwrite=True, **metadata)


def pipeline_toml(backend: str = "ort-cpu", target: str = PROVIDER) -> str:
    """An edge pipeline file for the bundles it sits beside (manifests relative to it)."""
    lines = [
        'name = "ocr"',
        'prepare = "edge_ocr_example.pipeline_io:prepare"',
        'finish = "edge_ocr_example.pipeline_io:finish"',
        "",
    ]
    for stage in STAGES:
        lines += ["[[stages]]", f'id = "{stage.id}"', f'manifest = "{stage.id}/{MANIFEST}"']
        if stage.transform_ref is not None:
            lines.append(f'input_transform = "{stage.transform_ref}"')
        lines += [
            "",
            "[stages.backend]",
            f'name = "{backend}"',
            "",
            "[stages.placement]",
            f'target = "{target}"',
            "min_fraction_on_target = 1.0",
            "",
        ]
        if stage.id in STAGE_RAM:
            lines += ["[stages.resources]",
                      f'demands = {{ "machine:ram" = "{STAGE_RAM[stage.id]}" }}', ""]
    return "\n".join(lines)


def build_bundles(
    out: Path,
    *,
    image: np.ndarray | None = None,
    wheel: Path | None = None,
    cache_dir: Path | None = None,
    write_manifest: ManifestWriter | None = edge_manifest,
) -> BuildResult:
    """Write the three stage bundles into ``out`` and return what was written.

    Raises:
        OcrError: ``out`` is unusable, the graphs cannot be obtained or verified, the
            recogniser carries no dictionary, or the example page yields no text.

    """
    page = render_lines() if image is None else image
    graphs = {
        stage.id: read_graph(stage.graph_member, wheel=wheel, cache_dir=cache_dir)
        for stage in STAGES
    }
    runner = DirectRunner(graphs)
    dictionary = runner.metadata("recognize", "character")
    if not dictionary:
        raise OcrError("recognize.metadata['character']", "no dictionary in the graph", None)
    characters = character_table(dictionary.split("\n"))
    lines, trace = recognize(runner, page, characters)
    if not lines:
        raise OcrError("image", "no text recognised on the example page", page.shape)
    _prepare(out)
    Image.fromarray(page).save(out / IMAGE)
    bundles: list[StageBundle] = []
    for stage in STAGES:
        folder = stage_dir(out, stage)
        folder.mkdir()
        graph_path(out, stage).write_bytes(graphs[stage.id])
        save_npz(folder / EXAMPLE_INPUTS, trace.inputs[stage.id])
        save_npz(folder / EXPECTED_OUTPUTS, trace.outputs[stage.id])
        if stage is STAGES[-1]:
            (folder / CHARACTERS_FILE).write_bytes(dictionary.encode("utf-8"))
        shapes = write_bucket_examples(folder, stage.id, runner, trace.calls["detect"][0][0],
                                       trace.final)
        metadata = _metadata(stage.id, runner.producer(stage.id), shapes)
        if write_manifest is not None:
            write_manifest(folder, metadata)
        bundles.append(StageBundle(stage.id, folder, graph_name(stage), metadata))
    description = {
        "pipeline": "ocr",
        "stages": [
            {"id": b.stage_id, "directory": b.stage_id, "metadata": dict(b.metadata)}
            for b in bundles
        ],
        "carry_prefix": CARRY_PREFIX,
        "example_text": [line.text for line in lines],
    }
    (out / DESCRIPTION).write_text(json.dumps(description, indent=2, sort_keys=True) + "\n")
    (out / PIPELINE).write_text(pipeline_toml())
    return BuildResult(out, tuple(bundles), tuple(lines))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build the bundles and print the text recognised on the example page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="bundle directory to write")
    parser.add_argument("--wheel", type=Path, help="a local rapidocr-onnxruntime wheel")
    parser.add_argument("--cache", type=Path, help="where to download the wheel to")
    args = parser.parse_args(argv)
    try:
        result = build_bundles(args.out, wheel=args.wheel, cache_dir=args.cache)
    except (OcrError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for bundle in result.stages:
        validation = bundle.metadata["validation"]
        served = ([entry["name"] for entry in validation["shapes"]] if "shapes" in validation
                  else validation["bucket"])
        print(f"{bundle.stage_id}: {bundle.directory} shapes {served}")
    for line in result.lines:
        print(f"  {line.text!r} ({line.score:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
