"""When the controller spins while it waits for a worker: a budget decided by measurement.

A caller waiting for a worker's reply either blocks (the kernel wakes it when the reply
arrives: a *wake-up*, which on a virtual machine costs an inter-processor interrupt and a
reschedule) or spins, polling without sleeping (:class:`~edge_contracts.waiting.ReadableWait`).
Spinning saves one wake-up per reply that arrives within the budget and costs the time
spun in CPU. It pays only where

* there is a core to spin on: the controller and every worker it runs may each want one
  at once, so the controller spins only while it runs no more processes than the cores it
  may use (a one-stage pipeline needs two; the three-stage page pipeline, four workers
  with its two recogniser replicas, needs five: on a two-core machine it never spins), and
* waking is slow: the budget is :data:`SPIN_PER_WAKE` times the wake-up cost measured on
  the first worker channel of the process (pings with and without spinning, alternated),
  capped at :data:`~edge_contracts.waiting.DEFAULT_SPIN_US`; where a wake-up costs less
  than :data:`MIN_WAKE_US` there is nothing to save and the budget is 0.

The wait itself then spins only while the replies it has recently seen came within the
budget (its running average), so a slow model call is waited for with a blocking poll.
:data:`~edge_contracts.waiting.SPIN_ENV` overrides all of this, on both ends.

Workers themselves spin (for their next request) only under the override: the next
request comes when the application sends it, not within a time anyone can know.

One :class:`SpinGovernor` per controller process (:func:`governor`) holds the measured
wake-up cost and the waits it sizes, and re-decides when a worker starts or retires.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Sequence

import attrs

from edge_contracts.waiting import DEFAULT_SPIN_US, ReadableWait, spin_override_us

__all__ = [
    "CALIBRATION_ROUNDS",
    "CALIBRATION_SPIN_US",
    "MIN_WAKE_US",
    "SPIN_PER_WAKE",
    "SpinDecision",
    "SpinGovernor",
    "decide_spin",
    "governor",
    "usable_cores",
    "wake_up_us",
    "worker_spin_us",
]

SPIN_PER_WAKE = 2
"""Budget per measured wake-up: a reply caught within it saved a wake-up for at most twice
its cost in CPU."""

MIN_WAKE_US = 5.0
"""Below this wake-up cost (µs) spinning has nothing to save (a few polls cost as much)."""

CALIBRATION_ROUNDS = 16
"""Ping pairs (one blocking, one spinning, alternating) that measure the wake-up cost."""

CALIBRATION_SPIN_US = 2000
"""Spin budget of the calibration's spinning pings (far above any ping's round trip)."""


@attrs.frozen
class SpinDecision:
    """The controller's spin budget and why.

    Attributes:
        spin_us: the budget per wait in microseconds (0: block at once).
        reason: what decided it, for logs, ``edge plan`` and benchmarks.

    """

    spin_us: int
    reason: str


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def decide_spin(
    *, override_us: int | None, cores: int, processes: int, wake_us: float | None
) -> SpinDecision:
    """Decide the controller's spin budget (pure: the tests drive it with made-up figures).

    Args:
        override_us: the :data:`~edge_contracts.waiting.SPIN_ENV` budget, None when unset.
        cores: CPUs the controller may use.
        processes: the controller plus the workers it runs.
        wake_us: measured wake-up cost in µs; None while not measured.

    """
    if override_us is not None:
        return SpinDecision(override_us, f"EDGE_SPIN_US={override_us}")
    if processes > cores:
        return SpinDecision(0, f"{processes} processes share {cores} "
                               + ("core" if cores == 1 else "cores"))
    if wake_us is None:
        return SpinDecision(0, "wake-up cost not measured yet")
    if wake_us < MIN_WAKE_US:
        return SpinDecision(0, f"a wake-up costs {wake_us:.1f} us: nothing to save")
    budget = min(DEFAULT_SPIN_US, round(SPIN_PER_WAKE * wake_us))
    return SpinDecision(budget, f"{SPIN_PER_WAKE} x the measured wake-up of {wake_us:.1f} us")


def wake_up_us(blocking_ns: Sequence[int], spinning_ns: Sequence[int]) -> float:
    """The wake-up cost: median blocking round trip minus median spinning one, in µs (≥ 0)."""
    if not blocking_ns or not spinning_ns:
        raise ValueError("wake_up_us: needs round trips of both kinds")
    return max(0.0, (statistics.median(blocking_ns) - statistics.median(spinning_ns)) / 1000)


def worker_spin_us() -> int:
    """The budget a new worker gets for waiting for its next request (the override, else 0)."""
    override = spin_override_us()
    return 0 if override is None else override


class SpinGovernor:
    """Sizes the spin budget of the controller's governed channel waits (see the module).

    Thread-safe. Waits are held weakly and counted as one worker each.

    Args:
        cores: CPUs the controller may use (default: :func:`usable_cores`).

    """

    def __init__(self, cores: int | None = None) -> None:
        self._cores = usable_cores() if cores is None else cores
        self._lock = threading.Lock()
        self._waits: weakref.WeakSet[ReadableWait] = weakref.WeakSet()
        self._wake_us: float | None = None
        self._measuring = False
        self._decision = self._decide()

    @property
    def decision(self) -> SpinDecision:
        """The budget the governed waits have now, and why."""
        return self._decision

    @property
    def wake_us(self) -> float | None:
        """The measured wake-up cost in µs (None while not measured)."""
        return self._wake_us

    def attach(self, wait: ReadableWait) -> None:
        """Govern ``wait`` (one more worker) and re-decide every governed budget."""
        with self._lock:
            self._waits.add(wait)
            self._apply()

    def detach(self, wait: ReadableWait) -> None:
        """Stop governing ``wait`` (its worker is gone) and re-decide the others."""
        with self._lock:
            self._waits.discard(wait)
            self._apply()

    def wants_measurement(self) -> bool:
        """True when only a measured wake-up cost is missing for the budget to be decided."""
        with self._lock:
            return (self._wake_us is None and not self._measuring
                    and spin_override_us() is None and 1 + len(self._waits) <= self._cores)

    def reset(self, cores: int | None = None) -> None:
        """Forget the measured wake-up cost; with ``cores``, count that many from now on.

        For tests, and for a controller that is told to use fewer cores than it may.
        """
        with self._lock:
            self._wake_us = None
            if cores is not None:
                if type(cores) is not int or cores < 1:
                    raise ValueError(f"cores: must be a positive integer: {cores!r}")
                self._cores = cores
            self._apply()

    @property
    def cores(self) -> int:
        """The CPUs the decision counts."""
        return self._cores

    def measure(self, round_trip: Callable[[], object], wait: ReadableWait,
                rounds: int = CALIBRATION_ROUNDS,
                clock: Callable[[], int] = time.perf_counter_ns) -> float:
        """Measure the wake-up cost on a live channel; store it and re-decide.

        Runs ``round_trip`` (a ping that ``wait`` waits for) ``2 * rounds`` times after two
        unrecorded ones, alternately with the wait's budget at 0 and at
        :data:`CALIBRATION_SPIN_US`, timed by ``clock`` (nanoseconds); returns
        :func:`wake_up_us` of the two. A governed wait's budget is decided afresh
        afterwards; any other gets its own back. One measurement at a time: a second caller
        meanwhile gets ``ValueError``.
        """
        with self._lock:
            if self._measuring:
                raise ValueError("measure: a measurement is under way")
            self._measuring = True
        blocking: list[int] = []
        spinning: list[int] = []
        saved = wait.spin_us
        try:
            round_trip()
            round_trip()
            for index in range(rounds):
                for budget in ((0, CALIBRATION_SPIN_US) if index % 2
                               else (CALIBRATION_SPIN_US, 0)):
                    wait.spin_us = budget
                    wait.forget()
                    start = clock()
                    round_trip()
                    (spinning if budget else blocking).append(clock() - start)
        finally:
            with self._lock:
                self._measuring = False
                if blocking and spinning and len(blocking) == len(spinning) == rounds:
                    self._wake_us = wake_up_us(blocking, spinning)
                self._apply()
                if wait not in self._waits:
                    wait.spin_us = saved
                wait.forget()
        return wake_up_us(blocking, spinning)

    def _decide(self) -> SpinDecision:
        return decide_spin(override_us=spin_override_us(), cores=self._cores,
                           processes=1 + len(self._waits), wake_us=self._wake_us)

    def _apply(self) -> None:
        """Re-decide and set every governed wait's budget (holding the lock)."""
        self._decision = self._decide()
        for wait in list(self._waits):
            wait.spin_us = self._decision.spin_us


_GOVERNOR = SpinGovernor()


def governor() -> SpinGovernor:
    """The controller process's one governor."""
    return _GOVERNOR
