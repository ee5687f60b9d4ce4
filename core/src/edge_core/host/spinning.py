"""When the controller spins while it waits for a worker: a budget its channel's waits decide.

A caller waiting for a worker's reply either blocks (the kernel wakes it when the reply
arrives: a *wake-up*, which on a virtual machine costs an inter-processor interrupt and a
reschedule, and the worker's send then has someone to wake) or spins, polling without
sleeping (:class:`~edge_contracts.waiting.ReadableWait`). Spinning saves that wake-up for
a reply that arrives within the budget and costs the time spun in CPU. It pays only where

* there is a core to spin on: the controller and every worker it runs may each want one
  at once, so the controller spins only while it runs no more processes than the cores it
  may use (a one-stage pipeline needs two; the three-stage page pipeline, four workers
  with its two recogniser replicas, needs five: on a two-core machine it never spins), and
* waking is slow against the reply's own time. Each governed channel measures this on its
  own traffic, all its life (:class:`~edge_contracts.waiting.WaitSamples`): now and then
  a run of :data:`RUN_WAITS` waits blocks at once and another spins first for up to
  :data:`~edge_contracts.waiting.DEFAULT_SPIN_US`, and what counts is each run's
  *cycles*, from the end of one wait to the end of the next, so that the request's send
  is in them too. Single waits mislead: where the two processes share a core, a send to a
  blocked worker runs the worker at once, so a spinning wait finds its reply ready (1 µs)
  while a blocking one waits 25 µs, and the round trips take the same; and how the
  scheduler places the processes follows how the controller waits, so each kind is
  measured over a run of its own (the first :data:`SETTLE_WAITS` of a run do not count).
  After :data:`WINDOW_PAIRS` cycles of each kind (a *window*) the channel's budget is
  decided afresh (:func:`decide_spin` on the window's :class:`WaitFigures`, by
  :func:`~edge_contracts.spin_budget.spin_budget`): the *saving*, the median blocking
  cycle less the median spinning one, is what waking costs there; under
  :data:`MIN_WAKE_US` there is nothing to save, and where the median spinning wait is
  more than :data:`SPIN_PER_WAKE` times the saving a spin costs more CPU than it saves
  time; otherwise the budget covers the round trip it must catch: :data:`BUDGET_MARGIN`
  times the :data:`CAUGHT_PERCENTILE` of the spinning waits that caught their reply, and
  at least :data:`SPIN_PER_WAKE` times the saving (a spin that catches nothing then costs
  at most two wake-ups), at most ``DEFAULT_SPIN_US`` and at most a blocking round trip (a
  spin longer than that cannot save time). The spinning runs of the next window spin up
  to the latter too, so that where spinning does not pay, a probe costs a round trip's
  CPU, not 200 µs. Each run's CPU, this process's and the worker's main thread's
  together (:func:`pair_cpu_clock`), is read where its counted cycles begin and where it
  ends: where a spinning round trip costs more than :data:`SPIN_CPU_RATIO` times a
  blocking one's, the two processes share too few CPUs (another process keeps one busy,
  or the kernel puts the blocking pair on one CPU) and the channel blocks.

The first window is measured at once (a channel's first ``2 x RUN_WAITS`` waits, its
start-up's control calls among them); until spinning is decided it does not spin. A
window's verdict is not applied alone (:func:`~edge_contracts.spin_budget.settle_budget`):
a channel that blocks starts to spin only once
:data:`~edge_contracts.spin_budget.CONFIRM_WINDOWS` windows in a row find that spinning
pays (twice as many after each time it stopped, up to 8), measured back to back; one that
spins stops at the first window that finds it does not, and measures again after
:data:`FIRST_INTERVAL` waits. Beside a co-located load that comes and goes, window
verdicts alternate, and a spin turned on by every other window costs CPU for little.
After each window whose decision holds, the waits between two measured epochs double,
from :data:`FIRST_INTERVAL` to :data:`MAX_INTERVAL`. Once steady, measuring costs a run
of the other kind of waiting per ``MAX_INTERVAL`` waits (about 1 %).

Between windows the wait itself spins only while the replies it has recently seen came
within the budget (its running average; the saving the channel measured is taken off a
blocked wait first), so a slow model call is waited for with a blocking poll.
:data:`~edge_contracts.waiting.SPIN_ENV` overrides all of this, on both ends, and then
no wait is measured.

Workers spin for their next request within a cap this module gives them
(:func:`worker_spin_cap`: :data:`~edge_contracts.waiting.DEFAULT_SPIN_US` under the same
core rule, else 0), told in ``spin`` frames right after each worker's hello and whenever
a worker starts or retires changes it (:meth:`SpinGovernor.follow`). Within the cap a
worker that offered ``spin-follow`` waits as its channel's measured runs do
(:meth:`SpinGovernor.worker_follow_for`, told in the same frames as each run begins and
each epoch ends): both ends block in a blocking run and both spin in a spinning one, and
between epochs the worker spins up to the channel's budget. The runs thus compare the
two ends blocking with the two spinning, which is what pays or not: where the kernel
puts a blocking pair on one CPU (where waking there is cheap), one end spinning alone
holds the CPU the other needs, and only both spinning, on separate CPUs, saves the
wake-ups. Before each spinning run, and after a spin that ran out without its reply, the
waiting thread moves off its worker's CPU where it shares it
(:class:`~edge_core.host.apart.Apart`). A worker that did not offer ``spin-follow``
measures whether spinning pays on its own waits with the same rule
(:mod:`edge_contracts.worker_spin`, :mod:`edge_contracts.spin_budget`). Under the
override the worker has the override's fixed budget from its boot configuration and is
told nothing.

One :class:`SpinGovernor` per controller process (:func:`governor`) holds each governed
channel's figures, decision and worker cap, and re-decides them all when a worker starts
or retires.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable

import attrs

from edge_contracts.spin_budget import (
    BUDGET_MARGIN,
    CAUGHT_PERCENTILE,
    FIRST_INTERVAL,
    MAX_INTERVAL,
    MIN_WAKE_US,
    RUN_WAITS,
    SETTLE_WAITS,
    SPIN_CPU_RATIO,
    SPIN_PER_WAKE,
    WINDOW_PAIRS,
    SpinHistory,
    WaitFigures,
    settle_budget,
    spin_budget,
    wait_figures,
)
from edge_contracts.waiting import DEFAULT_SPIN_US, ReadableWait, WaitSamples, spin_override_us
from edge_core.host.apart import Apart

__all__ = [
    "BUDGET_MARGIN",
    "CAUGHT_PERCENTILE",
    "FIRST_INTERVAL",
    "MAX_INTERVAL",
    "MIN_WAKE_US",
    "RUN_WAITS",
    "SETTLE_WAITS",
    "SPIN_CPU_RATIO",
    "SPIN_PER_WAKE",
    "WINDOW_PAIRS",
    "SpinDecision",
    "SpinGovernor",
    "WaitFigures",
    "decide_spin",
    "governor",
    "pair_cpu_clock",
    "usable_cores",
    "wait_figures",
    "worker_spin_cap",
    "worker_spin_us",
]

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
    *, override_us: int | None, cores: int, processes: int, figures: WaitFigures | None
) -> SpinDecision:
    """Decide a channel's spin budget (pure: the tests drive it with made-up figures).

    Args:
        override_us: the :data:`~edge_contracts.waiting.SPIN_ENV` budget, None when unset.
        cores: CPUs the controller may use.
        processes: the controller plus the workers it runs.
        figures: the channel's latest window of measured waits; None while it has none.

    """
    if override_us is not None:
        return SpinDecision(override_us, f"EDGE_SPIN_US={override_us}")
    if processes > cores:
        return SpinDecision(0, f"{processes} processes share {cores} "
                               + ("core" if cores == 1 else "cores"))
    if figures is None:
        return SpinDecision(0, "waits not measured yet")
    budget, reason = spin_budget(figures, DEFAULT_SPIN_US)
    return SpinDecision(budget, reason)


def worker_spin_cap(*, override_us: int | None, cores: int, processes: int) -> int:
    """The most a governed worker may spin for its next request (µs; 0: it blocks).

    :data:`~edge_contracts.waiting.DEFAULT_SPIN_US` while the controller runs no more
    processes than ``cores`` (the rule its own spin keeps), else 0; under the override 0
    (the worker was given the override's fixed budget at boot). Whether spinning pays,
    and how long, the worker measures on its own waits (:mod:`edge_contracts.worker_spin`).
    """
    if override_us is not None or processes > cores:
        return 0
    return DEFAULT_SPIN_US


def worker_spin_us() -> int:
    """The budget a new worker gets for waiting for its next request (the override, else 0)."""
    override = spin_override_us()
    return 0 if override is None else override


def pair_cpu_clock(peer_pid: int) -> Callable[[], int | None]:
    """A clock of the CPU this process and its worker ``peer_pid`` have used (ns).

    This process's CPU (all its threads) plus the worker's main thread's, which serves
    its requests and spins for the next (``/proc/PID/schedstat``, Linux). The clock
    reads None where the worker's figure cannot be read (another system, or the worker
    gone): the governor then judges a window without CPU figures.
    """
    path = f"/proc/{peer_pid}/schedstat"
    process_ns = time.process_time_ns

    def cpu() -> int | None:
        try:
            with open(path, "rb") as handle:
                worker_ns = int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return process_ns() + worker_ns

    return cpu


@attrs.define
class _Channel:
    """What the governor holds for one governed wait."""

    decision: SpinDecision
    figures: WaitFigures | None = None
    windows: int = 0
    worker_cap: int = 0  # what the worker is allowed now (it starts with none)
    worker_follow: int | None = None  # what it spins as told (None: it measures)
    tell: Callable[[], object] | None = None
    peer_pid: int | None = None  # the worker's, for the CPU its windows measure
    # what its windows decided so far (settle_budget), and whether they turned it on
    history: SpinHistory = attrs.Factory(SpinHistory)
    confirmed: bool = False


class SpinGovernor:
    """Sizes the spin budget of the controller's governed channel waits (see the module).

    Thread-safe. Waits are held weakly and counted as one worker each.

    Args:
        cores: CPUs the controller may use (default: :func:`usable_cores`).

    """

    def __init__(self, cores: int | None = None) -> None:
        self._cores = usable_cores() if cores is None else cores
        self._lock = threading.Lock()
        self._channels: weakref.WeakKeyDictionary[ReadableWait, _Channel] = (
            weakref.WeakKeyDictionary())
        self._decision = self._decide(None)
        self._figures: WaitFigures | None = None
        self._windows = 0

    @property
    def decision(self) -> SpinDecision:
        """The decision made last, for whichever channel (at a start, retirement or window)."""
        return self._decision

    @property
    def wake_us(self) -> float | None:
        """The saving (µs) the latest window of any channel measured (None before any)."""
        return None if self._figures is None else round(self._figures.saving_us, 3)

    @property
    def figures(self) -> WaitFigures | None:
        """The latest window's figures, of whichever channel (None before any)."""
        return self._figures

    @property
    def windows(self) -> int:
        """Windows decided since the process started (or the last :meth:`reset`)."""
        return self._windows

    @property
    def cores(self) -> int:
        """The CPUs the decision counts."""
        return self._cores

    def decision_for(self, wait: ReadableWait) -> SpinDecision | None:
        """The budget ``wait`` has now and why (None: not governed)."""
        with self._lock:
            channel = self._channels.get(wait)
            return None if channel is None else channel.decision

    def worker_cap_for(self, wait: ReadableWait) -> int | None:
        """The most the worker behind ``wait`` may spin for its next request (None: not governed).

        See :func:`worker_spin_cap`; the worker measures whether spinning pays itself.
        """
        with self._lock:
            channel = self._channels.get(wait)
            return None if channel is None else channel.worker_cap

    def worker_follow_for(self, wait: ReadableWait) -> int | None:
        """What the worker behind ``wait`` spins for its next request, as told (µs).

        None: nothing to follow (not governed, or no waits measured: the worker measures
        its own). While the channel measures a run of spinning waits, the probe's budget;
        a blocking run, 0; between runs, the channel's own budget: the controller
        measures both ends blocking against both spinning, since where the kernel puts
        a blocking pair on one CPU neither end's spin pays alone.
        """
        with self._lock:
            channel = self._channels.get(wait)
            return None if channel is None else channel.worker_follow

    def follow(self, wait: ReadableWait, tell: Callable[[], object]) -> None:
        """Call ``tell()`` now and whenever the worker cap of governed ``wait`` changes.

        ``tell`` runs outside the governor's lock, in the thread that made the change
        (a start, a retirement, a reset); it reads :meth:`worker_cap_for` itself, so that
        two changes told in either order leave the worker with the latest cap.
        """
        with self._lock:
            channel = self._channels.get(wait)
            if channel is None:
                return
            channel.tell = tell
        tell()

    def attach(self, wait: ReadableWait, peer_pid: int | None = None) -> None:
        """Govern ``wait`` (one more worker) and re-decide every governed budget.

        With ``peer_pid`` (the worker's process id) the thread that spins in ``wait``
        keeps off the worker's CPU (:class:`~edge_core.host.apart.Apart`).
        """
        if peer_pid is not None:
            wait.apart = Apart(peer_pid)
        wait.on_run = _RunHook(self, wait)
        with self._lock:
            self._channels[wait] = _Channel(SpinDecision(0, "waits not measured yet"),
                                            peer_pid=peer_pid)
            changed = self._apply()
        _tell(changed)

    def detach(self, wait: ReadableWait) -> None:
        """Stop governing ``wait`` (its worker is gone) and re-decide the others."""
        with self._lock:
            if self._channels.pop(wait, None) is not None:
                wait.samples = None
                wait.apart = wait.on_run = None
            changed = self._apply()
        _tell(changed)

    def reset(self, cores: int | None = None) -> None:
        """Forget every measured window; with ``cores``, count that many from now on.

        For tests, and for a controller that is told to use fewer cores than it may.
        """
        with self._lock:
            if cores is not None:
                if type(cores) is not int or cores < 1:
                    raise ValueError(f"cores: must be a positive integer: {cores!r}")
                self._cores = cores
            for wait, channel in list(self._channels.items()):
                channel.figures = None
                channel.history, channel.confirmed = SpinHistory(), False
                wait.samples = None  # measured from scratch (every wait) by _apply
            self._figures = None
            self._windows = 0
            changed = self._apply()
        _tell(changed)

    def _decide(self, figures: WaitFigures | None) -> SpinDecision:
        return decide_spin(override_us=spin_override_us(), cores=self._cores,
                           processes=1 + len(self._channels), figures=figures)

    def _apply(self) -> list[Callable[[], object]]:
        """Re-decide every governed wait and set its budget (holding the lock).

        Returns the followers (:meth:`follow`) whose worker cap changed, to be told
        once the lock is released.
        """
        override = spin_override_us()
        processes = 1 + len(self._channels)
        measure = (override is None and processes <= self._cores)
        cap = worker_spin_cap(override_us=override, cores=self._cores, processes=processes)
        changed = []
        for wait, channel in list(self._channels.items()):
            decision = self._decide(channel.figures)
            if measure and decision.spin_us and not channel.confirmed:  # (not windows enough)
                decision = _unconfirmed(decision, channel.history)
            self._set(wait, channel, decision)
            if channel.worker_cap != cap:
                channel.worker_cap = cap
                if channel.tell is not None:
                    changed.append(channel.tell)
            if not measure:
                wait.samples = None
                if channel.worker_follow is not None:
                    channel.worker_follow = None
                    if channel.tell is not None and channel.tell not in changed:
                        changed.append(channel.tell)
            elif wait.samples is None:
                samples = WaitSamples(self._window, pairs=WINDOW_PAIRS, run=RUN_WAITS,
                                      settle=SETTLE_WAITS, probe_us=DEFAULT_SPIN_US)
                if channel.peer_pid is not None:
                    samples.cpu = pair_cpu_clock(channel.peer_pid)
                wait.samples = samples
        if not self._channels:
            self._decision = self._decide(None)
        return changed

    def _set(self, wait: ReadableWait, channel: _Channel, decision: SpinDecision) -> None:
        """Give ``wait`` the budget ``decision`` says (holding the lock)."""
        channel.decision = self._decision = decision
        figures = channel.figures
        wake = 0 if figures is None else max(0, min(DEFAULT_SPIN_US, round(figures.saving_us)))
        wait.spin_us = decision.spin_us
        wait.wake_us = wake if decision.spin_us else 0
        wait.forget()

    def on_run(self, wait: ReadableWait, kind: bool | None) -> None:
        """Hear that a run of ``wait``'s measured waits begins, or that an epoch ended.

        ``kind``: True for a spinning run, False for a blocking one, None at an epoch's
        end (:attr:`~edge_contracts.waiting.ReadableWait.on_run`). Runs in the thread of
        the wait. The worker is told to wait the same way meanwhile, and after the epoch
        as the channel's budget says; before a spinning run the waiting thread moves off
        the worker's CPU where it shares it.
        """
        with self._lock:
            channel = self._channels.get(wait)
            samples = wait.samples
            if channel is None or samples is None:
                return
            follow = (samples.probe_ns // 1000 if kind else 0 if kind is False
                      else channel.decision.spin_us)
            tell = channel.tell if follow != channel.worker_follow else None
            channel.worker_follow = follow
        if tell is not None:
            tell()
        if kind and wait.apart is not None:
            wait.apart()

    def _window(self, samples: WaitSamples) -> None:
        """A governed wait's window is full: re-decide its budget and how often it measures.

        Runs in the thread of the wait whose samples these are.
        """
        figures = wait_figures(samples.blocking_ns, samples.spinning_ns, samples.spun_ns,
                               samples.caught_ns, samples.blocking_cpu_ns,
                               samples.spinning_cpu_ns)
        samples.clear()
        with self._lock:
            found = [(wait, channel) for wait, channel in self._channels.items()
                     if wait.samples is samples]
            if not found:  # stopped meanwhile
                return
            wait, channel = found[0]
            channel.figures = self._figures = figures
            channel.windows += 1
            samples.probe_ns = 1000 * max(1, min(DEFAULT_SPIN_US, math.ceil(figures.blocking_us)))
            self._windows += 1
            verdict = self._decide(figures)
            budget, samples.interval, channel.history = settle_budget(
                channel.history, samples.interval, channel.decision.spin_us, verdict.spin_us)
            channel.confirmed = bool(budget)
            self._set(wait, channel, verdict if budget else
                      _unconfirmed(verdict, channel.history) if verdict.spin_us else verdict)


class _RunHook:
    """A governed wait's ``on_run``: its governor's, holding the wait weakly."""

    __slots__ = ("_governor", "_wait")

    def __init__(self, spins: SpinGovernor, wait: ReadableWait) -> None:
        self._governor = spins
        self._wait = weakref.ref(wait)

    def __call__(self, kind: bool | None) -> None:
        wait = self._wait()
        if wait is not None:
            self._governor.on_run(wait, kind)


def _unconfirmed(verdict: SpinDecision, history: SpinHistory) -> SpinDecision:
    """No budget yet where ``verdict`` would spin: too few windows in a row said so."""
    return SpinDecision(0, f"{verdict.reason}; blocks until {history.needed} windows in a row"
                           f" find spinning pays ({history.pending} so far)")


def _tell(followers: list[Callable[[], object]]) -> None:
    for tell in followers:
        tell()


_GOVERNOR = SpinGovernor()


def governor() -> SpinGovernor:
    """The controller process's one governor."""
    return _GOVERNOR
