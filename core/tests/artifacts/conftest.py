"""Fixtures of the artifact tests: every test fails if it leaks a process, segment or fd.

Staged copies go under a per-test directory that is checked to be empty afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_core.testing.leaks import no_leaks as _no_leaks

from .bundles import write_bundle

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


@pytest.fixture
def staging_root(tmp_path: Path) -> Iterator[Path]:
    """A directory for staged copies; the test fails if anything is left in it."""
    root = tmp_path / "staging"
    root.mkdir()
    yield root
    left = sorted(p.name for p in root.iterdir())
    assert not left, f"staged copies left behind: {left}"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A created bundle whose graph keeps its weights in external data."""
    return write_bundle(tmp_path / "bundle")
