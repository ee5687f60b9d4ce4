"""Who reads the channel: the waiting caller (leader/follower), else the background reader."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edge_contracts.requests import EventKind, Operation, StageRequest
from edge_contracts.worker_protocol import BootConfig
from edge_core.host import BootstrapRefused, start_worker
from edge_core.host.reading import LINGER_S

from .conftest import test_route


def request(rid: str, **params: object) -> StageRequest:
    return StageRequest(rid, "s0", 0, 1, Operation.RUN, params=params)


@pytest.mark.parametrize("spin_us", [0, 200])
def test_many_threads_waiting_at_once_each_get_their_own_results(start, spin_us):
    client = start(spin_us=spin_us)
    failures: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            for j in range(40):
                x = np.full(8, float(index * 1000 + j))
                params = {"sleep_s": 0.002} if j % 10 == 0 else {}
                out = client.submit(request(f"t{index}-{j}", **params), {"x": x}).result(
                    timeout=20
                )
                np.testing.assert_array_equal(out["x"], x)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures[0]
    assert client.health().in_flight == 0


def test_frames_nobody_waits_for_are_read_by_the_background_reader(start):
    client = start()
    client.submit(request("r1"), {"x": np.arange(3.0)})
    deadline = time.monotonic() + 5
    while client.in_flight("r1") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not client.in_flight("r1")  # its terminal event was read, nobody waiting


def test_background_reader_resumes_after_callers_stop_waiting(start):
    client = start()
    for i in range(20):  # callers lead; the background reader parks
        client.submit(request(f"w{i}"), {"x": np.arange(2.0)}).result(timeout=10)
    time.sleep(LINGER_S * 3)
    client.submit(request("late"), {"x": np.arange(2.0)})
    deadline = time.monotonic() + 5
    while client.in_flight("late") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not client.in_flight("late")


def test_cancel_reaches_a_caller_that_is_reading_the_socket(start):
    # The worker is stuck in its handler, so nothing will arrive on the socket: only the
    # nudge can end the caller's wait with its local CANCELLED.
    client = start()
    call = client.submit(request("stuck", sleep_s=30), {"x": np.arange(2.0)})
    timer = threading.Timer(0.2, client.cancel, args=("stuck",))
    timer.start()
    started = time.monotonic()
    try:
        delivery = call.next(timeout=20)
    finally:
        timer.join()
    assert delivery.kind is EventKind.CANCELLED
    assert time.monotonic() - started < 2


def test_a_waiter_times_out_while_leading_and_the_call_still_completes(start):
    client = start()
    call = client.submit(request("slow", sleep_s=0.3), {"x": np.arange(2.0)})
    with pytest.raises(TimeoutError, match="slow"):
        call.next(timeout=0.05)
    delivery = call.next(timeout=10)
    assert delivery.kind is EventKind.DONE


def test_kill_while_a_caller_leads_fails_it_with_worker_gone(start):
    import os
    import signal

    from edge_core.host import WorkerGone

    client = start()
    call = client.submit(request("k", sleep_s=30), {"x": np.arange(2.0)})
    threading.Timer(0.2, os.kill, args=(client.identity.pid, signal.SIGKILL)).start()
    started = time.monotonic()
    with pytest.raises(WorkerGone):
        call.next(timeout=10)
    assert time.monotonic() - started < 2.5


def test_spin_budget_is_checked_before_anything_starts():
    with pytest.raises(BootstrapRefused, match="spin_us"):
        start_worker(test_route("echo"), generation=1, spin_us=-5)


def test_spin_budget_reaches_the_worker_boot_configuration():
    boot = BootConfig("t", "m:f", 1, "a", "b", 1, 1, 1, 1, spin_us=150)
    assert BootConfig.from_json(boot.to_json()).spin_us == 150
    bad = boot.to_json().replace('"spin_us":150', '"spin_us":-1')
    with pytest.raises(ValueError, match=r"boot\.spin_us"):
        BootConfig.from_json(bad)


def test_polling_with_a_zero_timeout_still_reads_the_channel(start):
    client = start()
    call = client.submit(request("p", sleep_s=0.1), {"x": np.arange(2.0)})
    deadline = time.monotonic() + 5
    delivery = None
    while delivery is None and time.monotonic() < deadline:
        try:
            delivery = call.next(timeout=0)
        except TimeoutError:
            time.sleep(0.005)  # shorter than the background reader's linger
    assert delivery is not None and delivery.kind is EventKind.DONE


def test_a_frame_that_cannot_be_delivered_fails_the_channel_not_a_bystander(start):
    from edge_core.host import WorkerGone

    client = start(shm_threshold=1024)

    def broken(*_args: object) -> memoryview:
        raise PermissionError("cannot map")

    client._unpacker._shared = broken  # the worker's output segment cannot be mapped
    call = client.submit(request("big"), {"x": np.ones(4096)})
    with pytest.raises(WorkerGone, match="frame not delivered"):
        call.next(timeout=10)
    assert client.health().state == "lost"


@pytest.mark.parametrize("when", ["before", "after"])
def test_buffers_of_a_cancelled_request_are_never_reused(start, when):
    from edge_contracts.shm import segment_names

    client = start("late_buffers", shm_threshold=1024)
    mine = f"edge_{client._worker_prefix}_"
    call = client.submit(request(f"c-{when}", nbytes=1 << 20, when=when, pause_s=0.3))
    time.sleep(0.1)
    client.cancel(f"c-{when}")
    assert call.next(timeout=5).kind is EventKind.CANCELLED
    time.sleep(0.5)  # the handler thread has written into its buffer and ended
    client.ping()  # a frame from the worker carries its list of unlinked segments
    # Taken before the cancel: unlinked, not pooled; after: private memory, no segment.
    assert [name for name in segment_names() if name.startswith(mine)] == []
    assert client.health().ready
