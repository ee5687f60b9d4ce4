"""File names and paths inside an OCR bundle directory (no onnxruntime needed to use them).

::

    BUNDLES/
      bundle.json            pipeline description: stages, transforms, buckets, provenance
      pipeline.toml          an edge pipeline file for the three stages (ort-cpu, CPU only)
      image.png              the generated page the examples were computed from
      detect/    <graph>.onnx  example_inputs.npz  expected_outputs.npz  [manifest]
      classify/  <graph>.onnx  example_inputs.npz  expected_outputs.npz  [manifest]
      recognize/ <graph>.onnx  example_inputs.npz  expected_outputs.npz  characters.txt  [manifest]
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Final

from edge_ocr_example.chain import StageSpec

__all__ = [
    "DESCRIPTION",
    "EXAMPLE_INPUTS",
    "EXPECTED_OUTPUTS",
    "IMAGE",
    "MANIFEST",
    "PIPELINE",
    "graph_name",
    "graph_path",
    "stage_dir",
]

EXAMPLE_INPUTS: Final = "example_inputs.npz"
"""A stage's example bucket: its graph inputs on the generated page."""
EXPECTED_OUTPUTS: Final = "expected_outputs.npz"
"""A direct onnxruntime CPU run of the stage's graph on its example inputs."""
DESCRIPTION: Final = "bundle.json"
"""The pipeline description at the top of the bundle directory."""
IMAGE: Final = "image.png"
"""The generated page."""
PIPELINE: Final = "pipeline.toml"
"""The edge pipeline file next to the stage directories."""
MANIFEST: Final = "edge-manifest.json"
"""A stage's manifest, as ``edge_core.artifacts.create_manifest`` names it."""


def stage_dir(bundles: Path, stage: StageSpec) -> Path:
    """The directory of one stage's bundle."""
    return bundles / stage.id


def graph_name(stage: StageSpec) -> str:
    """The graph's file name in its bundle (the name it has in the wheel)."""
    return PurePosixPath(stage.graph_member).name


def graph_path(bundles: Path, stage: StageSpec) -> Path:
    """The graph file of one stage's bundle."""
    return stage_dir(bundles, stage) / graph_name(stage)
