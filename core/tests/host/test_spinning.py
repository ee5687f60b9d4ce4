"""The controller's spin budget: decided by cores and a measured wake-up, overridden by env.

The decision logic is driven with made-up figures (no timing asserted); the calls through a
real worker are checked for correct results under each mode the decision can take.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import numpy as np
import pytest

from edge_contracts.requests import Operation, StageRequest
from edge_contracts.waiting import DEFAULT_SPIN_US, SPIN_ENV, ReadableWait
from edge_core.host.spinning import (
    CALIBRATION_ROUNDS,
    MIN_WAKE_US,
    SPIN_PER_WAKE,
    SpinDecision,
    SpinGovernor,
    decide_spin,
    governor,
    wake_up_us,
    worker_spin_us,
)


@pytest.mark.parametrize(
    ("override", "cores", "processes", "wake", "expected"),
    [
        (None, 2, 2, 80.0, 2 * 80),  # a one-stage pipeline on two cores: a core each
        (None, 2, 3, 80.0, 0),  # two stages on two cores: too few
        (None, 2, 5, 80.0, 0),  # the page pipeline (four workers) on two cores
        (None, 5, 5, 80.0, 2 * 80),  # the page pipeline on five cores: a core each
        (None, 4, 5, 80.0, 0),
        (None, 1, 2, 80.0, 0),  # one core: never
        (None, 16, 2, None, 0),  # not measured yet
        (None, 16, 2, MIN_WAKE_US - 0.1, 0),  # waking is as cheap as polling
        (None, 16, 2, 30.0, SPIN_PER_WAKE * 30),
        (None, 16, 2, 10_000.0, DEFAULT_SPIN_US),  # capped
        (0, 16, 2, 80.0, 0),  # the override wins both ways
        (500, 2, 4, None, 500),
    ],
)
def test_decision_table(override, cores, processes, wake, expected):
    decision = decide_spin(override_us=override, cores=cores, processes=processes, wake_us=wake)
    assert isinstance(decision, SpinDecision)
    assert decision.spin_us == expected
    assert decision.reason


def test_reasons_name_what_decided():
    assert decide_spin(override_us=None, cores=2, processes=3, wake_us=50.0).reason == (
        "3 processes share 2 cores")
    assert "EDGE_SPIN_US=7" in decide_spin(override_us=7, cores=2, processes=2,
                                           wake_us=None).reason
    assert "wake-up of 40.0 us" in decide_spin(override_us=None, cores=8, processes=2,
                                               wake_us=40.0).reason


def test_wake_up_is_the_difference_of_medians_and_never_negative():
    assert wake_up_us([100_000, 90_000, 500_000], [30_000, 40_000, 35_000]) == 65.0
    assert wake_up_us([10_000], [20_000]) == 0.0
    with pytest.raises(ValueError, match="wake_up_us"):
        wake_up_us([], [1])


@pytest.fixture
def waits() -> Iterator[list[ReadableWait]]:
    pairs = [socket.socketpair() for _ in range(4)]
    yield [ReadableWait(a.fileno(), 0) for a, _ in pairs]
    for a, b in pairs:
        a.close()
        b.close()


class FakeClock:
    """Advances by what the round trip in progress costs: blocking or spinning."""

    def __init__(self, wait: ReadableWait, blocking_ns: int, spinning_ns: int) -> None:
        self.now, self.wait = 0, wait
        self.costs = (blocking_ns, spinning_ns)
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls % 2 == 0:  # the end of a round trip
            self.now += self.costs[1] if self.wait.spin_us else self.costs[0]
        return self.now


def test_governor_counts_processes_and_re_decides_on_attach_and_detach(waits, monkeypatch):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    spins = SpinGovernor(cores=4)
    spins.attach(waits[0])
    assert spins.wants_measurement()
    clock = FakeClock(waits[0], blocking_ns=110_000, spinning_ns=50_000)
    assert spins.measure(lambda: None, waits[0], clock=clock) == 60.0
    assert clock.calls == 4 * CALIBRATION_ROUNDS
    assert not spins.wants_measurement()  # once per process
    assert spins.decision.spin_us == waits[0].spin_us == 120
    spins.attach(waits[1])
    spins.attach(waits[2])  # controller + 3 workers on 4 cores: a core each
    assert [w.spin_us for w in waits[:3]] == [120, 120, 120]
    spins.attach(waits[3])  # controller + 4 workers on 4 cores: too few
    assert [w.spin_us for w in waits] == [0, 0, 0, 0]
    assert spins.decision.reason == "5 processes share 4 cores"
    spins.detach(waits[3])
    assert [w.spin_us for w in waits[:3]] == [120, 120, 120]
    spins.reset(cores=2)
    assert spins.wake_us is None and waits[0].spin_us == 0
    with pytest.raises(ValueError, match="cores"):
        spins.reset(cores=0)


def test_measurement_leaves_an_ungoverned_wait_alone(waits, monkeypatch):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    spins = SpinGovernor(cores=8)
    waits[3].spin_us = 40
    spins.measure(lambda: None, waits[3], clock=FakeClock(waits[3], 90_000, 20_000))
    assert spins.wake_us == 70.0
    assert waits[3].spin_us == 40  # not governed: its budget is its owner's


def test_override_applies_to_both_ends(waits, monkeypatch):
    monkeypatch.setenv(SPIN_ENV, "300")
    spins = SpinGovernor(cores=2)
    spins.attach(waits[0])
    assert waits[0].spin_us == 300 and not spins.wants_measurement()
    assert worker_spin_us() == 300
    monkeypatch.delenv(SPIN_ENV)
    assert worker_spin_us() == 0  # a worker spins only when told to


def echo_round_trips(client, n: int = 40) -> None:
    for i in range(n):
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


@pytest.mark.parametrize("mode", ["too-few-cores", "measured", "override", "fixed"])
def test_calls_stay_correct_under_each_mode(start, shared_governor, monkeypatch, mode):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    kwargs: dict[str, object] = {}
    if mode == "too-few-cores":
        shared_governor.reset(cores=1)
    elif mode == "measured":
        shared_governor.reset(cores=64)  # as on a large machine: the start measures
    elif mode == "override":
        monkeypatch.setenv(SPIN_ENV, "150")
    else:
        kwargs["spin_us"] = 100  # a caller's own budget: not governed
    client = start(**kwargs)
    echo_round_trips(client)
    decision = shared_governor.decision
    if mode == "too-few-cores":
        assert decision.spin_us == 0 and "2 processes share 1 core" in decision.reason
    elif mode == "measured":
        assert shared_governor.wake_us is not None and shared_governor.wake_us >= 0
        assert "measured" in decision.reason or "nothing to save" in decision.reason
    elif mode == "override":
        assert decision.spin_us == 150
    if mode == "too-few-cores":  # a retired worker no longer counts as a process
        assert client.retire(deadline_s=5.0).verified
        assert "2 processes" not in shared_governor.decision.reason
