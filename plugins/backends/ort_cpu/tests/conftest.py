from __future__ import annotations

from pathlib import Path

import pytest

from edge_ort.bundles import EXAMPLE_X, write_add_relu_bundle

__all__ = ["EXAMPLE_X"]


@pytest.fixture
def add_relu_bundle(tmp_path: Path) -> dict[str, Path]:
    """A complete bundle directory (graph, example, expected outputs, manifest)."""
    bundle = write_add_relu_bundle(tmp_path / "add_relu")
    return {"dir": bundle, "graph": bundle / "model.onnx",
            "example": bundle / "example_inputs.npz", "expected": bundle / "expected.npz"}
