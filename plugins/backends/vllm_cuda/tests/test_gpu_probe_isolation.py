"""``nvidia-smi`` runs as a probe: the allowlisted environment, stdin closed, bounded.

No NVIDIA driver here: the ``nvidia-smi`` run is a stand-in script printing one GPU in the
query's format, started through a recording command that saves what the process got.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge_core.testing.probe_recorder import recording_command
from edge_vllm_cuda.gpus import probe_gpus

SECRETS = {"EDGE_TEST_SECRET": "s3cr3t-edge", "AWS_SECRET_ACCESS_KEY": "s3cr3t-aws"}
ONE_GPU = "0, GPU-00000000-1111-2222-3333-444455556666, Stand-in GPU, 1024, 570.86.15"


def test_nvidia_smi_gets_the_allowlist_not_the_controllers_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in = tmp_path / "stand-in-nvidia-smi"
    stand_in.write_text(f"#!/bin/sh\necho '{ONE_GPU}'\n")
    stand_in.chmod(0o755)
    recording = recording_command(tmp_path / "bin", stand_in, "nvidia-smi")
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    probe = probe_gpus(str(recording.command), use_nvml=False)
    assert probe.source == "nvidia-smi" and [g.name for g in probe.gpus] == ["Stand-in GPU"]
    env = recording.environ()
    assert not set(SECRETS) & set(env)
    assert env["PATH"] == os.environ["PATH"]
    assert recording.stdin() == os.devnull


def test_a_hanging_nvidia_smi_is_bounded(tmp_path: Path) -> None:
    stand_in = tmp_path / "nvidia-smi"
    stand_in.write_text("#!/bin/sh\nexec sleep 60\n")
    stand_in.chmod(0o755)
    probe = probe_gpus(str(stand_in), use_nvml=False, timeout_s=1.0)
    assert probe.gpus == () and "nvidia-smi: TimeoutExpired" in probe.why_none()
