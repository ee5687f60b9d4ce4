"""The worker's spin for its next frame: a cap it is permitted, a budget its own waits decide.

The rule (:func:`spin_budget`) is driven with made-up figures, the owner
(:class:`NextFrameSpin`) with made-up windows fed to its samples and with real waits on
a socketpair (an idle gap of tens of milliseconds against a budget of at most 200 µs:
nothing here depends on how fast the machine is).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.jsonvalues import strict_loads
from edge_contracts.spin_budget import (
    BUDGET_MARGIN,
    FIRST_INTERVAL,
    MAX_INTERVAL,
    MIN_WAKE_US,
    RUN_WAITS,
    SPIN_PER_WAKE,
    WINDOW_PAIRS,
    SpinHistory,
    WaitFigures,
    settle_budget,
    spin_budget,
)
from edge_contracts.waiting import DEFAULT_SPIN_US, MAX_SPIN_US, ReadableWait, WaitSamples
from edge_contracts.worker_protocol import parse_spin, spin_meta
from edge_contracts.worker_spin import NextFrameSpin


def figures(blocking: float, spinning: float, spin_wait: float,
            caught: float | None = None) -> WaitFigures:
    return WaitFigures(blocking_us=blocking, spinning_us=spinning, spin_wait_us=spin_wait,
                       caught_us=spin_wait if caught is None else caught, caught_share=1.0)


@pytest.mark.parametrize(
    ("measured", "cap", "expected"),
    [
        (figures(160.0, 90.0, 20.0, caught=30.0), 200, SPIN_PER_WAKE * 70),
        (figures(160.0, 90.0, 20.0, caught=30.0), 100, 100),  # never over the cap
        (figures(60.0, 60.0 - MIN_WAKE_US + 0.1, 3.0), 200, 0),  # nothing to save
        (figures(80.0, 60.0, 45.0), 200, 0),  # a spin costs more than two wake-ups
        (WaitFigures(90.0, 40.0, 30.0, None, 0.0), 200, 0),  # nothing caught
        (figures(150.0, 90.0, 70.0, caught=100.0), 200, round(BUDGET_MARGIN * 100)),
        (figures(110.0, 40.0, 20.0, caught=30.0), 200, 110),  # at most a blocking cycle
    ],
)
def test_the_budget_a_window_justifies(measured, cap, expected):
    budget, reason = spin_budget(measured, cap)
    assert budget == expected and reason


def test_a_holding_decision_measures_less_often():
    start = SpinHistory()
    assert settle_budget(start, 0, 0, 0) == (0, FIRST_INTERVAL, start)
    assert settle_budget(start, FIRST_INTERVAL, 120, 80) == (80, 2 * FIRST_INTERVAL, start)
    assert settle_budget(start, MAX_INTERVAL, 0, 0) == (0, MAX_INTERVAL, start)
    assert settle_budget(start, MAX_INTERVAL, 90, 90)[:2] == (90, MAX_INTERVAL)


def test_spinning_stops_at_one_window_and_starts_only_after_windows_in_a_row_agree():
    history = SpinHistory()
    # a blocking wait: the first window that finds spinning pays is confirmed at once
    budget, interval, history = settle_budget(history, 256, 0, 120)
    assert (budget, interval, history.pending) == (0, 0, 1)
    budget, interval, history = settle_budget(history, interval, 0, 110)
    assert (budget, interval, history.pending) == (110, FIRST_INTERVAL, 0)
    # a spinning wait stops at the first window that says so, measuring again soon
    budget, interval, history = settle_budget(history, 1024, 110, 0)
    assert (budget, interval, history.stops) == (0, FIRST_INTERVAL, 1)
    # after a stop twice as many windows must agree; one that does not ends them, and
    # measuring resumes from the interval it had, doubled
    budget, interval, history = settle_budget(history, 512, 0, 100)
    assert (budget, interval, history.pending, history.needed) == (0, 0, 1, 4)
    for _ in range(2):
        budget, interval, history = settle_budget(history, interval, 0, 100)
        assert (budget, interval) == (0, 0)
    budget, interval, history = settle_budget(history, interval, 0, 0)  # refuted
    assert (budget, interval, history.pending) == (0, 1024, 0)
    for pending in range(1, 4):
        budget, interval, history = settle_budget(history, interval, 0, 100)
        assert (budget, interval, history.pending) == (0, 0, pending)
    budget, interval, history = settle_budget(history, interval, 0, 100)
    assert (budget, interval, history.pending) == (100, FIRST_INTERVAL, 0)
    # the count of windows that must agree is doubled at most twice
    for _ in range(5):
        history = settle_budget(history, 64, 100, 0)[2]
    assert history.stops == 6 and history.needed == 8


@pytest.mark.parametrize("meta", [{}, {"cap_us": -1}, {"cap_us": MAX_SPIN_US + 1},
                                  {"cap_us": 1.5}, {"cap_us": True}, {"cap_us": "200"}])
def test_a_malformed_cap_is_refused_naming_the_field(meta):
    with pytest.raises(InvalidValue, match=r"spin\.cap_us"):
        parse_spin(meta)


def test_a_cap_round_trips_and_unknown_keys_are_refused():
    assert parse_spin(strict_loads('{"cap_us": 200}')) == (200, None)  # as the worker reads it
    assert parse_spin(spin_meta(0)) == (0, None)
    assert parse_spin(strict_loads('{"cap_us": 200, "follow_us": 80}')) == (200, 80)
    assert parse_spin(spin_meta(200, 0)) == (200, 0)
    with pytest.raises(InvalidValue, match="spin"):
        parse_spin({"cap_us": 200, "budget_us": 50})


@pytest.mark.parametrize("bad", [-1, MAX_SPIN_US + 1, 1.5, True, "80", None])
def test_a_malformed_follow_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidValue, match=r"spin\.follow_us"):
        parse_spin({"cap_us": 200, "follow_us": bad})


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def feed(spin: NextFrameSpin, samples: WaitSamples, *, blocking_us: float,
         spinning_us: float, spin_wait_us: float, caught: bool = True) -> None:
    """Feed made-up measured waits until ``spin`` decides a window of ``samples``."""
    samples.clear()
    windows = spin.windows
    now = 0
    for _ in range(4 * WINDOW_PAIRS * RUN_WAITS):
        if spin.windows > windows:
            return
        spun = samples.next_spins()
        now += round(1000 * (spinning_us if spun else blocking_us))
        samples.add(spun, now - round(1000 * spin_wait_us) if spun else now - 1000, now,
                    caught and spun)
    raise AssertionError("no window was decided")


def test_nothing_is_measured_or_spun_until_the_controller_permits(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 0)
    spin = NextFrameSpin(wait, 0)
    assert not spin.active and wait.samples is None and wait.spin_us == 0
    assert spin.state() == {"cap_us": 0, "budget_us": 0, "reason": "not permitted",
                            "windows": 0, "spinning": False}
    spin.permit(DEFAULT_SPIN_US)
    assert spin.active and spin.cap_us == DEFAULT_SPIN_US
    assert wait.samples is not None and wait.spin_us == 0  # measured first, spun later
    assert wait.samples.probe_ns == 1000 * DEFAULT_SPIN_US
    assert spin.reason == "waits not measured yet"


def test_a_window_sets_the_budget_within_the_cap_and_a_withdrawal_stops_it(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 0)
    spin = NextFrameSpin(wait, 0)
    spin.permit(DEFAULT_SPIN_US)
    samples = wait.samples
    assert samples is not None
    feed(spin, samples, blocking_us=90, spinning_us=50, spin_wait_us=20)  # slow wake-up: pays
    assert spin.windows == 1 and spin.budget_us == wait.spin_us == 0  # a window alone
    assert "saves 40.0 us" in spin.reason and "(1 so far)" in spin.reason
    assert samples.interval == 0  # confirmed at once
    feed(spin, samples, blocking_us=90, spinning_us=50, spin_wait_us=20)  # again: it spins
    assert spin.windows == 2 and spin.budget_us == wait.spin_us == SPIN_PER_WAKE * 40
    assert wait.wake_us == 40 and "saves 40.0 us" in spin.reason
    assert samples.probe_ns == 90_000  # a probe spins no longer than a blocking cycle
    feed(spin, samples, blocking_us=60, spinning_us=60, spin_wait_us=20)  # cheap wake-up
    assert spin.budget_us == wait.spin_us == 0 and "nothing to save" in spin.reason
    for _ in range(4):  # pays again: four windows in a row after a stop
        assert wait.spin_us == 0
        feed(spin, samples, blocking_us=400, spinning_us=150, spin_wait_us=120)
    assert wait.spin_us == DEFAULT_SPIN_US  # 2 x 250 us, capped
    spin.permit(50)  # a smaller cap takes effect at once
    assert spin.budget_us == wait.spin_us == 50
    spin.permit(0)  # withdrawn (too many processes now): blocks, nothing measured
    assert not spin.active and wait.spin_us == 0 and wait.samples is None
    assert spin.reason == "not permitted"
    spin.permit(DEFAULT_SPIN_US)  # permitted again: measured from scratch
    assert wait.samples is not None and wait.spin_us == 0


def test_a_bad_cap_changes_nothing(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 0)
    spin = NextFrameSpin(wait, 0)
    spin.permit(DEFAULT_SPIN_US)
    for bad in (-1, MAX_SPIN_US + 1, 2.0, None):
        with pytest.raises(InvalidValue, match=r"spin\.cap_us"):
            spin.permit(bad)  # type: ignore[arg-type]
    assert spin.cap_us == DEFAULT_SPIN_US and wait.samples is not None
    with pytest.raises(InvalidValue, match=r"boot\.spin_us"):
        NextFrameSpin(wait, -5)


def test_a_fixed_budget_is_neither_measured_nor_capped(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 0)
    spin = NextFrameSpin(wait, 150)
    assert spin.active and wait.spin_us == 150 and "fixed" in spin.reason
    spin.permit(DEFAULT_SPIN_US)
    spin.permit(0)
    assert spin.active and wait.spin_us == 150 and wait.samples is None


def test_it_spins_for_back_to_back_frames_and_blocks_after_an_idle_gap(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 0)
    spin = NextFrameSpin(wait, 0)
    spin.permit(DEFAULT_SPIN_US)
    assert wait.samples is not None
    for _ in range(2):  # pays (two windows in a row): 150 us
        feed(spin, wait.samples, blocking_us=150, spinning_us=50, spin_wait_us=20)
    wait.samples = None  # no measured run in the way of what follows
    assert spin.budget_us == 150 and wait.spinning  # no gap seen yet

    def later() -> None:
        time.sleep(0.03)  # an idle gap of 30 ms: 200 x the budget
        b.send(b"x")

    writer = threading.Thread(target=later)
    writer.start()
    wait.wait(5.0)
    writer.join()
    a.recv(16)
    assert not wait.spinning and not spin.state()["spinning"]  # blocks after the gap
    for _ in range(30):  # back to back: the next frame is there when the wait begins
        b.send(b"x")
        wait.wait(5.0)
        a.recv(16)
    assert wait.spinning and spin.state()["spinning"]


def test_a_window_without_budget_lets_the_loop_receive_plainly_until_the_next_epoch(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 0)
    assert wait.plain_waits() == -1  # no budget, nothing measured: every wait is plain
    spin = NextFrameSpin(wait, 0)
    spin.permit(DEFAULT_SPIN_US)
    assert wait.plain_waits() == 0  # the next wait is measured
    samples = wait.samples
    assert samples is not None
    for _ in range(2 * RUN_WAITS - 1):  # real waits: all but the epoch's last
        b.send(b"x")
        wait.wait(5.0)
        a.recv(16)
    # the epoch's last wait (of its blocking run: the first epoch spins first) ends a
    # window made of made-up cycles: nothing to save
    assert not samples.next_spins()
    samples.blocking_ns[:] = [60_000] * (WINDOW_PAIRS - 1)
    samples.spinning_ns[:] = [61_000] * WINDOW_PAIRS
    samples.spun_ns[:] = samples.caught_ns[:] = [2_000] * WINDOW_PAIRS
    assert not spin.settled
    b.send(b"x")
    wait.wait(5.0)
    a.recv(16)
    assert spin.windows == 1 and spin.budget_us == 0 and spin.settled
    assert wait.plain_waits() == samples.interval == FIRST_INTERVAL
    wait.skip(FIRST_INTERVAL)  # the loop received that many times without the wait
    assert wait.plain_waits() == 0  # the next one is measured again
    b.send(b"x")
    wait.wait(5.0)
    a.recv(16)
    assert wait.plain_waits() == 0  # inside the epoch: every wait measured
    wait.spin_us = 50
    assert wait.plain_waits() == 0  # with a budget no wait is plain


def test_a_worker_told_what_to_follow_spins_that_and_measures_nothing(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 0)
    spin = NextFrameSpin(wait, 0)
    spin.permit(DEFAULT_SPIN_US)
    assert wait.samples is not None  # measuring its own waits
    spin.permit(DEFAULT_SPIN_US, 80)  # the controller's spinning run: spin with it
    assert spin.following and spin.active and wait.samples is None
    assert not wait.gated  # every wait spins what it was told: the controller measures
    assert spin.budget_us == wait.spin_us == 80 and wait.spinning
    assert spin.reason == "follows the controller: spins up to 80 us"
    spin.permit(50, 80)  # within the cap
    assert spin.budget_us == wait.spin_us == 50
    spin.permit(DEFAULT_SPIN_US, 0)  # the controller's blocking run: block with it
    assert spin.budget_us == wait.spin_us == 0 and not spin.active
    assert spin.reason == "follows the controller: blocks" and spin.windows == 0
    with pytest.raises(InvalidValue, match=r"spin\.follow_us"):
        spin.permit(DEFAULT_SPIN_US, -5)
    assert spin.following and spin.budget_us == 0 and spin.cap_us == DEFAULT_SPIN_US
    spin.permit(0, 80)  # withdrawn: blocks, whatever it was told to follow
    assert not spin.active and not spin.following and wait.spin_us == 0
    assert spin.reason == "not permitted"
    spin.permit(DEFAULT_SPIN_US, 120)
    spin.permit(DEFAULT_SPIN_US)  # no longer told what to follow: measures from scratch
    assert not spin.following and wait.samples is not None and wait.spin_us == 0
    assert wait.gated
    assert spin.reason == "waits not measured yet"


def test_a_fixed_budget_is_not_changed_by_what_the_controller_says(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 0)
    spin = NextFrameSpin(wait, 30)
    spin.permit(DEFAULT_SPIN_US, 150)
    assert spin.budget_us == wait.spin_us == 30 and not spin.following
