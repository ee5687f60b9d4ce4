"""The device-initialisation lock, contended by two real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_core.host.devlock import DeviceLock
from edge_core.host.errors import DeviceLockTimeout

HOLDER = r"""
import sys, time
from pathlib import Path
from edge_core.host.devlock import DeviceLock
with DeviceLock(sys.argv[1], directory=Path(sys.argv[2])):
    print("held", flush=True)
    sys.stdin.read()
"""


def _holder(device: str, directory: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, device, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.close()
    proc.wait(timeout=5)
    proc.stdout.close()


def test_lock_wait_is_bounded_and_names_the_holder(tmp_path):
    holder = _holder("npu:0", tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(DeviceLockTimeout) as info:
            DeviceLock("npu:0", timeout_s=0.3, directory=tmp_path).acquire()
        assert 0.25 <= time.monotonic() - started < 1.5
        assert info.value.holder_pid == holder.pid
        assert str(holder.pid) in str(info.value)
    finally:
        _stop(holder)


def test_lock_is_acquired_once_the_holder_lets_go(tmp_path):
    holder = _holder("npu:0", tmp_path)
    _stop(holder)
    with DeviceLock("npu:0", timeout_s=1.0, directory=tmp_path) as lock:
        assert lock.held
    assert not lock.held


def test_lock_of_a_killed_holder_is_free(tmp_path):
    holder = _holder("npu:0", tmp_path)
    holder.kill()
    holder.wait()
    assert holder.stdin is not None
    assert holder.stdout is not None
    holder.stdin.close()
    holder.stdout.close()
    with DeviceLock("npu:0", timeout_s=1.0, directory=tmp_path):
        pass


def test_locks_of_different_devices_do_not_contend(tmp_path):
    holder = _holder("npu:0", tmp_path)
    try:
        with DeviceLock("npu:1", timeout_s=0.2, directory=tmp_path):
            pass
    finally:
        _stop(holder)


def test_worker_initialisation_waits_for_the_device_lock(start, tmp_path, monkeypatch):
    import edge_core.host.devlock as devlock

    monkeypatch.setattr(devlock, "lock_directory", lambda: tmp_path)
    client = start()
    holder = _holder("npu:7", tmp_path)
    try:
        with pytest.raises(DeviceLockTimeout, match=f"held by pid {holder.pid}"):
            client.initialise({}, {}, device_id="npu:7", lock_timeout_s=0.2)
    finally:
        _stop(holder)
    loaded, warmed = client.initialise({"a": 1}, {}, device_id="npu:7", lock_timeout_s=2)
    assert loaded["loaded"] == {"a": 1}
    assert warmed["placement"]
    with DeviceLock("npu:7", timeout_s=0.2, directory=tmp_path):
        pass
