"""A worker in a second virtual environment that has only numpy installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_contracts.requests import Operation, StageRequest
from edge_core.host import Route, start_worker

from .conftest import WORKERS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def numpy_only_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no edge package, no psutil) with numpy installed by pip."""
    root = tmp_path_factory.mktemp("numpy-venv")
    # no pip of its own (this interpreter's installs into it), nothing byte-compiled
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   capture_output=True)
    python = root / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-compile", "numpy"],
        check=True,
        capture_output=True,
    )
    return python


def test_worker_runs_in_a_numpy_only_venv_from_staged_packages(numpy_only_venv, monkeypatch):
    monkeypatch.syspath_prepend(str(WORKERS))
    route = Route(
        "numpy-venv", str(numpy_only_venv), "edge_test_workers:echo", stage=("edge_test_workers",)
    )
    assert route.foreign
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    client = start_worker(route, generation=7, env=env, shm_threshold=1024)
    try:
        report = client.load({})
        assert report["prefix"] == str(numpy_only_venv.parent.parent)
        assert not report["has_edge_core"]
        assert report["modules"] == []
        staged = Path(report["edge_contracts"]).parent.parent
        assert staged.name.startswith("edge-stage-")
        assert "numpy" in client.hello["versions"]
        x = np.arange(100_000, dtype=np.float64)
        request = StageRequest("r1", "s0", 0, 7, Operation.RUN, params={"scale": 3})
        np.testing.assert_array_equal(
            client.submit(request, {"x": x}).result(timeout=20)["x"], x * 3
        )
    finally:
        outcome = client.retire()
    assert outcome.verified
    assert not staged.exists()
