"""Leak checks for tests: child processes, edge shared-memory segments, open descriptors.

:func:`snapshot` records what the current process holds; :func:`leaks_since` waits a
short grace period for things that are being torn down and then lists whatever is new.
:func:`no_leaks` is a pytest fixture body: use it from a ``conftest.py`` as::

    from edge_core.testing.leaks import no_leaks as _no_leaks
    no_leaks = pytest.fixture(autouse=True)(_no_leaks)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import attrs
import psutil

from edge_contracts.shm import segment_names

__all__ = ["LeakReport", "Snapshot", "leaks_since", "no_leaks", "snapshot"]

DEFAULT_GRACE_S = 2.0
"""How long :func:`leaks_since` waits for processes and descriptors still closing."""


@attrs.frozen
class Snapshot:
    """What this process held at one moment."""

    children: frozenset[tuple[int, float]]
    segments: frozenset[str]
    fds: frozenset[int]


@attrs.frozen
class LeakReport:
    """What appeared since a snapshot and is still there after the grace period."""

    children: tuple[str, ...]
    segments: tuple[str, ...]
    fds: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.children or self.segments or self.fds)

    def describe(self) -> str:
        """One line per kind of leak, in the ``field: reason: value`` form."""
        lines = []
        if self.children:
            lines.append(f"children: processes left running: {list(self.children)}")
        if self.segments:
            lines.append(f"shm: segments left in /dev/shm: {list(self.segments)}")
        if self.fds:
            lines.append(f"fds: descriptors left open: {list(self.fds)}")
        return "\n".join(lines)


def _children() -> frozenset[tuple[int, float]]:
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            found.add((child.pid, child.create_time()))
        except psutil.NoSuchProcess:
            continue
    return frozenset(found)


def _fds() -> frozenset[int]:
    """Open descriptors, leaving out the one the listing itself used (closed by now)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        found.add(int(name))
    return frozenset(found)


def _describe_fd(fd: int) -> str:
    try:
        return f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}"
    except OSError:
        return str(fd)


def _describe_child(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return f"{pid} {proc.status()} {' '.join(proc.cmdline())[:120]}"
    except psutil.Error:
        return str(pid)


def snapshot() -> Snapshot:
    """Record the current children, edge segments and open descriptors."""
    return Snapshot(_children(), frozenset(segment_names()), _fds())


def leaks_since(before: Snapshot, grace_s: float = DEFAULT_GRACE_S) -> LeakReport:
    """List what is new since ``before``, after waiting up to ``grace_s`` for it to go."""
    deadline = time.monotonic() + grace_s
    while True:
        now = snapshot()
        children = now.children - before.children
        segments = now.segments - before.segments
        fds = now.fds - before.fds
        if not (children or segments or fds) or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return LeakReport(
        children=tuple(_describe_child(pid) for pid, _ in sorted(children)),
        segments=tuple(sorted(segments)),
        fds=tuple(_describe_fd(fd) for fd in sorted(fds)),
    )


def no_leaks() -> Iterator[None]:
    """Pytest fixture body: fail the test if it leaves a process, segment or descriptor."""
    before = snapshot()
    yield
    report = leaks_since(before)
    if report:
        raise AssertionError("test leaked resources:\n" + report.describe())
