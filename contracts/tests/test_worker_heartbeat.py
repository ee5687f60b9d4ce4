"""The worker's heartbeat thread: beats while busy, sleeps while idle, every wake counts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edge_contracts.worker_heartbeat import Heartbeat


def _until(condition: Callable[[], object], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def test_beats_while_busy_and_each_new_piece_of_work_is_seen_after_idle() -> None:
    beats: list[float] = []
    busy = threading.Event()

    def beat() -> bool:
        beats.append(time.monotonic())
        return True

    heartbeat = Heartbeat(beat, busy.is_set, interval_s=0.01)
    try:
        assert not _until(lambda: beats, timeout_s=0.1)  # idle: nothing sent
        for _ in range(3):  # work, idle, work again: wake() repeated, some while pending
            busy.set()
            heartbeat.wake()
            heartbeat.wake()
            seen = len(beats)
            assert _until(lambda seen=seen: len(beats) >= seen + 2)
            busy.clear()
            time.sleep(0.05)  # the thread goes back to sleep on its wake event
        quiet = len(beats)
        time.sleep(0.1)
        assert len(beats) <= quiet + 1  # at most the beat that was under way
    finally:
        heartbeat.stop()


def test_pending_says_when_a_wake_would_do_nothing_and_a_skipped_wake_loses_no_work() -> None:
    beats: list[float] = []
    busy = threading.Event()

    def beat() -> bool:
        beats.append(time.monotonic())
        return True

    heartbeat = Heartbeat(beat, busy.is_set, interval_s=0.01)
    try:
        assert not heartbeat.pending  # idle: nothing asked yet
        busy.set()
        if not heartbeat.pending:  # as the serve loop calls it
            heartbeat.wake()
        assert _until(lambda: not heartbeat.pending)  # the thread took the wake
        assert _until(lambda: len(beats) >= 2)  # and beats while busy
        busy.clear()
        time.sleep(0.05)
        for _ in range(3):  # work again after idle: each time seen, never a wake lost
            busy.set()
            if not heartbeat.pending:
                heartbeat.wake()
            seen = len(beats)
            assert _until(lambda seen=seen: len(beats) >= seen + 2)
            busy.clear()
            time.sleep(0.05)
    finally:
        heartbeat.stop()
