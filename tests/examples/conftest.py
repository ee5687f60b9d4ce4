"""Fixtures for the OCR example's tests: leak checks, the pinned wheel, built bundles."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

BuildOnce = Callable[[str, Callable[[Path], None]], Path]


@pytest.fixture(scope="session")
def ocr_wheel() -> Path:
    """The pinned rapidocr-onnxruntime wheel, from the cache (downloaded on first use)."""
    from edge_ocr_example.models import fetch_wheel

    return fetch_wheel()


@pytest.fixture(scope="session")
def ocr_bundles(ocr_wheel: Path, shared_build: BuildOnce) -> Path:
    """The three stage bundles built once per run from the demo page, with manifests
    (shared by the run's xdist workers: the root conftest's ``shared_build``)."""
    from edge_ocr_example.bundle import build_bundles

    def build(folder: Path) -> None:
        build_bundles(folder / "bundles", wheel=ocr_wheel)

    return shared_build("ocr-bundles", build) / "bundles"


@pytest.fixture(scope="session")
def page_bundles(demo_build: Path) -> Path:
    """The page pipeline's bundles (shape sets), pipeline.toml and demo page, built once.

    They are ``make demo``'s build, shared with the docs' tests (the root conftest.py).
    """
    return demo_build / "build" / "ocr"
