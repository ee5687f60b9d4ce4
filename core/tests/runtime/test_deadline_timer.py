"""The deadline timer: lock-free scheduling into an inbox, no wake-up lost, memory bounded."""

from __future__ import annotations

import threading
import time

import pytest

from edge_core.runtime.deadlines import DeadlineTimer, no_action


def test_an_earlier_deadline_scheduled_while_the_timer_sleeps_fires_on_time() -> None:
    timer = DeadlineTimer()
    late = threading.Event()
    timer.schedule(time.monotonic() + 60.0, late.set)  # the thread sleeps towards this
    time.sleep(0.05)
    fired: list[float] = []
    done = threading.Event()
    due = time.monotonic() + 0.2

    def action() -> None:
        fired.append(time.monotonic())
        done.set()

    timer.schedule(due, action)
    assert done.wait(5.0), "the earlier deadline was not noticed by the sleeping thread"
    assert fired[0] >= due  # never early
    assert not late.is_set()


def test_cancelled_handles_never_run_and_the_inbox_stays_bounded() -> None:
    timer = DeadlineTimer()
    ran: list[int] = []
    keep = timer.schedule(time.monotonic() + 60.0, lambda: ran.append(-1))
    for i in range(5 * DeadlineTimer.drain_at):  # the thread sleeps towards keep's time
        timer.schedule(time.monotonic() + 30.0, lambda i=i: ran.append(i)).cancel()
    # Woken at drain_at handles, the thread empties the inbox and keeps none of those
    # cancelled by then. The one handle scheduled and not yet cancelled when it last
    # emptied the inbox may be in the heap, cancelled since: it leaves at a later wake-up,
    # once on top (every earlier one has: theirs came before the last's).
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and timer.backlog()[0] >= DeadlineTimer.drain_at:
        time.sleep(0.01)
    inbox, heap = timer.backlog()
    assert inbox < DeadlineTimer.drain_at
    assert heap <= 2  # cancelled handles were left out (all 5,121 would be there)
    assert timer.pending() == 1  # only the one kept
    keep.cancel()
    assert timer.pending() == 0 and ran == []


def test_many_threads_scheduling_at_once_lose_no_deadline() -> None:
    timer = DeadlineTimer()
    fired = threading.Semaphore(0)
    count = 200

    def schedule_some() -> None:
        for k in range(count // 4):
            timer.schedule(time.monotonic() + 0.05 + 0.001 * (k % 7), fired.release)

    threads = [threading.Thread(target=schedule_some) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _ in range(count):
        assert fired.acquire(timeout=10.0), "a deadline never fired"
    assert timer.pending() == 0


def test_a_deadline_centuries_away_leaves_the_timer_serving_the_next_ones() -> None:
    """A bound past ``threading.TIMEOUT_MAX`` (``call_timeout_s = 1e10``) is slept towards
    in steps: the timer's one thread must not die on it, or no deadline fires after it."""
    timer = DeadlineTimer()
    far = threading.Event()
    timer.schedule(time.monotonic() + 1e10, far.set)
    time.sleep(0.1)  # the thread took it and sleeps towards it
    near = threading.Event()
    timer.schedule(time.monotonic() + 0.05, near.set)
    assert near.wait(5.0), "the timer thread stopped: a later deadline never fired"
    assert not far.is_set() and timer.pending() == 1


def test_an_action_runs_with_the_arguments_scheduled_and_a_cancel_drops_them() -> None:
    timer = DeadlineTimer()
    got: list[tuple[object, ...]] = []
    done = threading.Event()

    def action(*args: object) -> None:
        got.append(args)
        done.set()

    timer.schedule(time.monotonic() + 0.05, action, "r1", 7, True)
    assert done.wait(5.0)
    assert got == [("r1", 7, True)]
    kept = timer.schedule(time.monotonic() + 60.0, action, "r2", 8, False)
    kept.cancel()
    assert kept.action is no_action and kept.args == ()  # nothing held until it leaves


def test_an_expiry_with_no_thread_to_be_had_runs_on_the_timer_and_the_timer_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Starting an expiry's thread fails (a process at its thread limit): the timer lives.

    The action runs on the timer's own thread instead, an error it raises is reported as
    a thread's uncaught one, and later deadlines still fire (an uncaught error ended the
    timer's thread, and no deadline of the process fired again).
    """
    timer = DeadlineTimer()
    timer.schedule(time.monotonic() + 60.0, no_action)  # the timer's thread runs now
    real = threading.Thread

    class NoThread(real):  # type: ignore[misc,valid-type]
        """Refuses to start the expiries' threads, as a process at its limit does."""

        def start(self) -> None:
            if self.name == "edge-deadline-expired":
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(threading, "Thread", NoThread)
    reported: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))
    ran: list[str] = []
    done = threading.Event()

    def fails() -> None:
        ran.append("fails")
        raise ValueError("the action's own error")

    timer.schedule(time.monotonic() + 0.05, fails)
    timer.schedule(time.monotonic() + 0.1, lambda: (ran.append("later"), done.set()))
    assert done.wait(5.0), f"a later deadline did not fire: {ran}"
    assert ran == ["fails", "later"]
    assert len(reported) == 1 and isinstance(reported[0], ValueError)


def test_a_nan_deadline_is_refused_and_later_deadlines_still_fire() -> None:
    """``when`` NaN is refused at once: kept, it never fired nor let any later one fire.

    A NaN compares neither due nor later than anything: at the top of the heap, the
    timer's thread waited towards it (a wait that returns at once) again and again, and
    no deadline of the process fired from then on.
    """
    timer = DeadlineTimer()
    refused: list[ValueError] = []
    try:
        timer.schedule(float("nan"), no_action)
    except ValueError as exc:
        refused.append(exc)
    fired = threading.Event()
    timer.schedule(time.monotonic() + 0.05, fired.set)
    assert fired.wait(5.0), "a later deadline did not fire"
    assert len(refused) == 1 and "not nan" in str(refused[0])
    assert timer.backlog() == (0, 0)  # the NaN was not kept
