"""Fixtures for the ort-vitisai tests: the leak check, bundles, recorded listings."""

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
from edge_ort_vitisai.plugin import vendor_backend

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

DATA = Path(__file__).parent / "data"
#: The interpreter the synthetic Windows listing claims to come from.
WINDOWS_PYTHON = "C:\\ryzen-ai\\python.exe"


def listing(**changes: Any) -> EpDevices:
    """The synthetic Ryzen AI listing, with top-level keys replaced."""
    data = {**json.loads((DATA / "vitisai_npu.json").read_text()), **changes}
    return parse_ep_devices(data, WINDOWS_PYTHON)


def windows_prober(
    devices: EpDevices | None = None,
    distributions: Mapping[str, str] | None = None,
) -> Callable[[str | None, ExecutionDomain | None, bool], VendorProbe]:
    """A prober that judges a synthetic Ryzen AI machine exactly as a live probe would."""
    found = {"onnxruntime-vitisai": "1.23.2"} if distributions is None else distributions
    return recorded_prober(vendor_backend(), WINDOWS_PYTHON, ExecutionDomain.WINDOWS, found,
                           listing() if devices is None else devices)


def build_bundle(directory: Path, precision: str = "int8") -> Path:
    """The shared tiny bundle (y = relu(x + x)) labelled with ``precision``."""
    return write_add_relu_bundle(directory, precision=precision)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """An int8-labelled bundle."""
    return build_bundle(tmp_path / "int8")


@pytest.fixture
def a16w8_bundle(tmp_path: Path) -> Path:
    """An A16W8-labelled bundle."""
    return build_bundle(tmp_path / "a16w8", precision="A16W8")
