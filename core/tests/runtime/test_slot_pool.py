"""SlotPool: refuse at once, wait up to a deadline, and wake a waiter on release."""

from __future__ import annotations

import threading
import time

import pytest

from edge_core.errors import ResourceUnavailable
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
    while pool._waiters == 0 and time.monotonic() < deadline:  # it is inside wait()
        time.sleep(0.005)
    assert pool._waiters == 1
    pool.release()
    waiter.join(timeout=20)
    assert not waiter.is_alive() and got == [1.0]
    assert pool.used == 1 and pool._waiters == 0
    pool.release()


def test_release_without_acquire_is_refused() -> None:
    with pytest.raises(RuntimeError, match="release without a matching acquire"):
        SlotPool(2, "stages[s].in_flight").release()
