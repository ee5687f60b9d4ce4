"""Fixtures for the ort-directml tests: the leak check, a tiny bundle, recorded listings."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from edge_contracts.devices import ExecutionDomain
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.bundles import write_add_relu_bundle
from edge_ort.epdevices import EpDevices, parse_ep_devices
from edge_ort.vendor import VendorProbe, recorded_prober
from edge_ort_directml.plugin import vendor_backend

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

DATA = Path(__file__).parent / "data"
#: The interpreter the synthetic Windows listings claim to come from.
WINDOWS_PYTHON = "C:\\dml-env\\Scripts\\python.exe"


def listing(name: str = "dml_two_adapters.json", **changes: Any) -> EpDevices:
    """A synthetic Windows listing from ``data/``, with top-level keys replaced."""
    data = {**json.loads((DATA / name).read_text()), **changes}
    return parse_ep_devices(data, WINDOWS_PYTHON)


def windows_prober(
    devices: EpDevices | None = None,
    distributions: Mapping[str, str] | None = None,
) -> Callable[[str | None, ExecutionDomain | None, bool], VendorProbe]:
    """A prober that judges a synthetic Windows machine exactly as a live probe would."""
    found = {"onnxruntime-directml": "1.23.0"} if distributions is None else distributions
    return recorded_prober(vendor_backend(), WINDOWS_PYTHON, ExecutionDomain.WINDOWS, found,
                           listing() if devices is None else devices)


def build_bundle(directory: Path, precision: str = "fp32") -> Path:
    """The shared tiny bundle (y = relu(x + x)) labelled with ``precision``."""
    return write_add_relu_bundle(directory, precision=precision)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A complete fp32 bundle directory."""
    return build_bundle(tmp_path / "add_relu")
