"""What a window of measured waits says a spin budget should be: the rule both ends use.

A wait that owns :class:`~edge_contracts.waiting.WaitSamples` measures, now and then, a
run of waits that block at once and a run that spin first, and what counts is each run's
*cycles* (from the end of one wait to the end of the next). :func:`wait_figures` sums a
window of them up (:class:`WaitFigures`) and :func:`spin_budget` says what budget they
justify: the *saving* (the median blocking cycle less the median spinning one) is what
waking costs there; under :data:`MIN_WAKE_US` there is nothing to save, and where the
median spinning wait is more than :data:`SPIN_PER_WAKE` times the saving a spin costs
more CPU than it saves time; where the runs' CPU was measured (both ends' CPU per cycle,
:attr:`WaitSamples.cpu <edge_contracts.waiting.WaitSamples.cpu>`) and spinning cost
more than :data:`SPIN_CPU_RATIO` times blocking's, it costs more CPU than the time it
saves is worth (the two processes share too few CPUs); otherwise the budget covers the
wait it must catch:
:data:`BUDGET_MARGIN` times the :data:`CAUGHT_PERCENTILE` of the spinning waits that
caught their frame, and at least :data:`SPIN_PER_WAKE` times the saving (a spin that
catches nothing then costs at most two wake-ups), at most the cap and at most a blocking
cycle (a spin longer than that cannot save time).

The controller's governor (``edge_core.host.spinning``) applies it to its wait for a
worker's reply, the worker (:mod:`edge_contracts.worker_spin`) to its wait for its next
request. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

__all__ = [
    "BUDGET_MARGIN",
    "CAUGHT_PERCENTILE",
    "CONFIRM_WINDOWS",
    "FIRST_INTERVAL",
    "MAX_CONFIRM_DOUBLINGS",
    "MAX_INTERVAL",
    "MIN_WAKE_US",
    "RUN_WAITS",
    "SETTLE_WAITS",
    "SPIN_CPU_RATIO",
    "SPIN_PER_WAKE",
    "WINDOW_PAIRS",
    "SpinHistory",
    "WaitFigures",
    "settle_budget",
    "spin_budget",
    "wait_figures",
]

SPIN_CPU_RATIO = 1.5
"""The most CPU a spinning round trip may cost both ends together, over a blocking one:
where the two processes share too few CPUs (another process keeps one busy, or the
kernel puts a blocking pair on one CPU), each spinning end holds a CPU for the whole
round trip, and a spin that saves a wake-up now and then costs far more CPU than it
saves time."""

SPIN_PER_WAKE = 2
"""The most CPU a caught spin may cost per µs it saves: a spinning wait whose median is
longer than this many wake-ups is not worth it."""

MIN_WAKE_US = 5.0
"""Below this saving (µs) spinning has nothing to save (a few polls cost as much)."""

RUN_WAITS = 40
"""Measured waits of one kind in a row."""

SETTLE_WAITS = 10
"""A run's first waits whose cycles do not count: where one end has spun, the scheduler
keeps the two processes on separate cores for a while after it blocks (and their
wake-ups cost inter-processor interrupts), which a blocking run of ten waits still
shows on the 2-vCPU VM."""

WINDOW_PAIRS = RUN_WAITS - SETTLE_WAITS
"""Cycles of each kind (blocking, spinning) per window: one epoch."""

FIRST_INTERVAL = 64
"""Waits not measured between two epochs after the first window whose decision held."""

MAX_INTERVAL = 4096
"""The most waits not measured between two epochs, once a decision holds."""

CAUGHT_PERCENTILE = 0.9
"""The share of caught frames the budget is sized to catch."""

BUDGET_MARGIN = 1.25
"""The budget over the caught waits' :data:`CAUGHT_PERCENTILE` (waits vary)."""


@dataclass(frozen=True, slots=True)
class WaitFigures:
    """What one window of a wait's measured waits took, in µs.

    Attributes:
        blocking_us: median cycle of the runs that blocked at once.
        spinning_us: median cycle of the runs that spun first.
        spin_wait_us: median wait of the spinning waits (the CPU a spin costs).
        caught_us: :data:`CAUGHT_PERCENTILE` of the spinning waits that caught their
            frame; None when none did.
        caught_share: the share of spinning waits that caught their frame.
        blocking_cpu_us: median CPU per cycle of the blocking runs, both ends together
            (None: not measured).
        spinning_cpu_us: the same of the spinning runs.

    """

    blocking_us: float
    spinning_us: float
    spin_wait_us: float
    caught_us: float | None
    caught_share: float
    blocking_cpu_us: float | None = None
    spinning_cpu_us: float | None = None

    @property
    def saving_us(self) -> float:
        """What spinning saved a cycle: median blocking cycle less median spinning one."""
        return self.blocking_us - self.spinning_us


def _median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence, as :func:`statistics.median` gives it.

    Not that function: :mod:`statistics` (with :mod:`fractions`, :mod:`decimal` and
    :mod:`random`) would be a good part of every worker's start-up imports.
    """
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def wait_figures(blocking_ns: Sequence[int], spinning_ns: Sequence[int],
                 spun_ns: Sequence[int], caught_ns: Sequence[int],
                 blocking_cpu_ns: Sequence[float] = (),
                 spinning_cpu_ns: Sequence[float] = ()) -> WaitFigures:
    """Summarise a window (:class:`~edge_contracts.waiting.WaitSamples`' lists, ns).

    The CPU figures are the medians of the runs' CPU per cycle, where runs of both kinds
    were measured (else None).
    """
    if not blocking_ns or not spinning_ns or not spun_ns:
        raise ValueError("wait_figures: needs cycles of both kinds and spinning waits")
    cpu = ((_median(blocking_cpu_ns) / 1000, _median(spinning_cpu_ns) / 1000)
           if blocking_cpu_ns and spinning_cpu_ns else (None, None))
    caught = sorted(caught_ns)
    high = (caught[min(len(caught) - 1, math.ceil(CAUGHT_PERCENTILE * len(caught)) - 1)]
            / 1000 if caught else None)
    return WaitFigures(blocking_us=_median(blocking_ns) / 1000,
                       spinning_us=_median(spinning_ns) / 1000,
                       spin_wait_us=_median(spun_ns) / 1000,
                       caught_us=high, caught_share=len(caught) / len(spun_ns),
                       blocking_cpu_us=cpu[0], spinning_cpu_us=cpu[1])


def spin_budget(figures: WaitFigures, cap_us: int) -> tuple[int, str]:
    """The budget (µs, 0: block at once) a window justifies, at most ``cap_us``, and why.

    Pure: the tests drive it with made-up figures.
    """
    saving = figures.saving_us
    measured = (f"round trips {figures.blocking_us:.1f} us blocking, {figures.spinning_us:.1f}"
                f" us spinning")
    if saving < MIN_WAKE_US or figures.caught_us is None:
        return 0, f"{measured}: nothing to save"
    if figures.spin_wait_us > SPIN_PER_WAKE * saving:
        return 0, (f"{measured}: a spin of {figures.spin_wait_us:.1f} us costs"
                   f" more than {SPIN_PER_WAKE} x the {saving:.1f} us it saves")
    block_cpu, spin_cpu = figures.blocking_cpu_us, figures.spinning_cpu_us
    if block_cpu is not None and spin_cpu is not None and spin_cpu > SPIN_CPU_RATIO * block_cpu:
        return 0, (f"{measured}: spinning costs {spin_cpu:.1f} us of CPU a round trip,"
                   f" more than {SPIN_CPU_RATIO} x blocking's {block_cpu:.1f}")
    budget = min(cap_us, math.ceil(figures.blocking_us),
                 math.ceil(max(BUDGET_MARGIN * figures.caught_us, SPIN_PER_WAKE * saving)))
    return budget, (f"{measured}: saves {saving:.1f} us;"
                    f" {round(100 * CAUGHT_PERCENTILE)} % of caught waits"
                    f" within {figures.caught_us:.1f} us")


CONFIRM_WINDOWS = 2
"""Windows in a row that must each find that spinning pays before a wait that blocks
starts to spin (:func:`settle_budget`); doubled each time spinning was turned off again,
up to :data:`MAX_CONFIRM_DOUBLINGS` times. Turning it off takes one window."""

MAX_CONFIRM_DOUBLINGS = 2
"""The most :data:`CONFIRM_WINDOWS` is doubled (so at most 8 windows in a row)."""


@dataclass(frozen=True, slots=True)
class SpinHistory:
    """What a wait's earlier windows leave for the next one's decision (:func:`settle_budget`).

    Attributes:
        pending: windows in a row, while it blocks, that found spinning pays.
        stops: times spinning was turned off after it had been on.
        resume: the interval in use when the pending windows began (measuring resumes
            from it where one of them is refuted).

    """

    pending: int = 0
    stops: int = 0
    resume: int = 0

    @property
    def needed(self) -> int:
        """Windows in a row that must find spinning pays before the wait spins."""
        return CONFIRM_WINDOWS << min(self.stops, MAX_CONFIRM_DOUBLINGS)


def _held(interval: int) -> int:
    """The interval after a window whose decision held: doubled, within the bounds."""
    return min(MAX_INTERVAL, max(FIRST_INTERVAL, 2 * interval))


def settle_budget(history: SpinHistory, interval: int, before_us: int,
                  verdict_us: int) -> tuple[int, int, SpinHistory]:
    """What a window's verdict changes: the budget in use, the next interval, the history.

    ``before_us`` is the budget in use, ``verdict_us`` what the window justifies
    (:func:`spin_budget`), ``interval`` the waits not measured before this window.
    Returns the budget to use (µs, 0: block), the waits not measured until the next
    epoch, and the history the next window's call takes.

    Spinning costs CPU on every wait and saves time only where it pays; a window is a
    few milliseconds of waits, and beside a co-located load that comes and goes (a busy
    process that sleeps now and then) one window finds it pays and the next that it
    does not. So the two directions are not alike:

    * a spinning wait stops at the first window that says so, and measures again after
      :data:`FIRST_INTERVAL` waits;
    * a blocking wait starts to spin only once :attr:`SpinHistory.needed` windows in a
      row found it pays (:data:`CONFIRM_WINDOWS`, doubled for each earlier stop): those
      windows are measured back to back, and one that finds it does not pay ends them,
      measuring then resuming its interval, doubled;
    * a decision that holds (on and on, resized or not; off and off) doubles the
      interval, from :data:`FIRST_INTERVAL` to :data:`MAX_INTERVAL`.

    Pure: the tests drive it with made-up verdicts.
    """
    if before_us:
        if verdict_us:
            return verdict_us, _held(interval), history
        return 0, FIRST_INTERVAL, replace(history, stops=history.stops + 1, pending=0)
    if not verdict_us:
        if history.pending:  # refuted: back to the interval it had, doubled
            return 0, _held(history.resume), replace(history, pending=0)
        return 0, _held(interval), history
    pending = history.pending + 1
    if pending >= history.needed:
        return verdict_us, FIRST_INTERVAL, replace(history, pending=0)
    resume = history.resume if history.pending else interval
    return 0, 0, replace(history, pending=pending, resume=resume)
