"""The QNN probe interpreter never imports a module from the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_qnn.probing import probe_qnn


def test_an_onnxruntime_py_in_the_working_directory_is_not_run_by_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "onnxruntime.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\nraise SystemExit(3)\n"
    )
    monkeypatch.chdir(tmp_path)
    report = probe_qnn("qnn")
    assert not marker.exists()
    assert report.available, report.reason
    assert report.runtime["onnxruntime"][0].isdigit()
