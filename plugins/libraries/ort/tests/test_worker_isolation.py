"""An ORT worker started from a folder holding an ``onnxruntime.py`` imports the real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_core.host import Route, start_worker
from edge_ort.options import WORKER_ENTRY


def test_an_onnxruntime_py_in_the_working_directory_is_not_run_by_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "onnxruntime.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        "__version__ = 'planted'\n"
    )
    monkeypatch.chdir(tmp_path)
    client = start_worker(Route.default("ort-cpu", WORKER_ENTRY), generation=1)
    try:
        versions = client.hello["versions"]
        assert versions["onnxruntime"] != "planted" and versions["onnxruntime"][0].isdigit()
        assert client.ping()["pid"] == client.identity.pid
    finally:
        assert client.retire().verified
    assert not marker.exists()
