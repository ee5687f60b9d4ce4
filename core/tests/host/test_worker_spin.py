"""A worker's spin for its next request, on real worker processes: permitted, followed, gated.

The controller tells each governed worker the most it may spin (``spin`` frames): right
after the hello, and again whenever a worker starts or retires changes the core rule.
Within that cap a worker that offered ``spin-follow`` spins as the controller says (the
controller's measured runs are joint: both ends block, or both spin), and one that did
not (an older worker: here the controller is kept from offering the feature) measures
its own waits. Its ``ping`` answer says what it has (cap, budget, reason, windows
decided, whether its next wait spins). Nothing here asserts how fast anything is: the
machine decides the measured budget, the tests check who decides what, and that an idle
gap of tens of milliseconds (hundreds of times any budget) turns the spin off.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from edge_contracts.headers import FrameHeader
from edge_contracts.protocol import (
    FEATURE_SPIN_FOLLOW,
    FEATURE_WORKER_SPIN,
    KNOWN_FEATURES,
    OP_SPIN,
)
from edge_contracts.requests import Operation, StageRequest
from edge_contracts.spin_budget import RUN_WAITS
from edge_contracts.waiting import DEFAULT_SPIN_US, SPIN_ENV
from edge_contracts.wire import encode_frame
from edge_core.host import WorkerClient, bootstrap
from edge_core.host.spinning import SpinGovernor, governor


@pytest.fixture
def measuring(monkeypatch) -> None:
    """Workers started from now on are not offered ``spin-follow``: they measure themselves."""
    monkeypatch.setattr(bootstrap, "_supported",
                        lambda: frozenset(KNOWN_FEATURES - {FEATURE_SPIN_FOLLOW}))


@pytest.fixture
def shared_governor(monkeypatch) -> Iterator[SpinGovernor]:
    monkeypatch.delenv(SPIN_ENV, raising=False)
    spins = governor()
    cores = spins.cores
    yield spins
    spins.reset(cores=cores)


def round_trips(client: WorkerClient, n: int, first: int = 0, sleep_s: float = 0.0) -> None:
    for i in range(first, first + n):
        x = np.full(4, float(i), np.float32)
        params = {"sleep_s": sleep_s} if sleep_s else {}
        out = client.submit(StageRequest(f"r{i}", "s0", 0, client.generation, Operation.RUN,
                                         params=params), {"x": x}).result(timeout=20)
        np.testing.assert_array_equal(out["x"], x)


def read_elsewhere(client: WorkerClient, i: int) -> None:
    """One round trip whose reply this thread does not wait for: the channel's reader reads it.

    No caller waits while it comes (none has yet on a new channel), so the channel's
    background reader takes it off the socket; the call's end is then taken without a
    wait. On a busy machine this happens by chance: the caller is descheduled between its
    send and its wait, and the reply comes first.
    """
    x = np.full(4, float(i), np.float32)
    call = client.submit(StageRequest(f"r{i}", "s0", 0, client.generation, Operation.RUN),
                         {"x": x})
    ended = threading.Event()
    call.on_end(ended.set)
    assert ended.wait(20)
    np.testing.assert_array_equal(call.result(timeout=0)["x"], x)


def spin_of(client: WorkerClient) -> dict[str, object]:
    """The worker's own account (the ping is read after every frame sent before it)."""
    answer: dict[str, object] = client.ping(timeout_s=10)["spin"]
    return answer


def test_the_cap_reaches_the_worker_at_start_and_it_follows_the_controller(start,
                                                                          shared_governor):
    shared_governor.reset(cores=64)  # as on a large machine: a core for each process
    client = start()
    assert {FEATURE_WORKER_SPIN, FEATURE_SPIN_FOLLOW} <= client.features
    assert client.worker_spin_cap == DEFAULT_SPIN_US
    assert spin_of(client)["cap_us"] == DEFAULT_SPIN_US
    round_trips(client, 2 * 2 * RUN_WAITS)  # two epochs of the controller's: a window
    state = spin_of(client)
    assert str(state["reason"]).startswith("follows the controller"), state
    assert state["windows"] == 0  # it measured nothing itself
    assert isinstance(state["budget_us"], int) and 0 <= state["budget_us"] <= DEFAULT_SPIN_US
    assert shared_governor.windows >= 1  # the controller did


def test_the_worker_waits_as_the_controller_does_in_each_measured_run(start, shared_governor):
    shared_governor.reset(cores=64)
    client = start()
    wait = client.reply_wait
    told: list[bool | None] = []
    governed = wait.on_run
    assert governed is not None

    def spy(kind: bool | None) -> object:
        told.append(kind)
        return governed(kind)

    wait.on_run = spy
    for i in range(2 * 2 * RUN_WAITS):
        if i == 0:  # no caller waits for it (a busy machine did this by chance)
            read_elsewhere(client, i)
        else:
            round_trips(client, 1, first=i)
        follow = shared_governor.worker_follow_for(wait)
        samples = wait.samples
        assert samples is not None
        if not told:  # only replies no caller waited for so far: nothing measured or told
            assert follow is None and samples.between_epochs()
            continue
        if told[-1] is None:  # between epochs: the channel's own budget
            decision = client.spin_decision
            assert decision is not None and follow == decision.spin_us
        else:  # inside a run: the run's kind
            assert follow == (samples.probe_ns // 1000 if told[-1] else 0)
    assert True in told and False in told and None in told
    follow = shared_governor.worker_follow_for(wait)
    assert follow is not None
    state = spin_of(client)  # answered after every spin frame sent before the ping
    assert state["budget_us"] == min(DEFAULT_SPIN_US, follow)
    assert str(state["reason"]).startswith("follows the controller")


def test_a_worker_not_led_measures_its_own_waits(start, shared_governor, measuring):
    shared_governor.reset(cores=64)
    client = start()
    assert FEATURE_WORKER_SPIN in client.features
    assert FEATURE_SPIN_FOLLOW not in client.features
    assert client.worker_spin_cap == DEFAULT_SPIN_US
    state = spin_of(client)
    assert state["cap_us"] == DEFAULT_SPIN_US and state["windows"] == 0
    round_trips(client, 2 * 2 * RUN_WAITS)  # two epochs: a window at least
    state = spin_of(client)
    assert isinstance(state["windows"], int) and state["windows"] >= 1
    assert "round trips" in str(state["reason"])  # from figures, whatever the machine gave
    assert isinstance(state["budget_us"], int) and 0 <= state["budget_us"] <= DEFAULT_SPIN_US


def test_too_few_cores_permit_nothing_and_nothing_is_measured(start, shared_governor):
    shared_governor.reset(cores=1)
    client = start()
    assert client.worker_spin_cap == 0
    round_trips(client, 2 * 2 * RUN_WAITS)
    assert spin_of(client) == {"cap_us": 0, "budget_us": 0, "reason": "not permitted",
                               "windows": 0, "spinning": False}


def test_a_change_of_the_core_rule_reaches_every_worker(start, shared_governor, measuring):
    shared_governor.reset(cores=2)  # the controller and one worker: a core each
    first = start()
    assert spin_of(first)["cap_us"] == DEFAULT_SPIN_US
    round_trips(first, 2 * 2 * RUN_WAITS)
    assert spin_of(first)["windows"] >= 1
    second = start()  # three processes on two cores: nobody spins
    assert first.worker_spin_cap == second.worker_spin_cap == 0
    decided = {first: spin_of(first)["windows"], second: 0}
    for client in (first, second):
        round_trips(client, 2 * 2 * RUN_WAITS, first=1000)
        assert spin_of(client) == {"cap_us": 0, "budget_us": 0, "reason": "not permitted",
                                   "windows": decided[client], "spinning": False}
    assert second.retire(deadline_s=5.0).verified  # two processes again
    assert first.worker_spin_cap == DEFAULT_SPIN_US
    state = spin_of(first)
    assert state["cap_us"] == DEFAULT_SPIN_US and state["reason"] == "waits not measured yet"


def test_a_budget_given_at_start_is_fixed_on_the_worker(start, shared_governor, monkeypatch):
    shared_governor.reset(cores=64)
    pinned = start(spin_us=0)  # the caller's own budget: not governed, nothing told
    assert pinned.worker_spin_cap == 0
    round_trips(pinned, 2 * 2 * RUN_WAITS)
    assert spin_of(pinned)["windows"] == 0 and spin_of(pinned)["cap_us"] == 0
    monkeypatch.setenv(SPIN_ENV, "150")  # the override: both ends, fixed, nothing measured
    overridden = start()
    assert overridden.worker_spin_cap == 0
    round_trips(overridden, 2 * 2 * RUN_WAITS, first=1000)
    state = spin_of(overridden)
    assert state["budget_us"] == 150 and state["windows"] == 0
    assert state["reason"] == "fixed at boot (150 us)"


def test_it_spins_for_back_to_back_requests_and_blocks_after_an_idle_gap(start, shared_governor,
                                                                        tmp_path):
    shared_governor.reset(cores=1)  # the budget is fixed here: the gating is what is tested
    client = start(spin_us=DEFAULT_SPIN_US)
    round_trips(client, 1)
    time.sleep(0.05)  # idle: 250 x the budget
    assert spin_of(client)["spinning"] is False  # the ping's own wait was that gap
    x = {"x": np.zeros(4, np.float32)}

    def send(i: int) -> Any:
        params = {"started": str(tmp_path / f"s{i}"), "hold_s": 10.0}
        return client.submit(StageRequest(f"s{i}", "s0", 0, client.generation, Operation.RUN,
                                          params=params), x)

    def running(i: int) -> None:
        deadline = time.monotonic() + 20
        while not (tmp_path / f"s{i}").exists():
            assert time.monotonic() < deadline, f"request s{i} never began"
            time.sleep(0.001)

    # Back to back, by construction: each next frame is sent once the worker runs the
    # request before it, which is held until that frame is on the channel, so the
    # worker's wait for each next frame finds it there, however late this process runs.
    # (Timed instead, by a sleep in each request and one here, a frame sent after the
    # worker had begun to wait for it turned the spin off now and then on a busy machine.)
    call = send(0)
    for i in range(1, 32):
        running(i - 1)
        following = send(i)
        call.result(timeout=20)
        call = following
    running(31)
    state = spin_of(client)  # the frame the last request is held for
    call.result(timeout=20)
    assert state["spinning"] is True


def test_a_malformed_cap_is_refused_and_the_worker_stays(start, shared_governor):
    shared_governor.reset(cores=64)
    with tempfile.TemporaryFile() as errors:
        client = start(stderr=errors)
        bad = FrameHeader(OP_SPIN, "", "", 0, client.generation, meta={"cap_us": -3})
        client.send_bytes(b"".join(bytes(part) for part in encode_frame(bad, [])))
        state = spin_of(client)
        assert state["cap_us"] == DEFAULT_SPIN_US  # the cap in use stays
        round_trips(client, 3)
        assert client.retire(deadline_s=5.0).verified
        errors.seek(0)
        text = errors.read().decode()
    assert "refused spin" in text and "spin.cap_us" in text


def test_the_worker_keeps_measuring_all_its_life_whatever_it_decides(start, shared_governor,
                                                                      measuring):
    # Epochs of 80 waits, then 64, 128, 256 ... waits not measured while a decision holds
    # (between them a worker that decided not to spin receives plainly and counts the
    # receives): by 768 requests a fourth window is in, whatever this machine decided;
    # one that stopped spinning, or windows that confirm a spin, measure sooner: more.
    shared_governor.reset(cores=64)
    client = start()
    round_trips(client, 1000)
    state = spin_of(client)
    assert isinstance(state["windows"], int) and state["windows"] >= 4, state
