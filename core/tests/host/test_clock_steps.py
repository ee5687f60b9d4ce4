"""A step of the wall clock (NTP/chrony step, VM resume, ``settimeofday``) changes no identity.

psutil's ``create_time()`` and :func:`edge_contracts.owners.create_time_of` add the boot
time (``btime`` of ``/proc/stat``: the wall clock minus the time since boot) to the start
time since boot, so after a step every creation time read before it is off by the step.
Here the step is simulated by shifting what reads ``btime`` in this process — psutil's
``boot_time`` and :func:`edge_contracts.owners.boot_time` — by +/-1 s and by +1 h; each
test first checks that the shift reaches psutil's creation times, so it could fail.
Identities, owner records and owner tags count from boot and must not notice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import psutil
import pytest

from edge_contracts import owners
from edge_contracts.owners import Owner, owner_alive, owner_identity
from edge_contracts.shm import SegmentProducer, new_prefix, segment_owner
from edge_core.host import BootstrapRefused, start_worker
from edge_core.host.identity import ProcessIdentity, related_members, start_time
from edge_core.host.leftovers import find_leftovers, owner_tag, remove_leftovers
from edge_core.host.retire import ProcessTree

from .conftest import test_route

STEPS = [1.0, -1.0, 3600.0]

Step = Callable[[float], None]


@pytest.fixture
def step_clock(monkeypatch: pytest.MonkeyPatch) -> Step:
    """``step_clock(s)``: from now on this process reads a boot time ``s`` seconds later."""
    import psutil._pslinux as pslinux  # the module whose boot_time Process.create_time reads

    originals = (pslinux.boot_time, owners.boot_time)

    def step(seconds: float) -> None:
        def shifted() -> float:
            return float(originals[0]()) + seconds

        def shifted_owner() -> float | None:
            booted = originals[1]()
            return None if booted is None else booted + seconds

        monkeypatch.setattr(pslinux, "boot_time", shifted)
        monkeypatch.setattr(psutil, "boot_time", shifted)
        monkeypatch.setattr(owners, "boot_time", shifted_owner)

    return step


def _sleeper() -> subprocess.Popen[bytes]:
    """A process with a child, both sleeping, in a session of its own."""
    code = "import subprocess, sys, time\n" \
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n" \
           "time.sleep(60)\n"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _created_before_step(pid: int) -> float:
    return float(psutil.Process(pid).create_time())


@pytest.mark.parametrize("seconds", STEPS)
def test_a_live_tree_is_still_itself_and_retired_after_a_step(step_clock, seconds):
    root = _sleeper()
    try:
        identity = ProcessIdentity.of(root.pid)
        tree = ProcessTree(identity, root)
        deadline = time.monotonic() + 10
        while len(tree.capture()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        captured = tree.known
        assert len(captured) == 2  # the root and its child
        created = _created_before_step(root.pid)
        step_clock(seconds)
        # the step reaches psutil's creation times: a (pid, create_time) identity would break
        assert abs(psutil.Process(root.pid).create_time() - created - seconds) < 0.05
        assert ProcessIdentity.of(root.pid) == identity
        assert all(member.is_alive() for member in captured)
        assert related_members({identity}) | {identity} == captured
        assert set(tree.alive()) == set(captured)
        outcome = tree.retire(deadline_s=5.0)
        assert outcome.verified, outcome
        assert root.poll() is not None, "retirement reported a live process as gone"
        for member in captured:
            assert not psutil.pid_exists(member.pid) or (
                psutil.Process(member.pid).status() == psutil.STATUS_ZOMBIE
                or start_time(psutil.Process(member.pid)) != member.start_time
            )
    finally:
        if root.poll() is None:
            os.killpg(root.pid, signal.SIGKILL)
        root.wait()


@pytest.mark.parametrize("seconds", STEPS)
def test_a_worker_started_across_a_step_says_hello_and_retires(step_clock, seconds):
    # the controller reads the boot time `seconds` later than the worker does
    step_clock(seconds)
    client = start_worker(test_route("echo"), generation=1, hello_timeout_s=20)
    try:
        assert abs(client.hello["create_time"] - client.identity.create_time + seconds) < 0.05
        assert client.identity.matches(client.hello["start_time"])
        assert client.health().state == "ready"
    finally:
        outcome = client.retire(deadline_s=5.0)
    assert outcome.verified, outcome
    assert not client.identity.is_alive()


@pytest.mark.parametrize("seconds", STEPS)
def test_a_started_worker_survives_a_later_step(step_clock, seconds):
    client = start_worker(test_route("echo"), generation=1, hello_timeout_s=20)
    try:
        step_clock(seconds)
        assert client.identity.is_alive()
        assert ProcessIdentity.of(client.identity.pid) == client.identity
        assert client.health().state == "ready"
    finally:
        outcome = client.retire(deadline_s=5.0)
    assert outcome.verified, outcome
    assert not psutil.pid_exists(client.identity.pid) or not client.identity.is_alive()


def test_a_hello_with_another_start_time_is_refused():
    with pytest.raises(BootstrapRefused, match=r"hello\.start_time: must match"):
        start_worker(test_route("wrong_start_time"), generation=1, hello_timeout_s=20)


_LIVE_OWNER = textwrap.dedent(
    """
    import sys, tempfile, time
    from edge_contracts.shm import SegmentProducer
    from edge_core.host.leftovers import tagged_prefix
    lease = SegmentProducer(sys.argv[1]).lease(10)
    staged = tempfile.mkdtemp(prefix=tagged_prefix("stage"), dir=sys.argv[2])
    print(lease.segment, staged, flush=True)
    time.sleep(120)
    """)


@pytest.mark.parametrize("seconds", STEPS)
def test_a_live_owners_segments_and_directories_are_not_swept_after_a_step(
    step_clock, seconds, tmp_path
):
    live = subprocess.Popen([sys.executable, "-c", _LIVE_OWNER, new_prefix(), str(tmp_path)],
                            stdout=subprocess.PIPE)
    mine = SegmentProducer(new_prefix())
    lease = mine.lease(10)
    my_dir = tmp_path / f"edge-bundle-{owner_tag()}-abc"
    my_dir.mkdir()
    try:
        assert live.stdout is not None
        segment, staged = live.stdout.readline().decode().split()
        recorded = segment_owner(segment)
        assert recorded is not None and recorded.pid == live.pid
        created = _created_before_step(live.pid)
        step_clock(seconds)
        assert abs(owners.create_time_of(live.pid) - created - seconds) < 0.05  # type: ignore[operator]
        assert owner_alive(recorded) and owner_alive(owner_identity())
        assert owner_alive(segment_owner(lease.segment))  # type: ignore[arg-type]
        listed = {item.path for item in find_leftovers(tmp_path)}
        assert segment not in listed and lease.segment not in listed
        assert staged not in listed and str(my_dir) not in listed
        removed = {item.path for item in remove_leftovers(tmp_path)}
        assert not removed & {segment, lease.segment, staged, str(my_dir)}
        assert os.path.isdir(staged) and my_dir.is_dir()
        assert segment_owner(segment) == recorded
    finally:
        live.kill()
        live.wait()
        mine.close()
    # the owner is gone now: its segment and directory are swept, the step notwithstanding
    listed = {item.path for item in remove_leftovers(tmp_path)}
    assert {segment, staged} <= listed
    assert segment_owner(segment) is None and not os.path.exists(staged)


@pytest.mark.parametrize("seconds", STEPS)
def test_a_dead_or_reused_pid_is_still_told_apart_after_a_step(step_clock, seconds, tmp_path):
    me = ProcessIdentity.of(os.getpid())
    start = owner_identity().start_time
    tag = owner_tag()
    pid, centis = tag[1:].split("-b")
    reused = tmp_path / f"edge-stage-o{pid}-b{int(centis) - 1000}-abc"  # same PID, earlier
    dead = tmp_path / "edge-stage-o999999999-b1-abc"
    mine = tmp_path / f"edge-stage-{tag}-abc"
    for path in (reused, dead, mine):
        path.mkdir()
    step_clock(seconds)
    assert owner_tag() == tag
    assert not ProcessIdentity(me.pid, me.start_time - 10.0).is_alive()
    assert not ProcessIdentity(me.pid, me.start_time + 10.0).is_alive()
    assert not owner_alive(Owner(me.pid, start - 10.0, 0.0))
    assert not owner_alive(Owner(999_999_999, start, 0.0))
    listed = {os.path.basename(item.path) for item in find_leftovers(tmp_path)
              if item.kind != "segment"}
    assert listed == {reused.name, dead.name}


def test_an_owner_record_without_a_start_time_is_judged_by_its_creation_time():
    me = owner_identity()
    assert me.start_time > 0.0 and me.create_time > 0.0
    # A creation time is only comparable with one read at about the same moment: this VM's
    # wall clock is stepped against its boot clock (its btime moved by 21 s within an hour,
    # and by more than the tolerance within one `make test`), so the record is written now,
    # not from the identity cached when this process first needed it.
    created = owners.create_time_of(me.pid)
    assert created is not None and created > 0.0
    assert owner_alive(Owner(me.pid, 0.0, created))  # written by an older version
    assert not owner_alive(Owner(me.pid, 0.0, created - 100.0))
    assert owner_alive(Owner(me.pid, 0.0, 0.0))  # nothing tells it apart: kept


def test_without_proc_the_start_time_is_psutils_creation_time(monkeypatch):
    from edge_core.host import identity

    monkeypatch.setattr(identity, "START_TIME_BOOT_RELATIVE", False)
    proc = psutil.Process()
    assert start_time(proc) == proc.create_time()
    assert ProcessIdentity.of(proc.pid).start_time == proc.create_time()
    assert ProcessIdentity.of(proc.pid).is_alive()
