"""The built wheels and sdists of every distribution, built once per test session."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .distributions import DIRS, ROOT

BuildOnce = Callable[[str, Callable[[Path], None]], Path]


@pytest.fixture(scope="session")
def built(shared_build: BuildOnce) -> Path:
    """A folder holding the wheel and the sdist of every distribution in ``DIRS``, built
    once per run (shared by the run's xdist workers: the root conftest's ``shared_build``)."""

    def build(out: Path) -> None:
        for directory in DIRS:
            result = subprocess.run(
                [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                 str(ROOT / directory)],
                capture_output=True, text=True, timeout=600, check=False)
            assert result.returncode == 0, (
                f"{directory}: {result.stdout[-2000:]}{result.stderr}")

    return shared_build("dist", build)
