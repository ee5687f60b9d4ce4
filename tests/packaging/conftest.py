"""The built wheels and sdists of every distribution, built once per test session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .distributions import DIRS, ROOT


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the wheel and the sdist of every distribution in ``DIRS``."""
    out = tmp_path_factory.mktemp("dist")
    for directory in DIRS:
        result = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
             str(ROOT / directory)],
            capture_output=True, text=True, timeout=600, check=False)
        assert result.returncode == 0, f"{directory}: {result.stdout[-2000:]}{result.stderr}"
    return out
