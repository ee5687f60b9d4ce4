"""Fixtures for the OCR example's tests: leak checks, the pinned wheel, built bundles."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


@pytest.fixture(scope="session")
def ocr_wheel() -> Path:
    """The pinned rapidocr-onnxruntime wheel, from the cache (downloaded on first use)."""
    from edge_ocr_example.models import fetch_wheel

    return fetch_wheel()


@pytest.fixture(scope="session")
def ocr_bundles(ocr_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three stage bundles built once from the demo page, with manifests."""
    from edge_ocr_example.bundle import build_bundles

    out = tmp_path_factory.mktemp("ocr") / "bundles"
    build_bundles(out, wheel=ocr_wheel)
    return out


@pytest.fixture(scope="session")
def page_bundles(demo_build: Path) -> Path:
    """The page pipeline's bundles (shape sets), pipeline.toml and demo page, built once.

    They are ``make demo``'s build, shared with the docs' tests (the root conftest.py).
    """
    return demo_build / "build" / "ocr"
