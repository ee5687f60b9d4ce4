"""Leak checks for tests: what the test's own process made and left behind.

Child processes, edge shared-memory segments, open descriptors and staged directories.
:func:`snapshot` records what the current process holds; :func:`leaks_since` waits a
short grace period for things that are being torn down and then lists whatever is new.
The warm pool's zygotes and their control sockets (:mod:`edge_core.host.warm_pool`) are
the pool's, long-lived, and left out. The check is scoped to this process, so it passes
while other edge-core programs run on the machine: processes are this process's
descendants; segments are new ones of a prefix this process handed out
(:func:`edge_contracts.shm.own_prefixes`) or created by this process or a live
descendant (the owner in the segment header); files are the staged directories in the
temporary directory tagged with this process's identity
(:mod:`edge_core.host.leftovers`); descriptors are this process's. A segment made under
its own prefix by a child that has already exited is not attributed (its owner is gone:
the next sweep removes it).

:func:`no_leaks` is a pytest fixture body: use it from a ``conftest.py`` as::

    from edge_core.testing.leaks import no_leaks as _no_leaks
    no_leaks = pytest.fixture(autouse=True)(_no_leaks)
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator

import attrs
import psutil

from edge_contracts.shm import own_prefixes, segment_names, segment_owner
from edge_core.host.identity import start_time
from edge_core.host.warm_pool import pool_descriptors, pool_processes

__all__ = ["LeakReport", "Snapshot", "descendants", "leaks_since", "no_leaks", "snapshot"]

DEFAULT_GRACE_S = 2.0
"""How long :func:`leaks_since` waits for processes and descriptors still closing."""


@attrs.frozen
class Snapshot:
    """What this process held at one moment."""

    children: frozenset[tuple[int, float]]
    segments: frozenset[str]
    fds: frozenset[int]
    files: frozenset[str] = frozenset()


@attrs.frozen
class LeakReport:
    """What appeared since a snapshot and is still there after the grace period."""

    children: tuple[str, ...]
    segments: tuple[str, ...]
    fds: tuple[str, ...]
    files: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.children or self.segments or self.fds or self.files)

    def describe(self) -> str:
        """One line per kind of leak, in the ``field: reason: value`` form."""
        lines = []
        if self.children:
            lines.append(f"children: processes left running: {list(self.children)}")
        if self.segments:
            lines.append(f"shm: segments left in /dev/shm: {list(self.segments)}")
        if self.fds:
            lines.append(f"fds: descriptors left open: {list(self.fds)}")
        if self.files:
            lines.append(f"files: staged directories left: {list(self.files)}")
        return "\n".join(lines)


def descendants() -> list[psutil.Process]:
    """This process's descendants but the warm pool's zygotes (long-lived, the pool's own).

    What a test counts as the processes it started: a zygote (:mod:`edge_core.host.
    warm_pool`) is started by the first start of its kind and outlives the test; the
    supervisors and workers it forked are counted (they are its children, not this
    process's, and ``psutil`` finds them below it).
    """
    pool = pool_processes()
    return [child for child in psutil.Process().children(recursive=True) if child.pid not in pool]


def _children() -> frozenset[tuple[int, float]]:
    found = set()
    for child in descendants():
        try:
            found.add((child.pid, start_time(child)))  # never moved by wall-clock steps
        except psutil.NoSuchProcess:
            continue
    return frozenset(found)


def _fds() -> frozenset[int]:
    """Open descriptors, leaving out the one the listing itself used (closed by now)."""
    found = set()
    pool = pool_descriptors()  # the warm pool's control sockets: the pool's own
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        if int(name) not in pool:
            found.add(int(name))
    return frozenset(found)


def _describe_fd(fd: int) -> str:
    try:
        return f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}"
    except OSError:
        return str(fd)


def _describe_child(pid: int) -> str:
    """Describe a leftover process: state, command line, and its parents up to the test."""
    try:
        proc = psutil.Process(pid)
        text = f"{pid} {proc.status()} {' '.join(proc.cmdline())[:120]}"
        chain: list[str] = []
        for parent in proc.parents():  # who made, or adopted, the leftover
            if parent.pid == os.getpid():
                break
            chain.append(f"{parent.pid}:{parent.name()}")
    except psutil.Error:
        return str(pid)
    return f"{text} (parents below the test: {chain or 'none, the test itself'})"


def _files() -> frozenset[str]:
    """Staged directories in the temporary directory tagged with this process's identity."""
    from edge_core.host.leftovers import TEMP_KINDS, owner_tag

    tag = owner_tag()
    starts = tuple(f"edge-{kind}-{tag}-" for kind in TEMP_KINDS)
    try:
        names = os.listdir(tempfile.gettempdir())
    except OSError:  # pragma: no cover
        return frozenset()
    return frozenset(os.path.join(tempfile.gettempdir(), n) for n in names if n.startswith(starts))


def _ours(names: frozenset[str], children: frozenset[tuple[int, float]]) -> frozenset[str]:
    """The segments among ``names`` that this process or a live descendant made."""
    prefixes = own_prefixes()
    pids = {os.getpid()} | {pid for pid, _ in children}
    mine = set()
    for name in names:
        if name.split("_")[1:2] and name.split("_")[1] in prefixes:
            mine.add(name)
            continue
        owner = segment_owner(name)
        if owner is not None and owner.pid in pids:
            mine.add(name)
    return frozenset(mine)


def snapshot() -> Snapshot:
    """Record the current children, edge segments, open descriptors and staged directories."""
    return Snapshot(_children(), frozenset(segment_names()), _fds(), _files())


def leaks_since(before: Snapshot, grace_s: float = DEFAULT_GRACE_S) -> LeakReport:
    """List what is new since ``before``, after waiting up to ``grace_s`` for it to go."""
    deadline = time.monotonic() + grace_s
    while True:
        now = snapshot()
        children = now.children - before.children
        segments = _ours(now.segments - before.segments, now.children)
        fds = now.fds - before.fds
        files = now.files - before.files
        if not (children or segments or fds or files) or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return LeakReport(
        children=tuple(_describe_child(pid) for pid, _ in sorted(children)),
        segments=tuple(sorted(segments)),
        fds=tuple(_describe_fd(fd) for fd in sorted(fds)),
        files=tuple(sorted(files)),
    )


def no_leaks() -> Iterator[None]:
    """Pytest fixture body: fail the test if it leaves something of its own behind.

    A process, a segment, a descriptor or a staged directory (see the module doc).
    """
    before = snapshot()
    yield
    report = leaks_since(before)
    if report:
        raise AssertionError("test leaked resources:\n" + report.describe())
