"""Waiting for a channel to become readable: a bounded, adaptive spin, then a blocking poll.

Both ends of a worker channel spend most of a small request's round trip not computing but
being woken: a thread blocked in ``recv``/``poll`` is rescheduled by the kernel, which on a
virtual machine costs an inter-processor interrupt (measured in ``benchmarks/transport.py``:
a bare socketpair round trip is ≈ 50 µs blocking and ≈ 6 µs when both ends poll without
sleeping). :class:`ReadableWait` polls without sleeping for at most ``spin_ns`` before it
blocks, and only while the waits it has recently seen were short: an exponentially
weighted average of observed waits above the budget turns the spin off (a 5 ms inference
is waited for with a blocking poll), and it turns back on by itself when waits shorten.

The CPU spent is therefore bounded by ``spin_ns`` per wait. ``spin_ns = 0`` disables
spinning. How large the budget is, and whether there is one at all, is decided by whoever
owns the wait: the controller sizes its own from the measured wake-up cost and the cores
its workers share (``edge_core.host.spinning``); :data:`SPIN_ENV` overrides that on both
ends. ONNX Runtime makes the same trade for its own intra-op threads
(``session.intra_op.allow_spinning``). Standard library only.
"""

from __future__ import annotations

import math
import os
import select
import time

__all__ = [
    "DEFAULT_SPIN_US",
    "MAX_SPIN_US",
    "SPIN_ENV",
    "ReadableWait",
    "spin_override_us",
    "spin_us_from_env",
]

SPIN_ENV = "EDGE_SPIN_US"
"""Environment variable overriding the spin budget on both ends (microseconds; 0 disables)."""

DEFAULT_SPIN_US = 200
"""The largest spin budget chosen without :data:`SPIN_ENV`: a few slow wake-ups."""

MAX_SPIN_US = 100_000
"""The largest budget accepted anywhere (an override above it is clipped to it)."""

_WEIGHT = 0.25  # of the newest observation in the running average


def spin_override_us() -> int | None:
    """The budget :data:`SPIN_ENV` sets (clipped to :data:`MAX_SPIN_US`); None when unset.

    A value that is not a non-negative integer counts as unset.
    """
    raw = os.environ.get(SPIN_ENV)
    if raw is None or not raw.strip().isdigit():
        return None
    return min(int(raw), MAX_SPIN_US)


def spin_us_from_env(default: int = DEFAULT_SPIN_US) -> int:
    """Return the spin budget from :data:`SPIN_ENV`, else ``default`` (bad values: default)."""
    override = spin_override_us()
    return default if override is None else override


class ReadableWait:
    """Waits until a file descriptor is readable (or hung up), spinning first when it pays.

    Not thread-safe: one thread at a time waits on an instance (the reader of a channel).

    Args:
        fd: the descriptor (a socket's ``fileno()``).
        spin_us: spin budget per wait in microseconds (0: always block at once).
        wake_fd: optional second descriptor (a pipe's read end) that ends a wait too, so
            that another thread can interrupt the waiter.

    """

    __slots__ = ("__weakref__", "_average_ns", "_poll", "_spin_ns")

    def __init__(self, fd: int, spin_us: int, wake_fd: int | None = None) -> None:
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        if wake_fd is not None:
            self._poll.register(wake_fd, select.POLLIN)
        self._spin_ns = 0
        self._average_ns = 0.0
        self.spin_us = spin_us

    @property
    def spin_us(self) -> int:
        """The spin budget per wait in microseconds (0: always block at once)."""
        return self._spin_ns // 1000

    @spin_us.setter
    def spin_us(self, value: int) -> None:
        """Set the budget (takes effect at the next wait; the wait history is kept)."""
        if type(value) is not int or not 0 <= value <= MAX_SPIN_US:
            raise ValueError(f"spin_us: must be an integer in 0..{MAX_SPIN_US}: {value!r}")
        self._spin_ns = value * 1000

    def forget(self) -> None:
        """Drop the wait history, so that the next wait spins if there is a budget."""
        self._average_ns = 0.0

    @property
    def spinning(self) -> bool:
        """True when the next wait will spin before it blocks."""
        return bool(self._spin_ns) and self._average_ns < self._spin_ns

    def ready(self) -> list[tuple[int, int]]:
        """The ``(fd, events)`` pairs ready now (never blocks; empty when none)."""
        return self._poll.poll(0)

    def wait(self, timeout_s: float | None) -> list[tuple[int, int]]:
        """Wait until a descriptor is readable or hung up; return ``(fd, events)`` pairs.

        Empty when ``timeout_s`` passed first. Without a budget this is one blocking
        ``poll`` (a descriptor that is ready already ends it at once).
        """
        poll = self._poll.poll
        if not self._spin_ns:
            return poll() if timeout_s is None else poll(max(0, math.ceil(timeout_s * 1000)))
        events = poll(0)
        if events:
            self._observe(0)
            return events
        clock = time.perf_counter_ns
        start = clock()
        if self._spin_ns and self._average_ns < self._spin_ns:
            end = start + min(self._spin_ns, _ns(timeout_s))
            while clock() < end:
                events = poll(0)
                if events:
                    self._observe(clock() - start)
                    return events
        if timeout_s is None:
            events = poll()
        else:
            left_ms = (start + _ns(timeout_s) - clock()) / 1e6
            events = poll(max(0, int(left_ms + 0.999)))
        self._observe(clock() - start)
        return events

    def _observe(self, waited_ns: int) -> None:
        self._average_ns += _WEIGHT * (waited_ns - self._average_ns)


def _ns(timeout_s: float | None) -> int:
    return 1 << 62 if timeout_s is None else max(0, int(timeout_s * 1e9))
