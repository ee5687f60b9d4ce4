"""The QNN probe interpreter never imports a module from the working directory, and gets
the probe allowlist of the environment with stdin closed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edge_core.testing.probe_recorder import recording_command
from edge_qnn.probing import PYTHON_ENV, probe_qnn


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


SECRETS = {"EDGE_TEST_SECRET": "s3cr3t-edge", "AWS_SECRET_ACCESS_KEY": "s3cr3t-aws"}


def test_the_probe_interpreter_gets_the_allowlist_not_the_controllers_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recording = recording_command(tmp_path / "bin", sys.executable, "python")
    monkeypatch.setenv(PYTHON_ENV, str(recording.command))
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ADSP_LIBRARY_PATH", "/dsp/libs")
    report = probe_qnn("qnn")
    assert report.available, report.reason
    env = recording.environ()
    assert not set(SECRETS) & set(env)
    assert env["ADSP_LIBRARY_PATH"] == "/dsp/libs"  # declared in PROBE_ENV_NAMES
    assert env["PATH"] == os.environ["PATH"]
    assert recording.stdin() == os.devnull
