"""``edge run`` of the demo's page pipeline stopped or refused: what the user is told and left.

A real ``edge run`` (ort-cpu workers, verified bundle copies in the temporary directory)
sent SIGTERM while it serves must exit 143 with one line, its worker processes gone and
no staged directory of its own left behind (they carry its pid in their name:
:mod:`edge_core.host.leftovers`). A bundle with a tampered member is refused naming the
stage and the bundle, not only the member.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow


def _worker(process: psutil.Process) -> bool:
    """A worker: the child of its supervisor, the leader of its session (spawned or forked
    by the warm pool's zygote, whose command line a forked worker keeps)."""
    try:
        return process.pid != os.getsid(process.pid) == process.ppid()
    except (OSError, psutil.Error):
        return False


def test_sigterm_retires_the_workers_and_removes_the_bundle_copies(demo_build: Path) -> None:
    ocr = demo_build / "build" / "ocr"
    env = {k: v for k, v in os.environ.items() if k not in {"EDGE_DEBUG", "EDGE_PLUGINS"}}
    process = subprocess.Popen(
        [sys.executable, "-m", "edge_core.cli", "run", str(ocr / "pipeline.toml"),
         "--input", str(ocr / "page.png"), "--repeat", "1000"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        me = psutil.Process(process.pid)
        workers: list[psutil.Process] = []
        deadline = time.monotonic() + 240.0
        while len(workers) < 4:  # detect, classify, two recognisers: serving by now
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the pipeline never opened"
            time.sleep(0.2)
            workers = [p for p in me.children(recursive=True) if _worker(p)]
        staged = list(Path(tempfile.gettempdir()).glob(f"edge-*-o{process.pid}-*"))
        assert staged, "no verified bundle copy was staged"
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, stderr
    assert "edge: terminated (SIGTERM)" in stderr and "Traceback" not in stderr, stderr
    _, alive = psutil.wait_procs(workers, timeout=10.0)
    assert not alive, alive
    assert [p for p in staged if p.exists()] == []


def test_a_tampered_bundle_is_refused_naming_its_stage_and_bundle(
        demo_build: Path, tmp_path: Path) -> None:
    """The refusal names the stage and the bundle, not only the member that differs."""
    import json
    import shutil

    ocr = tmp_path / "ocr"
    shutil.copytree(demo_build / "build" / "ocr", ocr, ignore=shutil.ignore_patterns(
        "classify-qnn", "profile.json", "auto-run.json"))
    model = next((ocr / "classify").glob("*.onnx"))
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    env = {k: v for k, v in os.environ.items() if k not in {"EDGE_DEBUG", "EDGE_PLUGINS"}}
    done = subprocess.run(
        [sys.executable, "-m", "edge_core.cli", "run", str(ocr / "pipeline.toml"),
         "--input", str(ocr / "page.png"), "--json"],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    body = json.loads(done.stdout)
    assert body["ok"] is False and "DigestMismatch" in body["error"], body
    assert body["stage"].startswith("stages[classify] on ort-cpu, bundle "), body
    assert body["error"].startswith(body["stage"] + ": "), body
    assert str(ocr / "classify") in body["stage"], body
