"""ReadableWait: bounded adaptive spin, then a blocking poll; timeouts and wake-ups."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from edge_contracts.waiting import (
    DEFAULT_SPIN_US,
    MAX_SPIN_US,
    SPIN_ENV,
    ReadableWait,
    WaitSamples,
    readable,
    spin_override_us,
    spin_us_from_env,
)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_ready_data_returns_at_once_and_names_the_descriptor(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 200)
    b.send(b"x")
    events = wait.wait(1.0)
    assert [fd for fd, _ in events] == [a.fileno()]


def test_timeout_returns_empty_after_the_timeout(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 200)
    start = time.monotonic()
    assert wait.wait(0.05) == []
    assert time.monotonic() - start >= 0.045


def test_zero_timeout_never_blocks(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 1000)
    start = time.monotonic()
    assert wait.wait(0) == []
    assert time.monotonic() - start < 0.05


def test_data_arriving_during_a_blocking_wait_ends_it(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 0)
    timer = threading.Timer(0.05, b.send, args=(b"x",))
    timer.start()
    try:
        assert wait.wait(5.0)
    finally:
        timer.join()


def test_hang_up_ends_the_wait(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 100)
    b.close()
    assert wait.wait(1.0)


def test_wake_descriptor_ends_the_wait_and_is_reported():
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        wait = ReadableWait(a.fileno(), 100, wake_fd=r)
        threading.Timer(0.02, os.write, args=(w, b"!")).start()
        events = wait.wait(5.0)
        assert [fd for fd, _ in events] == [r]
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def slow_replies(wait: ReadableWait, a: socket.socket, b: socket.socket, n: int = 3) -> None:
    """``n`` waits whose reply comes 10 ms after each begins (far over any budget here)."""
    for _ in range(n):
        timer = threading.Timer(0.01, b.send, args=(b"x",))
        timer.start()
        assert wait.wait(5.0)
        timer.join()
        a.recv(16)


def test_long_waits_turn_the_spin_off_and_short_ones_turn_it_back_on(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 100)  # 100 us budget
    assert wait.spinning
    slow_replies(wait, a, b)  # 10 ms: far over the budget
    assert not wait.spinning
    for _ in range(40):  # data already there: observed waits of zero
        b.send(b"x")
        assert wait.wait(1.0)
        a.recv(16)
    assert wait.spinning


def test_zero_budget_never_spins(pair):
    a, _ = pair
    assert not ReadableWait(a.fileno(), 0).spinning


@pytest.mark.parametrize("bad", [-1, 100_001, 1.5, True, "10"])
def test_bad_budget_is_refused_naming_the_field(pair, bad):
    a, _ = pair
    with pytest.raises(ValueError, match="spin_us"):
        ReadableWait(a.fileno(), bad)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, DEFAULT_SPIN_US),
        ("0", 0),
        ("350", 350),
        ("x", DEFAULT_SPIN_US),
        ("-3", DEFAULT_SPIN_US),
        ("999999999", 100_000),
    ],
)
def test_spin_budget_from_the_environment(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(SPIN_ENV, raising=False)
    else:
        monkeypatch.setenv(SPIN_ENV, raw)
    assert spin_us_from_env() == expected


def test_budget_can_be_changed_and_history_forgotten(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 0)
    assert not wait.spinning
    wait.spin_us = 150
    assert wait.spin_us == 150 and wait.spinning
    with pytest.raises(ValueError, match="spin_us"):
        wait.spin_us = -5
    timer = threading.Timer(0.01, b.send, args=(b"x",))  # far over the budget
    timer.start()
    assert wait.wait(5.0)
    timer.join()
    assert not wait.spinning
    wait.forget()
    assert wait.spinning


def test_plain_says_whether_its_waits_are_plain_polls(pair):
    """No budget and nothing measured: an owner may poll itself (a reader does)."""
    a, _ = pair
    wait = ReadableWait(a.fileno(), 0)
    assert wait.plain
    wait.spin_us = 50
    assert not wait.plain  # it spins first
    wait.spin_us = 0
    assert wait.plain
    wait.samples = WaitSamples(Windows(), pairs=10)
    assert not wait.plain  # its waits are measured
    wait.spin_us = 50
    wait.samples = None
    assert not wait.plain
    wait.spin_us = 0
    assert wait.plain
    assert not ReadableWait(a.fileno(), 20).plain


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("0", 0), ("x", None),
                                               ("250", 250), ("999999999", 100_000)])
def test_override_is_none_when_unset(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(SPIN_ENV, raising=False)
    else:
        monkeypatch.setenv(SPIN_ENV, raw)
    assert spin_override_us() == expected


class Windows:
    """Records each window a WaitSamples hands over (copies of its lists), then clears it."""

    def __init__(self) -> None:
        self.seen: list[dict[str, list[int]]] = []

    def __call__(self, samples: WaitSamples) -> None:
        self.seen.append({"blocking": list(samples.blocking_ns),
                          "spinning": list(samples.spinning_ns),
                          "spun": list(samples.spun_ns), "caught": list(samples.caught_ns)})
        samples.clear()


def test_measured_waits_come_in_runs_of_each_kind_and_count_cycles():
    windows = Windows()
    samples = WaitSamples(windows, pairs=4, run=4, interval=3)
    kinds = []
    for _ in range(2 * 8):  # two epochs of made-up waits, to read the kinds
        kinds.append(samples.next_spins())
        samples.add(kinds[-1], 0, 0, kinds[-1])
    # the first epoch spins first, the second blocks first (Thue-Morse by epoch)
    assert kinds == [True] * 4 + [False] * 4 + [False] * 4 + [True] * 4
    assert len(windows.seen) == 1  # 2 cycles of each kind per run (its first two left out)
    assert len(windows.seen[0]["spinning"]) == len(windows.seen[0]["blocking"]) == 4
    assert samples.waits_to_next() == 3 + 1  # the interval, then the third epoch



def test_a_cpu_clock_is_read_where_a_runs_counted_cycles_begin_and_end():
    windows = Windows()
    samples = WaitSamples(windows, pairs=100, run=4, settle=1)
    used = [0]
    reads = []

    def clock() -> int | None:
        reads.append(used[0])
        return used[0]

    samples.cpu = clock
    for _ in range(2 * 4):  # one epoch: a spinning run, then a blocking run
        spun = samples.next_spins()
        used[0] += 300_000 if spun else 100_000  # this wait's cycle's CPU
        samples.add(spun, 0, 0, spun)
    assert len(reads) == 4  # after each run's first wait (settle) and its last
    # three counted cycles a run, each 300 us of CPU spinning and 100 us blocking
    assert samples.spinning_cpu_ns == [300_000.0] and samples.blocking_cpu_ns == [100_000.0]
    samples.cpu = lambda: None  # a clock that cannot read: the run adds nothing
    for _ in range(2 * 4):
        samples.add(samples.next_spins(), 0, 0, False)
    assert samples.spinning_cpu_ns == [300_000.0] and samples.blocking_cpu_ns == [100_000.0]
    samples.clear()
    assert samples.spinning_cpu_ns == [] and samples.blocking_cpu_ns == []


def measured_count(samples: WaitSamples) -> int:
    return len(samples.spun_ns) + len(samples.blocking_ns)


def test_real_waits_are_measured_in_epochs_and_not_between(pair):
    a, b = pair
    windows = Windows()
    samples = WaitSamples(windows, pairs=100, run=3, interval=4)
    wait = ReadableWait(a.fileno(), 0)
    wait.samples = samples
    grew = []
    for _ in range(6 + 4 + 6):  # an epoch, four waits not measured, an epoch
        b.send(b"x")  # the reply is there: a spinning wait catches it at once
        before = measured_count(samples)
        assert wait.wait(1.0)
        a.recv(16)
        grew.append(measured_count(samples) - before)
    # spin x3, block x3 (its third counts a cycle); four not measured; block x3, spin x3
    assert grew == [1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert len(samples.spun_ns) == len(samples.caught_ns) == 6  # every spin caught
    assert len(samples.spinning_ns) == len(samples.blocking_ns) == 2  # a run's third wait
    assert all(cycle >= 0 for cycle in samples.spinning_ns + samples.blocking_ns)
    wait.samples = None  # stopped: nothing more is measured
    b.send(b"x")
    assert wait.wait(1.0)
    assert len(samples.spun_ns) == 6


def test_a_measured_wait_without_a_reply_breaks_the_cycle(pair):
    a, b = pair
    windows = Windows()
    samples = WaitSamples(windows, pairs=100, run=4, probe_us=50)
    wait = ReadableWait(a.fileno(), 0)
    wait.samples = samples
    for _ in range(2):
        b.send(b"x")
        assert wait.wait(1.0)
        a.recv(16)
    assert wait.wait(0.01) == []  # spun 50 us, then blocked until the timeout
    b.send(b"x")
    assert wait.wait(1.0)  # the run's fourth: no cycle, the third had no reply
    assert len(samples.spun_ns) == 3
    assert samples.spinning_ns == []


@pytest.mark.parametrize(("name", "kwargs"), [("pairs", {"pairs": 0}),
                                              ("run", {"run": 1}),
                                              ("settle", {"run": 4, "settle": 4}),
                                              ("settle", {"settle": 0}),
                                              ("interval", {"interval": -1}),
                                              ("probe_us", {"probe_us": MAX_SPIN_US + 1}),
                                              ("pairs", {"pairs": 1.5})])
def test_bad_samples_settings_are_refused_naming_the_field(name, kwargs):
    settings = {"pairs": 4, **kwargs}
    with pytest.raises(ValueError, match=name):
        WaitSamples(lambda _: None, **settings)


def test_a_blocked_wait_counts_without_the_wake_up_cost(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 100)  # 100 us budget
    with pytest.raises(ValueError, match="wake_us"):
        wait.wake_us = -1
    wait.wake_us = MAX_SPIN_US  # a wake-up said to cost 100 ms: longer than any wait here
    assert wait.wake_us == MAX_SPIN_US
    slow_replies(wait, a, b)  # 10 ms: far over the budget
    assert wait.spinning  # 10 ms less the wake-up: not a slow reply
    wait.wake_us = 0
    wait.forget()
    slow_replies(wait, a, b)
    assert not wait.spinning


class Calls:
    """Counts the calls of a wait's ``apart`` hook."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_apart_is_called_after_a_spin_that_ran_out_and_only_then(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 50)
    wait.apart = hook = Calls()
    b.send(b"x")
    assert wait.wait(1.0)  # the reply was there: no spin ran out
    a.recv(16)
    assert hook.count == 0
    assert wait.wait(0.01) == []  # spun 50 us in vain, then blocked until the timeout
    assert hook.count == 1
    wait.spin_us = 0
    assert wait.wait(0.005) == []  # no budget: never spins, never called
    assert hook.count == 1


def test_on_run_is_told_each_run_of_measured_waits_and_each_epoch_end(pair):
    a, b = pair
    samples = WaitSamples(Windows(), pairs=100, run=3, interval=2)
    wait = ReadableWait(a.fileno(), 0)
    wait.samples = samples
    told: list[bool | None] = []
    wait.on_run = told.append
    wait.apart = hook = Calls()
    seen = []
    for _ in range(6 + 2 + 6):  # an epoch, two waits not measured, an epoch
        b.send(b"x")  # each reply is there: no spin runs out
        assert wait.wait(1.0)
        a.recv(16)
        seen.append(list(told))
        told.clear()
    # spin x3, block x3 (then the epoch is over); two not measured; block x3, spin x3
    assert seen == [[True], [], [], [False], [], [None], [], [],
                    [False], [], [], [True], [], [None]]
    assert hook.count == 0  # no spin ran out


def test_apart_is_called_after_a_measured_spin_that_ran_out(pair):
    a, _ = pair
    wait = ReadableWait(a.fileno(), 0)
    wait.samples = WaitSamples(Windows(), pairs=100, run=2, settle=1, probe_us=50)
    told: list[bool | None] = []
    wait.on_run = told.append
    wait.apart = hook = Calls()
    assert wait.wait(0.01) == []  # the first epoch spins first: 50 us in vain, then blocks
    assert told == [True] and hook.count == 1


def test_an_ungated_wait_spins_whatever_came_before(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 100)
    slow_replies(wait, a, b)  # as the gated test: waits far over the budget
    assert not wait.spinning and wait.gated
    wait.gated = False  # the history is dropped, and no wait counts from now on
    assert wait.spinning
    slow_replies(wait, a, b)
    assert wait.spinning
    wait.gated = True  # gated again: long waits count again
    slow_replies(wait, a, b)
    assert not wait.spinning


@pytest.fixture
def past_fd_setsize():
    """Room for descriptors numbered past select's FD_SETSIZE (1024): the soft open-file
    limit raised to 1600 for the test when lower (skipped when the hard one is lower)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1600:
        if hard != resource.RLIM_INFINITY and hard < 1600:
            pytest.skip(f"the open-file limit's hard bound is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1600, hard))
    yield 1500
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_readable_takes_a_descriptor_past_fd_setsize_data_hangup_and_timeout(
        pair, past_fd_setsize):
    """select() refuses a descriptor numbered past 1024 (ValueError): ``readable`` polls,
    so a process holding many files still sees its channels."""
    a, b = pair
    high = os.dup2(a.fileno(), past_fd_setsize)
    try:
        started = time.monotonic()
        assert readable(high, 0.1) is False
        assert time.monotonic() - started >= 0.09
        b.send(b"x")
        assert readable(high, 1.0) is True
        a.recv(1)
        assert readable(high, 0.0) is False
        b.close()
        assert readable(high, 1.0) is True  # hung up: a read would see the end
    finally:
        os.close(high)
