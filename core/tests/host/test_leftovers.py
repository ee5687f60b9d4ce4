"""Nothing outlives the controller: supervisor and worker clean up after a dead controller,
owner-tagged leftovers are swept by the next process (never a live owner's), and a
normal exit without close() cleans up too. Every controller here is a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from edge_contracts.shm import SegmentProducer, new_prefix, segment_names, segment_owner
from edge_core.cli import main as edge_main
from edge_core.host.leftovers import find_leftovers, remove_leftovers

from .conftest import WORKERS

# The sweep is machine-wide: this module's tests kill, sweep and count segments and
# staged folders, so a parallel run keeps them on one worker (the root conftest.py).
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc"),
              pytest.mark.xdist_group("leftovers")]

# A controller: starts a worker, leaves segments on both sides (a retained output and a
# pooled input), stages a package directory, prints what it made, then waits or exits.
CONTROLLER = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from edge_contracts.requests import Operation, StageRequest
    from edge_core.host import Route, start_worker
    from edge_core.host.staging import stage_packages

    route = Route.default("echo", "edge_test_workers:echo", python_path=(sys.argv[1],))
    sealed = sys.argv[3] == "sealed"
    client = start_worker(route, generation=1, shm_threshold=1024, sealed_segments=sealed)
    done = client.submit(StageRequest("r1", "s", 0, 1, Operation.RUN), {"x": np.ones(4096)})
    kept = done.next(timeout=20)  # the worker's output segment stays leased
    # (the controller's input segment is pooled for reuse: it stays too)
    staged = stage_packages(())
    print(json.dumps({
        "supervisor": client._tree.root.pid,
        "worker": client.identity.pid,
        "prefixes": [client.hello["shm_prefix"], client._producer.prefix],
        "staged": str(staged),
    }), flush=True)
    if sys.argv[2] == "exit":
        sys.exit(0)  # no close(): the atexit hook and finalisers must clean up
    time.sleep(120)
    """
)


def _controller(
    mode: str, segments: str = "named"
) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(WORKERS), mode, segments], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.stdout.close()
    assert line, "the controller did not start"
    return proc, json.loads(line)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _ours(made: dict[str, object]) -> list[str]:
    prefixes = made["prefixes"]
    assert isinstance(prefixes, list)
    return [n for n in segment_names() if any(n.startswith(f"edge_{p}_") for p in prefixes)]


def _wait(predicate: object, timeout_s: float = 10.0) -> bool:
    assert callable(predicate)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_sealed_segments_of_a_killed_controller_never_reach_dev_shm():
    proc, made = _controller("wait", "sealed")
    assert not _ours(made)  # memfd segments: no names to leave behind
    worker = int(made["worker"])
    maps = Path(f"/proc/{worker}/maps").read_text()
    assert "/memfd:edge_" in maps  # the worker maps the controller's sealed input
    proc.kill()
    proc.wait()
    assert _wait(lambda: _gone(int(made["supervisor"])) and _gone(worker))
    assert not _ours(made)
    remove_leftovers()


def test_a_killed_controller_leaves_nothing_once_its_supervisor_is_done():
    # named segments (sealed_segments=False): the supervisor unlinks them
    proc, made = _controller("wait")
    assert len(_ours(made)) >= 2
    assert Path(str(made["staged"])).exists()
    proc.kill()
    proc.wait()
    assert _wait(lambda: _gone(int(made["supervisor"])) and _gone(int(made["worker"])))
    assert _wait(lambda: not _ours(made))
    # the staged directory was not the supervisor's (not its worker's): the next
    # edge-core process removes it, its owner being dead. Any edge process starting
    # meanwhile (another test of a parallel run) sweeps it by the same rule: listed if
    # still there after the listing, else gone already.
    listed = any(item.path == made["staged"] for item in find_leftovers())
    assert listed or not Path(str(made["staged"])).exists()
    remove_leftovers()
    assert not Path(str(made["staged"])).exists()


def test_a_worker_whose_controller_and_supervisor_died_removes_the_controllers_segments():
    proc, made = _controller("wait")
    supervisor, worker = int(made["supervisor"]), int(made["worker"])
    os.kill(supervisor, signal.SIGKILL)  # first, so that it cannot clean up
    proc.kill()
    proc.wait()
    # the worker sees its channel end (no shutdown), unlinks the controller's segments
    # and its own, and exits
    assert _wait(lambda: _gone(worker))
    assert not _ours(made)
    remove_leftovers()


def test_the_next_process_sweeps_a_dead_owners_segments_and_never_a_live_ones():
    # Everything SIGKILLed at once: nobody could clean up. Any edge process starting
    # meanwhile (another test of a parallel run) sweeps the dead owners' segments by the
    # same rule, and may take them all before they are listed here: tried again then.
    swept_first = 0
    for _ in range(3):
        proc, made = _controller("wait")
        for pid in (int(made["supervisor"]), int(made["worker"]), proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.wait()
        worker = int(made["worker"])
        assert _wait(lambda: _gone(worker))  # noqa: B023 (called before the next round)
        left = _ours(made)
        if left:
            break
        swept_first += 1
        remove_leftovers()  # the staged directory
    assert left, f"expected segments of the killed processes ({swept_first} swept first)"
    owners = {segment_owner(name) for name in left}
    assert None not in owners
    # a live owner's segment, made by a process that keeps running
    live = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            """
            import sys, time
            from edge_contracts.shm import SegmentProducer
            lease = SegmentProducer(sys.argv[1]).lease(10)
            print(lease.segment, flush=True)
            time.sleep(120)
            """), prefix := new_prefix()],
        stdout=subprocess.PIPE,
    )
    try:
        assert live.stdout is not None
        live_segment = live.stdout.readline().decode().strip()
        assert segment_owner(live_segment).pid == live.pid  # type: ignore[union-attr]
        listed = {item.path for item in find_leftovers() if item.kind == "segment"}
        # Any edge process starting meanwhile (another test of a parallel run, another
        # program on the machine) sweeps dead owners' segments too: those still there
        # must be listed; those gone were swept by the same rule.
        still = set(left) & set(_ours(made))
        assert still <= listed and live_segment not in listed
        remove_leftovers()
        assert not _ours(made)
        assert live_segment in segment_names(prefix)
        assert Path(str(made["staged"])).exists() is False
    finally:
        live.kill()
        live.wait()
        live.stdout.close()  # type: ignore[union-attr]
    remove_leftovers()  # its owner is gone now
    assert segment_names(prefix) == []


def test_a_normal_exit_without_close_leaves_nothing():
    proc, made = _controller("exit")
    assert proc.wait(timeout=30) == 0
    assert _gone(int(made["supervisor"])) and _gone(int(made["worker"]))
    assert not _ours(made)
    # stage_packages' caller did not remove its directory: swept as a dead owner's
    assert [i.path for i in remove_leftovers() if i.kind == "stage"] == [made["staged"]]


def test_edge_cleanup_reports_and_removes(capsys, tmp_path):
    producer = SegmentProducer(new_prefix())
    try:
        producer.lease(10)
        assert edge_main(["cleanup", "--dry-run", "--json"]) == 0  # a live owner: nothing
        report = json.loads(capsys.readouterr().out)
        assert report == {"ok": True, "dry_run": True, "removed": [], "left": []}
    finally:
        producer.close()
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "from edge_core.host.staging import stage_packages; print(stage_packages(()))"],
        stdout=subprocess.PIPE,
    )
    out, _ = proc.communicate(timeout=30)
    staged = out.decode().strip()
    assert edge_main(["cleanup", "--dry-run", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [item["path"] for item in report["left"]] == [staged]
    assert Path(staged).exists()
    assert edge_main(["cleanup"]) == 0
    assert f"removed stage {staged}" in capsys.readouterr().out
    assert not Path(staged).exists()


def test_a_tag_is_judged_by_pid_and_start_time(tmp_path):
    from edge_core.host.leftovers import owner_tag

    mine = tmp_path / f"edge-bundle-{owner_tag()}-abc"
    pid, centis = owner_tag()[1:].split("-b")
    reused = tmp_path / f"edge-stage-o{pid}-b{int(centis) - 1000}-abc"  # same PID, older
    gone = tmp_path / "edge-stage-o999999999-1-abc"
    other = tmp_path / "edge-stage-not-a-tag"
    for path in (mine, reused, gone, other):
        path.mkdir()
    listed = {Path(item.path).name for item in find_leftovers(tmp_path) if item.kind != "segment"}
    assert listed == {reused.name, gone.name}
    removed = {Path(item.path).name for item in remove_leftovers(tmp_path)
               if item.kind != "segment"}
    assert removed == {reused.name, gone.name}
    assert mine.exists() and other.exists() and not reused.exists() and not gone.exists()


def test_a_forked_child_that_exits_does_not_retire_its_parents_workers(start):
    from edge_core.host.exit_cleanup import retire_all

    client = start()
    pid = os.fork()
    if pid == 0:  # what the child's atexit hook runs when it exits normally
        try:
            retire_all()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert client.health().ready
    assert client.ping(timeout_s=10)["pid"] == client.identity.pid
