"""Apart: a spinning controller thread moves itself off its worker's CPU, and only then.

Real processes, real CPU affinity: a child process stands in for the worker (what Apart
reads of it is its ``/proc`` stat, as of any process). Where this machine gives the test
one CPU, or no ``/proc``, the moves cannot happen and the tests say so by skipping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from edge_core.host import apart
from edge_core.host.apart import CHECK_EVERY_S, Apart, last_cpu

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or last_cpu("/proc/thread-self/stat") is None
    or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux thread affinity, /proc and two CPUs",
)

SLEEPER = "import sys; sys.stdin.read()"


@pytest.fixture
def mask() -> Iterator[set[int]]:
    """This thread's affinity mask, restored after the test whatever it did."""
    before = os.sched_getaffinity(0)
    yield before
    os.sched_setaffinity(0, before)


@pytest.fixture
def peer() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE)
    yield proc
    proc.communicate(timeout=30)


def _place(peer: subprocess.Popen[bytes], cpu: int, mask: set[int]) -> None:
    """Have ``peer`` run once on ``cpu`` (so it last ran there), then give it ``mask`` back."""
    os.sched_setaffinity(peer.pid, {cpu})
    deadline = time.monotonic() + 10
    while last_cpu(f"/proc/{peer.pid}/stat") != cpu:  # it moves when it runs: wake it
        assert time.monotonic() < deadline, "the peer never ran on its CPU"
        assert peer.stdin is not None
        peer.stdin.write(b"x")
        peer.stdin.flush()
        time.sleep(0.01)
    os.sched_setaffinity(peer.pid, mask)


def _here() -> int:
    cpu = last_cpu("/proc/thread-self/stat")
    assert cpu is not None
    return cpu


def test_a_thread_on_its_peers_cpu_moves_off_it_and_keeps_its_mask(mask, peer):
    _place(peer, min(mask), mask)
    # On a busy machine the scheduler may move either process by itself between the
    # placing and the check (which then rightly finds two CPUs): so the test tries again,
    # each time on the CPU the peer last ran on, and asks that a check that found one
    # CPU moved this thread off it.
    moved_off = []
    for _ in range(20):
        theirs = last_cpu(f"/proc/{peer.pid}/stat")
        assert theirs is not None
        os.sched_setaffinity(0, {theirs})  # this thread runs there now
        os.sched_setaffinity(0, mask)  # and stays there, free to run anywhere
        keep = Apart(peer.pid)
        if keep():
            assert keep.checks == 1 and keep.moves == 1
            assert os.sched_getaffinity(0) == mask
            moved_off.append(_here() != theirs)
            if moved_off[-1]:
                break
    assert any(moved_off), moved_off


def test_a_thread_on_another_cpu_stays(mask, peer):
    cpu = min(mask)
    _place(peer, cpu, mask)
    other = max(mask)
    os.sched_setaffinity(0, {other})
    try:
        keep = Apart(peer.pid)
        assert keep() is False
        assert keep.checks == 1 and keep.moves == 0
        assert _here() == other
    finally:
        os.sched_setaffinity(0, mask)


def test_checks_are_at_most_one_per_interval(mask, peer, monkeypatch):
    _place(peer, min(mask), mask)
    now = [1000.0]
    monkeypatch.setattr(apart.time, "monotonic", lambda: now[0])
    keep = Apart(peer.pid)
    keep()
    keep()
    assert keep.checks == 1
    now[0] += CHECK_EVERY_S
    keep()
    assert keep.checks == 2


def test_a_thread_that_may_use_only_its_peers_cpu_stays_there(mask, peer):
    cpu = min(mask)
    _place(peer, cpu, mask)
    os.sched_setaffinity(0, {cpu})
    keep = Apart(peer.pid)
    assert keep() is False
    assert keep.checks == 1 and keep.moves == 0
    assert os.sched_getaffinity(0) == {cpu} and _here() == cpu


def test_a_peer_that_is_gone_is_not_an_error(mask):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    keep = Apart(proc.pid)
    assert keep() is False
    assert keep.checks == 1 and keep.moves == 0
    assert os.sched_getaffinity(0) == mask


@pytest.mark.parametrize("bad", [0, -3, 1.5, "12", None, True])
def test_a_bad_peer_pid_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="peer_pid"):
        Apart(bad)


def test_last_cpu_reads_the_processor_field_past_an_odd_name(tmp_path):
    fields = ["S"] + ["0"] * 35 + ["7"] + ["0"] * 10
    stat = tmp_path / "stat"
    stat.write_bytes(b"123 (a) b (c)) " + " ".join(fields).encode())
    assert last_cpu(str(stat)) == 7
    stat.write_bytes(b"garbage")
    assert last_cpu(str(stat)) is None
    assert last_cpu(str(tmp_path / "missing")) is None
