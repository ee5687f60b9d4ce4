"""The controller's spin budget: decided by cores and by the channel's own measured waits.

The decision logic is driven with made-up figures (no timing asserted); a real worker
channel is checked to measure its own traffic, and to take the budget its window of
waits says (made-up waits fed to its samples), with correct results under every mode.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from edge_contracts.requests import Operation, StageRequest
from edge_contracts.waiting import DEFAULT_SPIN_US, SPIN_ENV, ReadableWait, WaitSamples
from edge_core.host.spinning import (
    BUDGET_MARGIN,
    FIRST_INTERVAL,
    MAX_INTERVAL,
    MIN_WAKE_US,
    RUN_WAITS,
    SPIN_CPU_RATIO,
    SPIN_PER_WAKE,
    WINDOW_PAIRS,
    SpinDecision,
    SpinGovernor,
    WaitFigures,
    decide_spin,
    governor,
    pair_cpu_clock,
    wait_figures,
    worker_spin_us,
)


def figures(blocking: float, spinning: float, spin_wait: float,
            caught: float | None = None) -> WaitFigures:
    """Figures of a window whose spinning waits all caught their reply."""
    return WaitFigures(blocking_us=blocking, spinning_us=spinning, spin_wait_us=spin_wait,
                       caught_us=spin_wait if caught is None else caught, caught_share=1.0)


SLOW_WAKE = figures(160.0, 90.0, 20.0, caught=30.0)  # saves 70 us a round trip


@pytest.mark.parametrize(
    ("override", "cores", "processes", "measured", "expected"),
    [
        (None, 2, 2, SLOW_WAKE, 2 * 70),  # a one-stage pipeline on two cores: a core each
        (None, 2, 3, SLOW_WAKE, 0),  # two stages on two cores: too few
        (None, 2, 5, SLOW_WAKE, 0),  # the page pipeline (four workers) on two cores
        (None, 5, 5, SLOW_WAKE, 2 * 70),  # the page pipeline on five cores: a core each
        (None, 4, 5, SLOW_WAKE, 0),
        (None, 1, 2, SLOW_WAKE, 0),  # one core: never
        (None, 16, 2, None, 0),  # not measured yet
        (None, 16, 2, figures(60.0, 60.0 - MIN_WAKE_US + 0.1, 3.0), 0),  # nothing to save
        (None, 16, 2, figures(60.0, 80.0, 1.0), 0),  # spinning made round trips slower
        (None, 16, 2, WaitFigures(90.0, 40.0, 30.0, None, 0.0), 0),  # none caught
        # a spin of 45 us to save 20: more than SPIN_PER_WAKE x what it saves
        (None, 16, 2, figures(80.0, 60.0, 45.0), 0),
        # the round trip to catch is long: the budget covers it (margin x its percentile)
        (None, 16, 2, figures(150.0, 90.0, 70.0, caught=100.0), math.ceil(BUDGET_MARGIN * 100)),
        (None, 16, 2, figures(900.0, 200.0, 150.0, caught=180.0), DEFAULT_SPIN_US),  # capped
        # never more than a blocking round trip: a longer spin cannot save time
        (None, 16, 2, figures(110.0, 40.0, 20.0, caught=30.0), 110),
        # spinning saves time but costs both ends more than SPIN_CPU_RATIO x blocking's CPU
        # (the pair shares too few CPUs): block
        (None, 16, 2, replace(SLOW_WAKE, blocking_cpu_us=140.0,
                                   spinning_cpu_us=SPIN_CPU_RATIO * 140.0 + 1), 0),
        # within the ratio (where waking is slow, spinning often costs less CPU): spin
        (None, 16, 2, replace(SLOW_WAKE, blocking_cpu_us=280.0, spinning_cpu_us=180.0),
         2 * 70),
        (None, 16, 2, replace(SLOW_WAKE, blocking_cpu_us=140.0,
                                   spinning_cpu_us=SPIN_CPU_RATIO * 140.0), 2 * 70),
        # one kind's CPU not measured: judged on the times alone
        (None, 16, 2, replace(SLOW_WAKE, blocking_cpu_us=None, spinning_cpu_us=900.0),
         2 * 70),
        (0, 16, 2, SLOW_WAKE, 0),  # the override wins both ways
        (500, 2, 4, None, 500),
    ],
)
def test_decision_table(override, cores, processes, measured, expected):
    decision = decide_spin(override_us=override, cores=cores, processes=processes,
                           figures=measured)
    assert isinstance(decision, SpinDecision)
    assert decision.spin_us == expected
    assert decision.reason


def test_reasons_name_what_decided():
    assert decide_spin(override_us=None, cores=2, processes=3, figures=SLOW_WAKE).reason == (
        "3 processes share 2 cores")
    assert "EDGE_SPIN_US=7" in decide_spin(override_us=7, cores=2, processes=2,
                                           figures=None).reason
    on = decide_spin(override_us=None, cores=8, processes=2, figures=SLOW_WAKE).reason
    assert "160.0 us blocking, 90.0 us spinning" in on and "saves 70.0 us" in on
    assert "30.0 us" in on
    assert "nothing to save" in decide_spin(override_us=None, cores=8, processes=2,
                                            figures=figures(50.0, 49.0, 1.0)).reason
    assert f"more than {SPIN_PER_WAKE} x" in decide_spin(
        override_us=None, cores=8, processes=2, figures=figures(80.0, 60.0, 45.0)).reason
    costly = replace(SLOW_WAKE, blocking_cpu_us=120.0, spinning_cpu_us=250.0)
    assert decide_spin(override_us=None, cores=8, processes=2, figures=costly).reason == (
        "round trips 160.0 us blocking, 90.0 us spinning: spinning costs 250.0 us of CPU a"
        f" round trip, more than {SPIN_CPU_RATIO} x blocking's 120.0")


def test_wait_figures_are_medians_a_percentile_and_a_share():
    caught = [10_000 * k for k in range(1, 11)]  # 10 .. 100 us
    summary = wait_figures([100_000, 90_000, 500_000], [30_000, 40_000, 35_000],
                           [*caught, 300_000, 400_000], caught)
    assert summary.blocking_us == 100.0 and summary.spinning_us == 35.0
    assert summary.saving_us == 65.0
    assert summary.spin_wait_us == 65.0  # median of the twelve spinning waits
    assert summary.caught_us == 90.0  # the 90th percentile of the ten caught
    assert summary.caught_share == 10 / 12
    assert summary.blocking_cpu_us is None and summary.spinning_cpu_us is None
    with_cpu = wait_figures([1_000], [2_000], [3_000], [], [100_000.0, 300_000.0, 120_000.0],
                            [250_000.0])
    assert with_cpu.blocking_cpu_us == 120.0 and with_cpu.spinning_cpu_us == 250.0
    one_kind = wait_figures([1_000], [2_000], [3_000], [], [100_000.0], [])
    assert one_kind.blocking_cpu_us is None and one_kind.spinning_cpu_us is None
    nothing = wait_figures([1_000], [2_000], [250_000], [])
    assert nothing.caught_us is None and nothing.caught_share == 0.0
    with pytest.raises(ValueError, match="wait_figures"):
        wait_figures([], [1], [1], [])


@pytest.fixture
def waits() -> Iterator[list[ReadableWait]]:
    pairs = [socket.socketpair() for _ in range(4)]
    yield [ReadableWait(a.fileno(), 0) for a, _ in pairs]
    for a, b in pairs:
        a.close()
        b.close()


def feed(spins: SpinGovernor, samples: WaitSamples, *, blocking_us: float,
         spinning_us: float, spin_wait_us: float, caught: bool = True,
         cpu_us: tuple[float, float] | None = None) -> None:
    """Feed ``samples`` made-up measured waits until ``spins`` decides one window.

    Each blocking wait ends a cycle of ``blocking_us``, each spinning one a cycle of
    ``spinning_us`` after waiting ``spin_wait_us`` (caught or not). ``cpu_us``: the CPU
    a blocking and a spinning cycle use, read by the samples' CPU clock (else none).
    """
    samples.clear()
    used = [0]
    samples.cpu = None if cpu_us is None else lambda: used[0]
    windows = spins.windows
    now = 0
    for _ in range(4 * WINDOW_PAIRS * RUN_WAITS):
        if spins.windows > windows:
            return
        spun = samples.next_spins()
        now += round(1000 * (spinning_us if spun else blocking_us))
        if cpu_us is not None:
            used[0] += round(1000 * cpu_us[spun])
        samples.add(spun, now - round(1000 * spin_wait_us) if spun else now - 1000, now,
                    caught and spun)
    raise AssertionError("no window was decided")


def test_governor_counts_processes_and_re_decides_on_attach_and_detach(waits, monkeypatch):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    spins = SpinGovernor(cores=4)
    spins.attach(waits[0])
    assert waits[0].samples is not None  # measured from its first wait
    assert spins.decision_for(waits[0]) == SpinDecision(0, "waits not measured yet")
    feed(spins, waits[0].samples, blocking_us=150, spinning_us=90, spin_wait_us=30)
    assert spins.windows == 1 and spins.wake_us == 60.0
    assert spins.decision.spin_us == waits[0].spin_us == 0  # not yet: a window alone
    spins.attach(waits[1])  # re-decided: still a window alone
    assert waits[0].spin_us == 0
    spins.detach(waits[1])
    feed(spins, waits[0].samples, blocking_us=150, spinning_us=90, spin_wait_us=30)
    assert spins.windows == 2
    assert spins.decision.spin_us == waits[0].spin_us == SPIN_PER_WAKE * 60
    assert waits[0].wake_us == 60  # taken off a blocked wait before it is averaged
    spins.attach(waits[1])
    spins.attach(waits[2])  # controller + 3 workers on 4 cores: a core each
    assert [w.spin_us for w in waits[:3]] == [120, 0, 0]  # the new ones: not measured yet
    assert all(w.samples is not None for w in waits[:3])
    spins.attach(waits[3])  # controller + 4 workers on 4 cores: too few
    assert [w.spin_us for w in waits] == [0, 0, 0, 0]
    assert all(w.samples is None for w in waits)  # nothing measured while it cannot spin
    assert spins.decision.reason == "5 processes share 4 cores"
    spins.detach(waits[3])
    assert [w.spin_us for w in waits[:3]] == [120, 0, 0]  # its window is kept
    assert all(w.samples is not None for w in waits[:3])
    assert waits[3].samples is None and spins.decision_for(waits[3]) is None
    spins.reset(cores=2)
    assert spins.wake_us is None and spins.windows == 0
    assert [w.spin_us for w in waits[:3]] == [0, 0, 0]
    with pytest.raises(ValueError, match="cores"):
        spins.reset(cores=0)


def test_a_holding_decision_measures_less_often_and_a_change_at_once(waits, monkeypatch):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    spins = SpinGovernor(cores=2)
    spins.attach(waits[0])
    samples = waits[0].samples
    assert samples is not None and samples.interval == 0  # epochs back to back at first
    intervals = []
    for _ in range(10):  # nothing to save, window after window
        feed(spins, samples, blocking_us=60, spinning_us=61, spin_wait_us=2)
        intervals.append(samples.interval)
    assert intervals[0] == FIRST_INTERVAL
    assert intervals == sorted(intervals) and intervals[-1] == MAX_INTERVAL
    assert samples.probe_ns == 60_000  # a probe spins no longer than a blocking round trip
    feed(spins, samples, blocking_us=200, spinning_us=120, spin_wait_us=30)  # now it pays
    assert waits[0].spin_us == 0 and samples.interval == 0  # confirmed by the next window
    assert "blocks until 2 windows in a row find spinning pays (1 so far)" in (
        spins.decision.reason)
    assert samples.probe_ns == 1000 * DEFAULT_SPIN_US
    feed(spins, samples, blocking_us=198, spinning_us=121, spin_wait_us=29)  # the same again
    assert waits[0].spin_us == SPIN_PER_WAKE * 77 and samples.interval == FIRST_INTERVAL
    feed(spins, samples, blocking_us=100, spinning_us=70, spin_wait_us=29)  # resized: holds
    assert waits[0].spin_us == SPIN_PER_WAKE * 30 and samples.interval == 2 * FIRST_INTERVAL
    feed(spins, samples, blocking_us=60, spinning_us=60, spin_wait_us=29)  # off: at once
    assert waits[0].spin_us == 0 and samples.interval == FIRST_INTERVAL  # measured soon
    for _ in range(3):  # now four windows in a row must agree before it spins again
        feed(spins, samples, blocking_us=200, spinning_us=120, spin_wait_us=30)
        assert waits[0].spin_us == 0 and samples.interval == 0
    feed(spins, samples, blocking_us=200, spinning_us=120, spin_wait_us=30)
    assert waits[0].spin_us == SPIN_PER_WAKE * 80


def test_override_applies_to_both_ends_and_nothing_is_measured(waits, monkeypatch):
    monkeypatch.setenv(SPIN_ENV, "300")
    spins = SpinGovernor(cores=2)
    spins.attach(waits[0])
    assert waits[0].spin_us == 300 and waits[0].samples is None
    assert worker_spin_us() == 300
    monkeypatch.delenv(SPIN_ENV)
    assert worker_spin_us() == 0  # a worker spins only when told to


def echo_round_trips(client, n: int = 40, first: int = 0) -> None:
    for i in range(first, first + n):
        x = np.full(4, float(i), np.float32)
        out = client.submit(StageRequest(f"r{i}", "s0", 0, 1, Operation.RUN, params={}),
                            {"x": x}).result(timeout=20)
        np.testing.assert_array_equal(out["x"], x)


@pytest.fixture
def shared_governor() -> Iterator[SpinGovernor]:
    spins = governor()
    cores = spins.cores
    yield spins
    spins.reset(cores=cores)


def test_a_channel_re_decides_its_budget_from_its_own_waits(start, shared_governor,
                                                             monkeypatch):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    shared_governor.reset(cores=64)  # as on a large machine: a core for each process
    client = start()
    wait = client.reply_wait
    samples = wait.samples
    assert samples is not None  # governed and measured
    echo_round_trips(client, 2 * 2 * RUN_WAITS)  # two epochs: a window at least
    assert shared_governor.windows >= 1  # its own traffic was measured and decided
    decided = client.spin_decision
    assert decided is not None and decided.spin_us == wait.spin_us
    assert "round trips" in decided.reason  # from figures, whatever the machine gave
    # Waits that show a slow wake-up and a short round trip: it spins, enough to catch it,
    # once as many windows in a row as its own history asks for say so (8 at most)
    for _ in range(8):
        feed(shared_governor, samples, blocking_us=90, spinning_us=50, spin_wait_us=20)
        if wait.spin_us:
            break
    assert wait.spin_us == client.spin_decision.spin_us == SPIN_PER_WAKE * 40
    echo_round_trips(client, 20, first=1000)
    # The round trip to catch grows (a slower model): the budget grows to cover it.
    feed(shared_governor, samples, blocking_us=230, spinning_us=150, spin_wait_us=130)
    assert wait.spin_us == math.ceil(BUDGET_MARGIN * 130) >= 130
    assert "130.0 us" in client.spin_decision.reason
    echo_round_trips(client, 20, first=2000)
    # Waits that show no saving: it stops spinning.
    feed(shared_governor, samples, blocking_us=50, spinning_us=52, spin_wait_us=3)
    assert wait.spin_us == 0 and "nothing to save" in client.spin_decision.reason
    echo_round_trips(client, 20, first=3000)
    assert client.retire(deadline_s=5.0).verified
    assert wait.samples is None  # a retired worker's channel is no longer measured


@pytest.mark.parametrize("mode", ["too-few-cores", "measured", "override", "fixed"])
def test_calls_stay_correct_under_each_mode(start, shared_governor, monkeypatch, mode):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    kwargs: dict[str, object] = {}
    if mode == "too-few-cores":
        shared_governor.reset(cores=1)
    elif mode == "measured":
        shared_governor.reset(cores=64)  # as on a large machine: its waits are measured
    elif mode == "override":
        monkeypatch.setenv(SPIN_ENV, "150")
    else:
        kwargs["spin_us"] = 100  # a caller's own budget: not governed
    client = start(**kwargs)
    echo_round_trips(client, 2 * 2 * RUN_WAITS)  # two epochs when measured
    decision = client.spin_decision
    if mode == "too-few-cores":
        assert decision is not None and decision.spin_us == 0
        assert "2 processes share 1 core" in decision.reason
        assert client.reply_wait.samples is None
    elif mode == "measured":
        assert shared_governor.windows >= 1 and shared_governor.wake_us is not None
        assert decision is not None and "round trips" in decision.reason
    elif mode == "override":
        assert decision == SpinDecision(150, "EDGE_SPIN_US=150")
    else:
        assert decision is None and client.reply_wait.spin_us == 100
    if mode == "too-few-cores":  # a retired worker no longer counts as a process
        assert client.retire(deadline_s=5.0).verified
        assert "2 processes" not in shared_governor.decision.reason



def test_the_pair_clock_counts_this_process_and_the_workers_main_thread():
    """A real child that spins 0.2 s of CPU: the clock grows by at least that; once it is
    gone the clock reads None."""
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "sys.stdin.readline()\n"
        "end = time.process_time() + 0.2\n"
        "while time.process_time() < end: pass\n"
        "print('spun', flush=True)\n"
        "sys.stdin.readline()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        clock = pair_cpu_clock(child.pid)
        before = clock()
        assert before is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "spun\n"
        after = clock()
        assert after is not None and after - before >= 200_000_000
        child.stdin.write("end\n")
        child.stdin.flush()
    finally:
        child.wait(5)
        child.stdin.close()
        child.stdout.close()
    assert pair_cpu_clock(child.pid)() is None  # gone: nothing to read


def test_a_window_whose_spinning_costs_too_much_cpu_blocks(waits, monkeypatch):
    """Spinning saves time but costs both ends twice blocking's CPU: the channel blocks."""
    monkeypatch.delenv(SPIN_ENV, raising=False)
    spins = SpinGovernor(cores=2)
    spins.attach(waits[0])
    samples = waits[0].samples
    assert samples is not None
    feed(spins, samples, blocking_us=150, spinning_us=90, spin_wait_us=30,
         cpu_us=(140.0, 300.0))
    figures = spins.figures
    assert figures is not None
    assert figures.blocking_cpu_us == 140.0 and figures.spinning_cpu_us == 300.0
    assert waits[0].spin_us == 0
    assert "spinning costs 300.0 us of CPU a round trip" in spins.decision.reason
    # where waking both ends costs more CPU than spinning does: it spins
    for spin_us in (0, SPIN_PER_WAKE * 60):  # (two windows in a row)
        feed(spins, samples, blocking_us=150, spinning_us=90, spin_wait_us=30,
             cpu_us=(280.0, 180.0))
        assert waits[0].spin_us == spin_us


def test_a_real_channel_measures_both_ends_cpu_per_run(start, shared_governor, monkeypatch):
    """A real worker's channel reads its runs' CPU (this process's and the worker's)."""
    monkeypatch.delenv(SPIN_ENV, raising=False)
    shared_governor.reset(cores=64)  # as on a large machine: its waits are measured
    client = start()
    assert client.reply_wait.samples is not None and client.reply_wait.samples.cpu is not None
    echo_round_trips(client, 2 * 2 * RUN_WAITS)  # two epochs: a window at least
    figures = shared_governor.figures
    assert figures is not None
    assert figures.blocking_cpu_us is not None and figures.blocking_cpu_us > 0
    assert figures.spinning_cpu_us is not None and figures.spinning_cpu_us > 0
    assert client.retire(deadline_s=5.0).verified
