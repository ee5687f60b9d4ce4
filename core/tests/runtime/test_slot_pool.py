"""SlotPool: refuse at once, wait up to a deadline, and wake a waiter on release."""

from __future__ import annotations

import threading
import time

import pytest

from edge_core.errors import ResourceUnavailable, StageClosed
from edge_core.runtime.admission import SlotPool


def test_a_full_pool_refuses_at_once_without_a_deadline() -> None:
    pool = SlotPool(1, "stages[s].in_flight")
    pool.acquire()
    with pytest.raises(ResourceUnavailable, match=r"stages\[s\]\.in_flight: all 1 slot"):
        pool.acquire()
    pool.release()
    assert pool.free == 1 and pool.used == 0


def test_a_release_wakes_a_waiter_long_before_its_deadline() -> None:
    # The waiter's deadline (60 s) is far beyond the join bound (20 s): only the
    # release's notify can let it through in time; a lost wake-up fails the test.
    pool = SlotPool(1, "stages[s].in_flight")
    pool.acquire()
    got: list[float] = []
    waiter = threading.Thread(target=lambda: (pool.acquire(60.0), got.append(1.0)), daemon=True)
    waiter.start()
    deadline = time.monotonic() + 10
    while pool.waiters == 0 and time.monotonic() < deadline:  # it is inside wait()
        time.sleep(0.005)
    assert pool.waiters == 1
    pool.release()
    waiter.join(timeout=20)
    assert not waiter.is_alive() and got == [1.0]
    assert pool.used == 1 and pool.waiters == 0
    pool.release()


def test_release_without_acquire_is_refused() -> None:
    with pytest.raises(RuntimeError, match="release without a matching acquire"):
        SlotPool(2, "stages[s].in_flight").release()


def test_close_ends_a_wait_at_once_and_refuses_later_waits_but_not_a_free_slot() -> None:
    pool = SlotPool(1, "pipelines[p].admission")
    pool.acquire()
    ended: list[BaseException] = []

    def wait() -> None:
        try:
            pool.acquire(60.0)
        except BaseException as exc:  # the test reads it
            ended.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    deadline = time.monotonic() + 10
    while pool.waiters == 0 and time.monotonic() < deadline:  # it is inside wait()
        time.sleep(0.005)
    pool.close("closed")
    waiter.join(timeout=20)  # far below its 60 s: only close can end it in time
    assert not waiter.is_alive()
    assert [type(exc) for exc in ended] == [StageClosed]
    assert str(ended[0]) == "pipelines[p].admission: closed"
    for deadline_s in (None, 5.0):  # full and closed: refused at once, whatever the wait
        with pytest.raises(StageClosed):
            pool.acquire(deadline_s)
    pool.release()
    pool.acquire()  # a free slot is still taken (the owner refuses what comes next)
    pool.release()
    assert pool.used == 0 and pool.waiters == 0
