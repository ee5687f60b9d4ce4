"""Worker lifecycle with real processes: refusals at bootstrap, death, garbage, retirement."""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from edge_contracts.headers import FrameHeader
from edge_contracts.protocol import OP_ACK
from edge_contracts.requests import Operation, StageRequest
from edge_contracts.shm import own_segment_names, segment_names
from edge_core.errors import WorkerLost
from edge_core.host import (
    BootstrapRefused,
    ProcessIdentity,
    ProtocolViolation,
    Route,
    RouteRefused,
    WorkerGone,
    start_worker,
)
from edge_core.host.bootstrap import WORKER_MAIN
from edge_core.host.identity import start_time

from .conftest import test_route


def request(rid: str, **params: object) -> StageRequest:
    return StageRequest(rid, "s0", 0, 1, Operation.RUN, params=params)


def test_wrong_token_is_refused_and_the_worker_retired():
    started = time.monotonic()
    with pytest.raises(BootstrapRefused, match=r"hello\.token: does not match"):
        start_worker(test_route("wrong_token"), generation=1, hello_timeout_s=20)
    assert time.monotonic() - started < 10


def test_wrong_protocol_version_is_refused():
    with pytest.raises(BootstrapRefused, match=r"header\.version"):
        start_worker(test_route("wrong_version"), generation=1, hello_timeout_s=20)


def test_failing_entry_is_refused_with_its_error():
    with pytest.raises(BootstrapRefused, match="cannot build the handler"):
        start_worker(test_route("broken_factory"), generation=1)


def test_missing_or_non_executable_interpreter_is_refused_at_construction(tmp_path):
    with pytest.raises(RouteRefused, match=r"route\.interpreter: does not exist"):
        Route("r", str(tmp_path / "python"), "m:f")
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(RouteRefused, match=r"route\.interpreter: is not executable"):
        Route("r", str(script), "m:f")
    with pytest.raises(RouteRefused, match=r"route\.interpreter: must be an absolute path"):
        Route("r", "python3", "m:f")
    with pytest.raises(RouteRefused, match=r"route\.entry"):
        Route.default("r", "not an entry")
    assert Route.default("r", "m:f").interpreter == sys.executable


def test_required_feature_the_worker_lacks_is_refused():
    with pytest.raises(BootstrapRefused, match="features"):
        start_worker(test_route("echo"), generation=1, features=["no-such-feature"])


def test_the_start_up_runs_without_the_cyclic_collector_and_the_worker_with_it(start):
    """Off while the worker imports its entry; frozen and on again once it said hello."""
    client = start()
    collector = client.load({})["gc"]
    assert collector["at_import"] is False
    assert collector["enabled"] is True
    assert collector["frozen"] > 0  # what the start-up made is never scanned again
    assert "gc.disable()" in WORKER_MAIN


def test_kill_9_mid_call_fails_every_call_within_two_seconds(start):
    client = start(shm_threshold=1024)
    calls = [client.submit(request(f"r{i}", sleep_s=30), {"x": np.ones(4096)}) for i in range(3)]
    time.sleep(0.2)
    killed_at = time.monotonic()
    os.kill(client.identity.pid, signal.SIGKILL)
    for call in calls:
        with pytest.raises(WorkerLost, match="killed by signal SIGKILL"):
            call.result(timeout=2.0)
    assert time.monotonic() - killed_at < 2.0
    health = client.health()
    assert health.state == "lost"
    assert "SIGKILL" in (health.reason or "")
    assert health.exit_status == -signal.SIGKILL
    with pytest.raises(WorkerGone):
        client.submit(request("late"))


def test_death_is_seen_even_when_a_grandchild_holds_the_channel(start):
    # The grandchild (SIGTERM-proof) holds the worker's end of the socket; the worker's
    # supervisor kills it when the worker dies, so it does not outlive the worker either.
    client = start("stubborn")
    grandchild = client.load({})["grandchild"]
    call = client.submit(request("r1", sleep_s=30))
    time.sleep(0.1)
    killed_at = time.monotonic()
    os.kill(client.identity.pid, signal.SIGKILL)
    with pytest.raises(WorkerLost):
        call.result(timeout=2.0)
    assert time.monotonic() - killed_at < 2.0
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and time.monotonic() < deadline:
        if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.01)
    assert time.monotonic() < deadline, "the supervisor left the grandchild running"
    outcome = client.retire(deadline_s=5.0)
    assert outcome.verified, outcome
    assert grandchild in {i.pid for i in outcome.tree}


def test_sigterm_proof_tree_is_killed_and_verified(start):
    client = start("stubborn")
    grandchild = client.load({})["grandchild"]
    # the grandchild forks its own child as soon as it runs: a worker forked by the warm
    # pool answers the load sooner than that, now and then
    deadline = time.monotonic() + 5.0
    while True:
        tree_before = {p.pid for p in psutil.Process(client.identity.pid).children(recursive=True)}
        if len(tree_before) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert grandchild in tree_before
    assert len(tree_before) == 2
    outcome = client.retire(deadline_s=4.0)
    assert outcome.verified, outcome
    assert outcome.escalation == "kill"
    assert outcome.elapsed_s < 4.0
    assert tree_before <= {i.pid for i in outcome.tree}
    for pid in tree_before:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_garbage_on_the_channel_is_a_protocol_violation(start):
    client = start("garbage")
    call = client.submit(request("r1"))
    with pytest.raises(ProtocolViolation, match=r"worker\.channel: refused frame"):
        call.result(timeout=5)
    assert client.health().state == "lost"
    assert "protocol violation" in (client.health().reason or "")


def test_an_event_of_no_known_kind_is_a_protocol_violation(start):
    client = start("bad_kind")
    call = client.submit(request("r1"))
    with pytest.raises(ProtocolViolation, match=r"frame\.meta: malformed event.*bogus"):
        call.result(timeout=5)
    assert client.health().state == "lost"
    assert "protocol violation" in (client.health().reason or "")


def test_retire_is_graceful_idempotent_and_leaves_no_segment(start):
    client = start(shm_threshold=1024, sealed_segments=False)  # named segments: listed
    client.submit(request("r1"), {"x": np.ones(10_000)}).result(timeout=10)
    kept = client.submit(request("r2"), {"x": np.ones(10_000)}).next(timeout=10)
    assert own_segment_names() != []
    first = client.retire()
    second = client.retire()
    assert first is second
    assert first.verified
    assert first.escalation == "graceful"
    assert own_segment_names() == []
    del kept
    assert client.health().state == "retired"
    with pytest.raises(WorkerGone):
        client.submit(request("r3"))


def test_a_declared_graceful_window_is_waited_in_full_before_the_deadline(start):
    # The handler needs 2 s to stop: the default grace (1 s of a 5 s deadline) escalates
    # to SIGTERM; a declared window of 6 s lets it leave by itself, and the deadline
    # still bounds what comes after.
    hurried = start("slow_close").retire(deadline_s=5.0)
    assert hurried.verified and hurried.escalation == "terminate", hurried
    patient = start("slow_close").retire(deadline_s=1.0, graceful_s=6.0)
    assert patient.verified and patient.escalation == "graceful", patient
    assert 1.9 < patient.elapsed_s < 7.0  # the window was waited, and bounded


def test_a_handler_that_exits_after_close_skips_the_interpreter_teardown(start, tmp_path):
    # The same atexit handler (1 s, then a file) runs for a plain handler and is skipped
    # for one that declares exit_after_close; both leave by themselves, verified.
    for factory, runs in (("at_exit", True), ("exit_at_once", False)):
        marker = tmp_path / f"{factory}.txt"
        client = start(factory)
        client.load({"marker": str(marker)})
        outcome = client.retire(deadline_s=5.0, graceful_s=5.0)
        assert outcome.verified and outcome.escalation == "graceful", outcome
        assert marker.exists() is runs, factory
        if not runs:
            assert outcome.elapsed_s < 1.0, outcome


def test_a_declared_window_does_not_take_the_time_of_the_signal_phases(start):
    # A tree that never leaves: the window passes, then SIGTERM and SIGKILL still get the
    # whole deadline (the kill phase its share) and the retirement is verified.
    outcome = start("stubborn").retire(deadline_s=1.0, graceful_s=0.5)
    assert outcome.verified and outcome.escalation == "kill", outcome
    assert outcome.elapsed_s < 1.5 + 1.0


def test_close_and_retire_from_two_threads_agree(start):
    client = start()
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(client.close())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes[0] is outcomes[1]
    assert outcomes[0].verified


def test_worker_crash_leaves_no_segment_behind(start):
    client = start(shm_threshold=1024, sealed_segments=False)  # named segments: listed
    kept = client.submit(request("r1"), {"x": np.ones(10_000)}).next(timeout=10)
    assert any(name.startswith(f"edge_{client.hello['shm_prefix']}") for name in segment_names())
    os.kill(client.identity.pid, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while client.health().state == "ready" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(n.startswith(f"edge_{client.hello['shm_prefix']}") for n in segment_names())
    kept.release()


def test_identity_is_captured_by_pid_and_start_time(start):
    client = start()
    proc = psutil.Process(client.identity.pid)
    assert client.identity == ProcessIdentity(proc.pid, start_time(proc))
    assert abs(client.identity.create_time - proc.create_time()) < 0.05  # for display
    # the session is led by the worker's supervisor, its parent
    assert os.getsid(client.identity.pid) == proc.ppid()


def test_a_child_in_its_own_session_is_retired_even_if_the_worker_dies_first(start):
    # Such a child is found only as a descendant of the live worker (the session scan
    # cannot see it): the tree must be captured at the hello, before anything can kill it.
    client = start("session_child")
    children = psutil.Process(client.identity.pid).children()
    assert len(children) == 1 and os.getsid(children[0].pid) != client.identity.pid
    root = psutil.Process(client.identity.pid)
    os.kill(root.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5  # dead (a zombie until reaped): the child is orphaned
    while time.monotonic() < deadline:
        try:
            if root.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:  # already reaped by the client's watchdog
            break
        time.sleep(0.01)
    # orphaned: re-parented to the supervisor (a subreaper), which kills it, or gone
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if children[0].ppid() != root.pid:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.01)
    outcome = client.retire(deadline_s=5.0)
    assert outcome.verified, outcome
    assert children[0].pid in {identity.pid for identity in outcome.tree}
    assert not children[0].is_running() or children[0].status() == psutil.STATUS_ZOMBIE


def test_hello_with_a_malformed_error_is_refused_as_a_bootstrap_error():
    with pytest.raises(BootstrapRefused, match=r"hello\.error: worker entry failed: 5"):
        start_worker(test_route("hello_error_not_object"), generation=1, hello_timeout_s=20)


@pytest.mark.parametrize("meta", [
    {"segments": 5}, {"segments": [["edge_x", "1"]]}, {"segments": [["edge_x", 1.5]]},
    {"unlink": [5]}, {"gone": "edge_x"}, {"gone": [1]}, {"segments": [["a", 1, 2]]},
])
def test_a_malformed_ack_never_kills_the_worker(start, meta):
    client = start(shm_threshold=1024)
    client._send(FrameHeader(OP_ACK, "", "", 0, client.generation, meta=meta))
    assert client.ping()["pid"] == client.identity.pid
    x = np.arange(4096, dtype=np.float64)  # through shared memory both ways
    result = client.submit(request("after-ack"), {"x": x}).result(timeout=20)
    np.testing.assert_array_equal(result["x"], x)
    assert client.health().state == "ready"


def test_an_output_beyond_the_channels_max_io_bytes_is_refused_before_its_payload(start):
    # The serve loop refuses such an output itself (EventTooLarge: test_output_size.py);
    # a worker that sends one anyway costs its channel, refused on the header alone: the
    # payload the header declares is never sent, and never waited for.
    client = start("oversize_event", max_io_bytes=64 * 1024)
    call = client.submit(request("big", alloc=1 << 20))
    with pytest.raises(ProtocolViolation, match=r"max_io_bytes 65536"):
        call.result(timeout=20)
    assert client.health().state == "lost"


@pytest.fixture
def many_files():
    """This process holding files up to past select's FD_SETSIZE (1024), as a server with
    many connections does: every descriptor opened next is numbered above 1100 (the soft
    open-file limit raised to 1600 for the test when lower)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1600:
        if hard != resource.RLIM_INFINITY and hard < 1600:
            pytest.skip(f"the open-file limit's hard bound is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1600, hard))
    held = [os.open(os.devnull, os.O_RDONLY)]
    while held[-1] < 1100:
        held.append(os.open(os.devnull, os.O_RDONLY))
    try:
        yield held
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_worker_starts_and_is_watched_when_its_channel_is_numbered_past_1024(
        many_files, start):
    """The hello was awaited with select(), which refuses a descriptor past FD_SETSIZE
    (ValueError): a stage restarted by a server holding over a thousand connections could
    not start. Its channel is polled now."""
    client = start()
    assert client.identity.pid > 0
    assert client.submit(request("r1"), {"x": np.ones(4)}).result(timeout=10) is not None
