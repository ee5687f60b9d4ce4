"""ReadableWait: bounded adaptive spin, then a blocking poll; timeouts and wake-ups."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from edge_contracts.waiting import (
    DEFAULT_SPIN_US,
    SPIN_ENV,
    ReadableWait,
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


def test_long_waits_turn_the_spin_off_and_short_ones_turn_it_back_on(pair):
    a, b = pair
    wait = ReadableWait(a.fileno(), 100)  # 100 us budget
    assert wait.spinning
    for _ in range(3):
        timer = threading.Timer(0.01, b.send, args=(b"x",))  # 10 ms: far over the budget
        timer.start()
        assert wait.wait(5.0)
        timer.join()
        a.recv(16)
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


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("0", 0), ("x", None),
                                               ("250", 250), ("999999999", 100_000)])
def test_override_is_none_when_unset(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(SPIN_ENV, raising=False)
    else:
        monkeypatch.setenv(SPIN_ENV, raw)
    assert spin_override_us() == expected
