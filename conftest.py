"""Fixtures the whole test suite shares, and the test backends' switch.

The test backends (``echo``, ``echo-preemptible``) register in the ``edge.testing``
entry-point group, which edge-core loads only under ``EDGE_TEST_BACKENDS=1`` (or when
``EDGE_PLUGINS`` names them): it is set here, before any test runs, so in-process plugin
loading and every ``edge`` subprocess a test starts see them, while a user's ``edge
plugins`` in the same virtual environment does not.

``demo_build`` is what ``make demo`` builds, built once per test session: the README's
and the how-tos' commands run against it (tests/docs), and the OCR example's tests read
its bundles (tests/examples).

Stored placement decisions (docs/config.md) go to a temporary directory of the session,
never to the user's cache (``EDGE_PLACEMENT_CACHE``, set for the whole session): a test
that opens a pipeline with candidates measures, stores and reuses decisions there, and
tests of the store point it at their own directories. Stored load gates
(``EDGE_GATE_CACHE``) go to a directory of each test's own, so that no test's gate is
reused by another's open (a test of gate reuse opens twice within itself); cached probe
answers (``EDGE_PROBE_CACHE``) to one of the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["EDGE_TEST_BACKENDS"] = "1"

#: The demo's derived classifier bucket (the Makefile's ``edge derive qnn-static``).
DEMO_BUCKET = "4x3x48x192"


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``build/ocr`` as ``make demo`` leaves it, built once per session.

    The page pipeline's bundles, ``pipeline.toml``, ``pipeline-auto.toml`` and the demo
    page (``python -m edge_ocr_example.page_bundle``), and the classifier's static copy
    that ``pipeline-auto.toml`` offers to QNN (``edge derive qnn-static``): the same
    steps as the Makefile's, minus its timed runs. Tests read it; none may change it.
    """
    from edge_ocr_example.models import fetch_wheel
    from edge_ocr_example.page_bundle import build_page_bundles

    root = tmp_path_factory.mktemp("demo")
    ocr = root / "build" / "ocr"
    build_page_bundles(ocr, wheel=fetch_wheel())
    edge = Path(sys.executable).with_name("edge")
    derive = subprocess.run(
        [str(edge), "derive", "qnn-static", str(ocr / "classify"), "--bucket", DEMO_BUCKET,
         "--out", str(ocr / "classify-qnn"), "--quiet"],
        capture_output=True, text=True, timeout=600, check=False)
    assert derive.returncode == 0, derive.stderr
    return root


@pytest.fixture(autouse=True, scope="session")
def _placement_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGE_PLACEMENT_CACHE", str(tmp_path_factory.mktemp("placement-cache")))
        patch.setenv("EDGE_PROBE_CACHE", str(tmp_path_factory.mktemp("probe-cache")))
        yield


@pytest.fixture(autouse=True)
def _gate_cache(tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_GATE_CACHE", str(tmp_path_factory.mktemp("gates")))
