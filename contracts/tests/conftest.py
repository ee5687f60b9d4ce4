"""Every contracts test fails if it leaves a file descriptor or an edge shm segment behind.

Only segments of prefixes this process handed out count (``own_prefixes``), so the
check passes while other edge programs run on the machine.

Standard library only (edge-contracts sits below edge-core, so its tests do not use
edge_core.testing); the checks read /proc and /dev/shm and are skipped where those are
missing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROC_FDS = Path("/proc/self/fd")
DEV_SHM = Path("/dev/shm")


def _fds() -> set[int]:
    return {int(name) for name in os.listdir(PROC_FDS)} if PROC_FDS.is_dir() else set()


def _segments() -> set[str]:
    if not DEV_SHM.is_dir():
        return set()
    from edge_contracts.shm import own_segment_names

    return set(own_segment_names())


@pytest.fixture(autouse=True)
def no_leaked_fds_or_segments() -> Iterator[None]:
    fds, segments = _fds(), _segments()
    yield
    deadline = time.monotonic() + 2.0
    while True:
        new_fds = {fd for fd in _fds() - fds if os.path.exists(f"/proc/self/fd/{fd}")}
        new_segments = _segments() - segments
        if not (new_fds or new_segments) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    targets = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in new_fds if PROC_FDS.is_dir()}
    assert not targets, f"test leaked file descriptors: {targets}"
    assert not new_segments, f"test leaked shared-memory segments: {sorted(new_segments)}"
