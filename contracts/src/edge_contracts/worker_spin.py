"""How long a worker spins for its next request: a cap it is permitted, a budget told or measured.

A worker that blocks for its next request is woken by the controller's send: on a
virtual machine an inter-processor interrupt and a reschedule on both sides (the
controller's send pays for the wake-up too). A worker that is already polling when the
request comes wakes nobody; and where the controller spins for the reply as well,
neither side pays the kernel's wake-up path. That pays only for a back-to-back caller
(a benchmark loop, a client sending request after request, the next stage of a
pipeline), only where waking is slow, and only where the worker has a core to spin on.

* **The cap** is the controller's (``spin`` frames, :data:`~edge_contracts.protocol.OP_SPIN`,
  with the ``worker-spin`` feature): it permits up to
  :data:`~edge_contracts.waiting.DEFAULT_SPIN_US` only while it runs no more processes
  than the cores it may use, and tells every worker again when a worker starts or
  retires (``edge_core.host.spinning``). A worker starts with none: it blocks.
* **What it spins within the cap** the controller says, where the worker offered
  ``spin-follow`` (:data:`~edge_contracts.protocol.FEATURE_SPIN_FOLLOW`): the ``spin``
  frame's ``follow_us``, sent as each of the controller's measured runs begins (its
  probe's budget for a spinning run, 0 for a blocking one) and as each epoch ends (the
  channel's budget). The controller's runs then compare both ends blocking with both
  spinning, which is what pays or not: where the kernel puts a blocking pair on one CPU,
  one end spinning alone holds the CPU the other needs. A worker that follows measures
  nothing itself, and spins up to what it was told on every wait (no running average,
  below): an idle gap costs it one spin, and whether spinning still pays the
  controller's next window says.
* **Otherwise, whether spinning pays, and how long**, the worker measures on its own
  waits for its next frame, all its life, as the controller does on its waits for replies
  (:mod:`edge_contracts.spin_budget`): now and then a run of
  :data:`~edge_contracts.spin_budget.RUN_WAITS` waits blocks at once and another spins
  first for up to the cap, and each run's *cycles* (from the end of one wait to the end
  of the next: the request's execution, its reply and the wait for the next request)
  are compared; :func:`~edge_contracts.spin_budget.spin_budget` says what budget the
  window justifies (0 where waking is cheap, or where the next request does not come
  within a spin), and :func:`~edge_contracts.spin_budget.settle_budget` whether it
  applies yet (a worker that blocks spins only once windows in a row say so; one that
  spins stops at the first that says not). Until then, the worker blocks.
* **Between windows** a worker that measures spins only while the waits it has recently seen came
  within the budget (:class:`~edge_contracts.waiting.ReadableWait`'s running average, a
  blocked wait counted less the saving measured): an idle gap, or slow traffic, turns
  the spin off until requests come back to back again. The worker never spins while it
  executes (it waits only when nothing is left to run), nor while a streaming call runs
  on the handler's own threads (then it waits in a plain blocking poll).

:data:`~edge_contracts.waiting.SPIN_ENV` overrides all of this on both ends: the boot
configuration's ``spin_us`` is then a fixed budget, nothing is measured and ``spin``
frames change nothing. Standard library only.
"""

from __future__ import annotations

import math
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_contracts.spin_budget import (
    RUN_WAITS,
    SETTLE_WAITS,
    WINDOW_PAIRS,
    SpinHistory,
    settle_budget,
    spin_budget,
    wait_figures,
)
from edge_contracts.waiting import MAX_SPIN_US, ReadableWait, WaitSamples

__all__ = ["NextFrameSpin"]


class NextFrameSpin:
    """Sizes the spin budget of a worker's wait for its next frame (see the module).

    Not thread-safe: used on the worker's loop thread only (the ``spin`` frames are read
    there, and the wait's windows end there).

    Args:
        wait: the wait for the worker's next frame; its budget is set here.
        fixed_us: the boot configuration's fixed budget (the override); when not 0,
            nothing is measured and the cap changes nothing.

    Attributes:
        cap_us: the most the controller permits now (0: block).
        budget_us: the budget in use (µs).
        reason: what decided it.
        windows: windows of measured waits decided so far.
        following: set while it spins as the controller says (``follow_us``), measuring
            nothing itself.
        settled: set when a window decided no budget: until the next measured wait
            (:meth:`~edge_contracts.waiting.ReadableWait.plain_waits`) the loop may wait
            in a plain blocking poll instead; its reader clears it.

    """

    __slots__ = ("_fixed", "_history", "_wait", "budget_us", "cap_us", "following", "reason",
                 "settled", "windows")

    def __init__(self, wait: ReadableWait, fixed_us: int) -> None:
        if type(fixed_us) is not int or not 0 <= fixed_us <= MAX_SPIN_US:
            raise InvalidValue("boot.spin_us", fixed_us,
                               f"must be an integer in 0..{MAX_SPIN_US}")
        self._wait = wait
        self._fixed = fixed_us
        self.cap_us = 0
        self.budget_us = fixed_us
        self.reason = f"fixed at boot ({fixed_us} us)" if fixed_us else "not permitted"
        self.windows = 0
        self.settled = False
        self.following = False
        self._history = SpinHistory()
        wait.spin_us = fixed_us

    @property
    def active(self) -> bool:
        """True when the next-frame wait may spin (then it goes through the wait's poll)."""
        return bool(self._fixed or (self.budget_us if self.following else self.cap_us))

    def permit(self, cap_us: int, follow_us: int | None = None) -> None:
        """Take the controller's cap (µs; 0: block from now on), and what to follow.

        With ``follow_us`` the worker spins that long (within the cap) and measures
        nothing itself: the controller measures both ends at once and says what it
        spins (see the module). Without it, the worker measures its own waits; one that
        followed until now starts measuring from scratch.

        Raises:
            InvalidValue: naming ``spin.cap_us`` or ``spin.follow_us`` for anything but
                an integer in ``0..MAX_SPIN_US`` (the cap in use stays).

        """
        if type(cap_us) is not int or not 0 <= cap_us <= MAX_SPIN_US:
            raise InvalidValue("spin.cap_us", cap_us, f"must be an integer in 0..{MAX_SPIN_US}")
        if follow_us is not None and (type(follow_us) is not int
                                      or not 0 <= follow_us <= MAX_SPIN_US):
            raise InvalidValue("spin.follow_us", follow_us,
                               f"must be an integer in 0..{MAX_SPIN_US}")
        before, self.cap_us = self.cap_us, cap_us
        if self._fixed:
            return
        wait = self._wait
        if follow_us is not None and cap_us:
            self._follow(min(cap_us, follow_us))
            return
        if self.following:  # no longer told what to spin: measured from scratch
            self.following = False
            wait.gated = True
            before = 0
        if not cap_us:
            wait.samples = None
            wait.spin_us = wait.wake_us = self.budget_us = 0
            self.reason = "not permitted"
            return
        if not before:  # measured from scratch: the window decides
            wait.spin_us = wait.wake_us = self.budget_us = 0
            self._history = SpinHistory()
            wait.samples = WaitSamples(self._window, pairs=WINDOW_PAIRS, run=RUN_WAITS,
                                       settle=SETTLE_WAITS, probe_us=cap_us)
            self.reason = "waits not measured yet"
        elif self.budget_us > cap_us:
            wait.spin_us = self.budget_us = cap_us
        samples = wait.samples
        if samples is not None:
            samples.probe_ns = min(samples.probe_ns, 1000 * cap_us)

    def _follow(self, budget_us: int) -> None:
        """Spin ``budget_us`` for the next frame, as the controller says; measure nothing."""
        wait = self._wait
        if not self.following:
            self.following = True
            wait.samples = None
            wait.wake_us = 0
            wait.gated = False  # every wait spins the budget: the controller measures
            self.settled = False
        wait.spin_us = self.budget_us = budget_us
        self.reason = (f"follows the controller: spins up to {budget_us} us" if budget_us
                       else "follows the controller: blocks")

    def state(self) -> dict[str, Any]:
        """What a ``ping`` answers about it: cap, budget, reason, windows, spinning now."""
        return {"cap_us": self.cap_us, "budget_us": self.budget_us, "reason": self.reason,
                "windows": self.windows, "spinning": self._wait.spinning}

    def _window(self, samples: WaitSamples) -> None:
        """A window of measured waits is in: re-decide the budget and how often to measure."""
        figures = wait_figures(samples.blocking_ns, samples.spinning_ns, samples.spun_ns,
                               samples.caught_ns)
        samples.clear()
        cap = self.cap_us
        before = self.budget_us
        budget, self.reason = spin_budget(figures, cap)
        self.budget_us, samples.interval, self._history = settle_budget(
            self._history, samples.interval, before, budget)
        if budget and not self.budget_us:
            self.reason += (f"; blocks until {self._history.needed} windows in a row find"
                            f" spinning pays ({self._history.pending} so far)")
        self.windows += 1
        wait = self._wait
        wait.spin_us = self.budget_us
        wait.wake_us = (max(0, min(cap, round(figures.saving_us))) if self.budget_us else 0)
        wait.forget()
        samples.probe_ns = 1000 * max(1, min(cap, math.ceil(figures.blocking_us)))
        self.settled = not self.budget_us
