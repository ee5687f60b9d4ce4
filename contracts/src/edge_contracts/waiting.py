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
owns the wait: the controller sizes its own from what the channel's own waits take and
the cores its workers share (``edge_core.host.spinning``), a worker its wait for its next
request from its own waits, within the cap the controller permits
(:mod:`edge_contracts.worker_spin`); :data:`SPIN_ENV` overrides that on both ends. ONNX
Runtime makes the same trade for its own intra-op threads
(``session.intra_op.allow_spinning``).

For that sizing a wait can be given :class:`WaitSamples`: then now and then a run of
waits is *measured*, blocking at once or spinning first for up to the samples' probe
budget, whatever the budget in use, and what each run's round trips took goes into the
samples; when they hold a window of both kinds, their owner reads them (and may change
the budget and how often runs are measured). A wait pays one counter decrement for this
on its usual path. Standard library only.
"""

from __future__ import annotations

import math
import os
import select
import time
from collections.abc import Callable

__all__ = [
    "DEFAULT_SPIN_US",
    "MAX_SPIN_US",
    "SPIN_ENV",
    "ReadableWait",
    "WaitSamples",
    "readable",
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


def readable(fd: int, timeout_s: float) -> bool:
    """Whether ``fd`` is readable (or hung up, or in error) within ``timeout_s`` seconds.

    ``poll``, not ``select``: ``select`` refuses a descriptor numbered past ``FD_SETSIZE``
    (1024), which a process that holds many files (a server's connections) hands out.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    events = poller.poll(max(0, math.ceil(timeout_s * 1000)))
    return any(event & ~select.POLLNVAL for _, event in events)


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


class WaitSamples:
    """What the measured waits of one :class:`ReadableWait` took, by kind, for their owner.

    Measured waits come in *epochs*: ``run`` consecutive waits of one kind, then ``run``
    of the other (which kind first alternates from epoch to epoch), then ``interval``
    waits that are not measured. A run's waits all block at once, or all spin first for
    up to ``probe_us``, whatever budget the wait has, so that the scheduler places the
    two processes as that kind of waiting makes it. What counts is a *cycle*: from the end
    of one measured wait to the end of the next in the same run, so the request's send
    (which must wake a blocked worker) is in it as well as the reply's wait; the cycles
    ending at a run's first ``settle`` waits do not count (the first begins in the other
    kind, and the scheduler takes a while to place the processes as this kind makes it).

    Not thread-safe: filled by the wait's thread; ``on_window`` runs in that thread.

    Args:
        on_window: called with these samples once ``pairs`` cycles of each kind are in; it
            reads them and normally calls :meth:`clear` (else it is called again at the
            next measured wait) and may set :attr:`interval`.
        pairs: cycles of each kind per window.
        run: measured waits of one kind in a row.
        settle: a run's first waits whose cycles do not count (at least 1, under ``run``).
        interval: waits not measured between two epochs.
        probe_us: how long a spinning measured wait spins at most (µs).

    Attributes:
        blocking_ns: cycles of the runs that blocked at once.
        spinning_ns: cycles of the runs that spun first.
        spun_ns: how long each spinning measured wait waited.
        caught_ns: those of ``spun_ns`` whose reply came while it spun.
        interval: as above; read at the end of each epoch.
        cpu: the owner's CPU clock (nanoseconds of CPU both ends of the channel have
            used, or None where it cannot be read), or None: then no CPU is measured.
            Read twice a run, where its counted cycles begin and where it ends.
        blocking_cpu_ns: CPU per counted cycle of each blocking run that the clock
            measured whole.
        spinning_cpu_ns: the same of each spinning run.

    """

    __slots__ = ("_cpu_start", "_epochs", "_last_end", "_on_window", "_step",
                 "blocking_cpu_ns", "blocking_ns", "caught_ns", "cpu", "interval", "pairs",
                 "probe_ns", "run", "settle", "spinning_cpu_ns", "spinning_ns", "spun_ns")

    def __init__(self, on_window: Callable[[WaitSamples], object], *, pairs: int,
                 run: int = 10, settle: int = 2, interval: int = 0,
                 probe_us: int = DEFAULT_SPIN_US) -> None:
        for name, value, low, high in (("pairs", pairs, 1, MAX_SPIN_US),
                                       ("run", run, 2, MAX_SPIN_US),
                                       ("settle", settle, 1, run - 1),
                                       ("interval", interval, 0, MAX_SPIN_US),
                                       ("probe_us", probe_us, 0, MAX_SPIN_US)):
            if type(value) is not int or not low <= value <= high:
                raise ValueError(f"{name}: must be an integer in {low}..{high}: {value!r}")
        self._on_window = on_window
        self._step = 0  # measured waits of this epoch so far
        self._epochs = 0
        self._last_end: int | None = None
        self.pairs = pairs
        self.run = run
        self.settle = settle
        self.interval = interval
        self.probe_ns = probe_us * 1000
        self.blocking_ns: list[int] = []
        self.spinning_ns: list[int] = []
        self.spun_ns: list[int] = []
        self.caught_ns: list[int] = []
        self.cpu: Callable[[], int | None] | None = None
        self._cpu_start: int | None = None
        self.blocking_cpu_ns: list[float] = []
        self.spinning_cpu_ns: list[float] = []

    def next_spins(self) -> bool:
        """True when the next measured wait spins first.

        Epochs start with a spinning run or a blocking one as the Thue-Morse sequence
        says (spin, block, block, spin, block, spin, spin, block, ...), so that neither
        kind always follows the decided budget's own waits.
        """
        return (self._step < self.run) != bool(self._epochs.bit_count() & 1)

    def add(self, spun: bool, start_ns: int, end_ns: int, caught: bool) -> None:
        """Record one measured wait that ended with a reply; call ``on_window`` when full.

        Args:
            spun: it spun first (else it blocked at once).
            start_ns: when it began (a monotonic clock, nanoseconds).
            end_ns: when it ended (the same clock).
            caught: it spun and the reply came while it did.

        """
        last = self._last_end
        if last is not None and self._step % self.run >= self.settle:
            (self.spinning_ns if spun else self.blocking_ns).append(end_ns - last)
        if spun:
            self.spun_ns.append(end_ns - start_ns)
            if caught:
                self.caught_ns.append(end_ns - start_ns)
        self._advance(end_ns)
        if len(self.blocking_ns) >= self.pairs and len(self.spinning_ns) >= self.pairs:
            self._on_window(self)

    def skip(self) -> None:
        """Count a measured wait that ended without a reply (a timeout, a nudge)."""
        self._advance(None)

    def starts_run(self) -> bool:
        """True when the next measured wait is the first of its run."""
        return not self._step % self.run

    def between_epochs(self) -> bool:
        """True when no epoch is under way (the next measured wait begins one)."""
        return not self._step

    def waits_to_next(self) -> int:
        """How many waits from now the next measured one is (1: the very next)."""
        return 1 if self._step else self.interval + 1

    def clear(self) -> None:
        """Start the next window, with a new epoch (one under way is dropped)."""
        self.blocking_ns = []
        self.spinning_ns = []
        self.spun_ns = []
        self.caught_ns = []
        self.blocking_cpu_ns = []
        self.spinning_cpu_ns = []
        self._cpu_start = None
        if self._step:
            self._step = 0
            self._epochs += 1
            self._last_end = None

    def _advance(self, end_ns: int | None) -> None:
        if self.cpu is not None:
            self._clock_cpu()
        self._step += 1
        self._last_end = end_ns
        if self._step == 2 * self.run:
            self._step = 0
            self._epochs += 1
            self._last_end = None

    def _clock_cpu(self) -> None:
        """Read :attr:`cpu` where a run's counted cycles begin and where the run ends.

        Called as a measured wait ends, before it is counted: the wait that ends a run's
        ``settle``-th wait begins its first counted cycle, the run's last ends its last.
        A run the clock could not read at both ends (or that a :meth:`clear` cut) adds
        nothing.
        """
        cpu = self.cpu
        assert cpu is not None
        position = self._step % self.run + 1  # this wait's place in its run, from 1
        if position == self.settle:
            self._cpu_start = cpu()
        elif position == self.run and self._cpu_start is not None:
            now = cpu()
            if now is not None:
                spun = (self._step < self.run) != bool(self._epochs.bit_count() & 1)
                (self.spinning_cpu_ns if spun else self.blocking_cpu_ns).append(
                    (now - self._cpu_start) / (self.run - self.settle))
            self._cpu_start = None


class ReadableWait:
    """Waits until a file descriptor is readable (or hung up), spinning first when it pays.

    Not thread-safe: one thread at a time waits on an instance (the reader of a channel).

    Args:
        fd: the descriptor (a socket's ``fileno()``).
        spin_us: spin budget per wait in microseconds (0: always block at once).
        wake_fd: optional second descriptor (a pipe's read end) that ends a wait too, so
            that another thread can interrupt the waiter.

    Attributes:
        apart: called (without arguments) after a spin that ran out without a reply, so
            that its owner can keep the two ends on separate CPUs: a spin on the CPU the
            reply must be computed on only delays it (``edge_core.host.apart``). When it
            returns true (the thread moved), the wait spins once more before it blocks:
            a reply that woke it would place it beside its sender again. None (the
            default): not called.
        on_run: called as each run of measured waits (:attr:`samples`) begins, with True
            for a spinning run and False for a blocking one, and with None once an
            epoch's runs are over, so that its owner can have the other end wait the
            same way meanwhile (``edge_core.host.spinning``). None (the default): not
            called.
        plain: True while every wait is a plain blocking poll: no spin budget and no
            wait measured (kept by the :attr:`spin_us` and :attr:`samples` setters).
            Its owner may then poll the same descriptors itself instead of calling
            :meth:`wait`, which would do no more (read it before each such wait: the
            setters may run in any thread).

    """

    __slots__ = (
        "__weakref__",
        "_average_ns",
        "_fd",
        "_gated",
        "_left",
        "_poll",
        "_samples",
        "_spin_ns",
        "_wake_ns",
        "apart",
        "on_run",
        "plain",
    )

    def __init__(self, fd: int, spin_us: int, wake_fd: int | None = None) -> None:
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        if wake_fd is not None:
            self._poll.register(wake_fd, select.POLLIN)
        self._spin_ns = 0
        self.plain = True
        self._wake_ns = 0
        self._average_ns = 0.0
        self._gated = True
        self._samples: WaitSamples | None = None
        self._left = -1  # waits until the next measured one; below 0: none measured
        self.spin_us = spin_us
        self.apart: Callable[[], object] | None = None
        self.on_run: Callable[[bool | None], object] | None = None

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
        self.plain = not value and self._samples is None

    @property
    def wake_us(self) -> int:
        """The wake-up cost (µs) taken off a blocked wait before it counts in the average.

        A wait that ended in a blocking poll took the reply's time plus a wake-up; the
        average compares reply times with the budget (0: the whole wait counts).
        """
        return self._wake_ns // 1000

    @wake_us.setter
    def wake_us(self, value: int) -> None:
        """Set the wake-up cost (takes effect at the next wait)."""
        if type(value) is not int or not 0 <= value <= MAX_SPIN_US:
            raise ValueError(f"wake_us: must be an integer in 0..{MAX_SPIN_US}: {value!r}")
        self._wake_ns = value * 1000

    @property
    def samples(self) -> WaitSamples | None:
        """Where measured waits go (None: no wait is measured)."""
        return self._samples

    @samples.setter
    def samples(self, value: WaitSamples | None) -> None:
        """Measure waits into ``value`` from the next one on (None: stop measuring)."""
        self._samples = value
        self.plain = not self._spin_ns and value is None
        self._left = -1 if value is None else 1

    def plain_waits(self) -> int:
        """How many of the next waits are plain blocking polls: no budget, none measured.

        -1: all of them (no budget, nothing measured); 0: the next one spins or is
        measured. Its owner may make those waits elsewhere (its own poll, with none of
        this object's bookkeeping) and count them with :meth:`skip`.
        """
        if self._spin_ns:
            return 0
        return -1 if self._left < 0 else self._left - 1

    def skip(self, waits: int) -> None:
        """Count ``waits`` plain waits its owner made elsewhere (see :meth:`plain_waits`)."""
        if self._left > 0:
            self._left = max(1, self._left - waits)

    @property
    def gated(self) -> bool:
        """True (the default) when the waits it recently saw decide whether a wait spins.

        False: every wait spins up to the budget first, whatever came before; its owner
        decides when spinning pays (a worker that follows its controller's measuring).
        """
        return self._gated

    @gated.setter
    def gated(self, value: bool) -> None:
        """Set whether recent waits gate the spin (off: the history is dropped)."""
        self._gated = bool(value)
        if not value:
            self._average_ns = 0.0

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
        ``poll`` (a descriptor that is ready already ends it at once), except in a run of
        measured waits (:attr:`samples`), which spin or block as the run's kind says.
        """
        self._left -= 1
        if not self._left:
            return self._measured(timeout_s)
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
            limit = start + _ns(timeout_s)
            end = min(start + self._spin_ns, limit)
            while True:
                while clock() < end:
                    events = poll(0)
                    if events:
                        self._observe(clock() - start)
                        return events
                # moved off the peer's CPU: spin once more (blocking now would have the
                # reply wake this thread on the peer's CPU again)
                if self.apart is None or not self.apart():
                    break
                end = min(clock() + self._spin_ns, limit)
        if timeout_s is None:
            events = poll()
        else:
            left_ms = (start + _ns(timeout_s) - clock()) / 1e6
            events = poll(max(0, int(left_ms + 0.999)))
        self._observe(clock() - start - self._wake_ns)  # the reply's time: no wake-up
        return events

    def _measured(self, timeout_s: float | None) -> list[tuple[int, int]]:
        """One measured wait (see :class:`WaitSamples`): blocking at once or spinning first."""
        samples = self._samples
        if samples is None:  # stopped since the count began
            self._left = -1
            return self.wait(timeout_s)
        poll = self._poll.poll
        clock = time.perf_counter_ns
        spun = samples.next_spins()
        if samples.starts_run() and self.on_run is not None:
            self.on_run(spun)
        apart = self.apart if spun else None
        caught = False
        start = clock()
        events: list[tuple[int, int]] = []
        if spun:
            limit = start + _ns(timeout_s)
            end = min(start + samples.probe_ns, limit)
            while True:
                events = poll(0)
                if events:
                    caught = True
                    break
                now_ns = clock()
                if now_ns >= end:
                    if apart is None or not apart():
                        break
                    end = min(now_ns + samples.probe_ns, limit)  # moved: spin once more
        if not events:
            if timeout_s is None:
                events = poll()
            else:
                left_ms = (start + _ns(timeout_s) - clock()) / 1e6
                events = poll(max(0, int(left_ms + 0.999)))
        finish = clock()
        if spun:  # a blocking wait says nothing of how soon replies come: not averaged
            self._observe(finish - start if caught else finish - start - self._wake_ns)
        fd = self._fd
        if any(ready == fd for ready, _ in events):  # a reply, not a timeout or a nudge
            samples.add(spun, start, finish, caught)
        else:
            samples.skip()
        now = self._samples  # the window's owner may have stopped or changed it
        self._left = -1 if now is None else now.waits_to_next()
        if now is not None and now.between_epochs() and self.on_run is not None:
            self.on_run(None)
        return events

    def _observe(self, waited_ns: int) -> None:
        if self._gated:
            self._average_ns += _WEIGHT * (waited_ns - self._average_ns)


def _ns(timeout_s: float | None) -> int:
    return 1 << 62 if timeout_s is None else max(0, int(timeout_s * 1e9))
