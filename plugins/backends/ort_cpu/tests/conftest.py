from __future__ import annotations

from pathlib import Path

import pytest

from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import Pool
from edge_ort.bundles import EXAMPLE_X, write_add_relu_bundle

__all__ = ["EXAMPLE_X"]


@pytest.fixture
def add_relu_bundle(tmp_path: Path) -> dict[str, Path]:
    """A complete bundle directory (graph, example, expected outputs, manifest)."""
    bundle = write_add_relu_bundle(tmp_path / "add_relu")
    return {"dir": bundle, "graph": bundle / "model.onnx",
            "example": bundle / "example_inputs.npz", "expected": bundle / "expected.npz"}


@pytest.fixture
def ledger() -> ResourceLedger:
    """A ledger of 8 GiB of host memory, fresh for each test."""
    return ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])


@pytest.fixture(scope="module")
def plugins() -> PluginSet:
    """The ort-cpu plugin alone."""
    return load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
