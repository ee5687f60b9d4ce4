"""The ORT probe subprocesses (installed distributions, EP devices) get the probe allowlist
of the environment, stdin closed, and never import from the working directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edge_core.testing.probe_recorder import Recording, recording_command
from edge_ort.distributions import installed_distributions
from edge_ort.epdevices import query_ep_devices

SECRETS = {"EDGE_TEST_SECRET": "s3cr3t-edge", "AWS_SECRET_ACCESS_KEY": "s3cr3t-aws"}


@pytest.fixture
def recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recording:
    """An interpreter that records its start; secrets in the controller's environment."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EDGE_TEST_VENDOR_HOME", "/vendor")
    return recording_command(tmp_path / "bin", sys.executable, "python")


def _check(recording: Recording, declared: bool) -> None:
    env = recording.environ()
    assert not set(SECRETS) & set(env)
    assert env["PATH"] == os.environ["PATH"]
    assert ("EDGE_TEST_VENDOR_HOME" in env) is declared
    assert recording.stdin() == os.devnull


def test_the_distributions_probe_gets_the_allowlist(recording: Recording) -> None:
    found = installed_distributions(str(recording.command))
    assert found["onnxruntime"][0].isdigit()
    _check(recording, declared=False)
    installed_distributions(str(recording.command), env_names=("EDGE_TEST_VENDOR_*",))
    _check(recording, declared=True)


def test_the_device_listing_gets_the_allowlist(recording: Recording) -> None:
    listing = query_ep_devices(str(recording.command), env_names=("EDGE_TEST_VENDOR_HOME",))
    assert listing.error is None, listing.error
    assert "CPUExecutionProvider" in listing.available_providers
    _check(recording, declared=True)


def test_a_hostile_onnxruntime_or_numpy_in_the_working_directory_is_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    for module in ("numpy", "onnxruntime"):
        (tmp_path / f"{module}.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).write_text({module!r})\n"
            "__version__ = 'planted'\n")
    monkeypatch.chdir(tmp_path)
    listing = query_ep_devices(sys.executable)
    assert listing.error is None, listing.error
    assert listing.onnxruntime is not None and listing.onnxruntime[0].isdigit()
    assert not marker.exists()
