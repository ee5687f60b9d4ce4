"""The placement a pipeline serves on, switched only at a request boundary, and its receipt.

A :class:`Serving` is one placement ready to serve: its stage slots, a replica set and
an input transform per stage, and how it was decided. A request takes the current one
when it starts (:meth:`ServingLineup.enter`) and keeps it — every stage of that request
runs on it — until its result is acknowledged (:meth:`ServingLineup.leave`). A switch
(:meth:`ServingLineup.switch`, a first-ready start's) makes a new placement current for
the requests that start after it; requests in flight finish where they started, so no
request sees two backends for one stage, and the old placement is retired only once no
request holds it (:meth:`ServingLineup.wait_idle`).

Every answer carries the placement's receipt (:meth:`Serving.receipt`): per stage the
backend, the execution provider, the candidate, the worker generation and where the
decision came from (``measured`` now, ``reused`` from a stored decision, ``first-ready``
before the measurement ended, ``first-passing``, or ``only`` for a stage without a
choice). Only the generations change while a placement serves, so a request records
them (:meth:`Serving.generations`) and its receipt is built from them when it is read,
once per set of generations (:meth:`Serving.receipt_of`).

A placement of one stage (:attr:`Serving.direct`) is served without the chain: its
request goes to the stage's replica set as it is (:meth:`Pipeline.run
<edge_core.runtime.pipeline.Pipeline.run>`), and a submission given an event loop is sent
from the loop and settled there by its reply, no request thread between
(:meth:`Pipeline.submit <edge_core.runtime.pipeline.Pipeline.submit>`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from edge_core.runtime.bundle_folders import BundleFolders
from edge_core.runtime.chain import Transform, with_bundles
from edge_core.runtime.replicas import ReplicaSet
from edge_core.runtime.stage_runtime import StageRuntime
from edge_core.runtime.stage_slot import StageSlot

__all__ = ["DECISIONS", "Serving", "ServingLineup"]

DECISIONS = ("measured", "reused", "first-ready", "first-passing", "only")
"""Where a stage's placement came from, as a receipt says."""


def _groups(slots: Sequence[StageSlot]) -> list[ReplicaSet]:
    """The replicas of each configured stage, in data-flow order."""
    by_id: dict[str, list[StageRuntime]] = {}
    for slot in slots:
        assert slot.runtime is not None
        by_id.setdefault(slot.context.stage_id, []).append(slot.runtime)
    return [ReplicaSet(runtimes) for runtimes in by_id.values()]


class Serving:
    """One placement ready to serve (see the module's docstring).

    Args:
        slots: Every stage replica, in data-flow order.
        decisions: Stage id → where its placement came from (one of :data:`DECISIONS`).
        number: The placement's number: 1 at open, one more at each switch.
        measured_at: When the decision was measured (UTC ISO 8601), if it was.
    """

    def __init__(self, slots: Sequence[StageSlot], decisions: Mapping[str, str],
                 number: int = 1, measured_at: str | None = None) -> None:
        self.slots = list(slots)
        self.decisions = dict(decisions)
        self.number = number
        self.measured_at = measured_at
        self.groups = _groups(self.slots)
        self.transforms: list[Transform | None] = [
            with_bundles(s.transform, self.bundle_directories)
            for s in self.slots if s.context.replica == 0]
        self.holds = 0
        self.direct: ReplicaSet | None = self.groups[0] if len(self.groups) == 1 else None
        """The one stage's replica set when the placement has one stage (no chain), else None."""
        self.single_worker = self.direct is not None and len(self.direct.runtimes) == 1
        """One stage of one replica: a request's result names the generation of the receipt."""
        self.lone: StageRuntime | None = self.slots[0].runtime if len(self.slots) == 1 else None
        """The runtime of the placement's one stage replica (the caller's parameters reach
        it as they are), else None."""
        self.final_stage_id = self.slots[-1].context.stage_id
        """The id of the stage whose result a request's is (its latency is named so)."""
        self._heads = [s for s in self.slots if not s.context.replica]  # replica 0 of each
        self._receipts: dict[tuple[int | None, ...], tuple[dict[str, Any], ...]] = {}

    def bundle_directories(self) -> BundleFolders:
        """Stage id → the folder of the verified bundle its worker loaded (or None).

        Its bytes as loaded: a folder verified in place is checked when looked up
        (:mod:`~edge_core.runtime.bundle_folders`); a ``BundleChanged`` met there marks
        the stage's replicas (:meth:`StageRuntime.note_bundle_changed`).
        """
        return BundleFolders({s.context.stage_id: s.runtime.loaded if s.runtime else None
                              for s in self.slots}, self._bundle_changed)

    def _bundle_changed(self, stage_id: str, error: BaseException) -> None:
        """A lookup met ``BundleChanged`` for ``stage_id``: mark each of its replicas."""
        for slot in self.slots:
            if slot.context.stage_id == stage_id and slot.runtime is not None:
                slot.runtime.note_bundle_changed(error)

    def generations(self) -> tuple[int | None, ...]:
        """The worker generation of each stage (replica 0) now: what a receipt records."""
        return tuple([s.runtime.generation if s.runtime is not None else None
                      for s in self._heads])

    def receipt(self) -> list[dict[str, Any]]:
        """Per stage (replica 0): backend, provider, candidate, generation, decision."""
        return [dict(stage) for stage in self.receipt_of(self.generations())]

    def receipt_of(self, generations: tuple[int | None, ...]) -> tuple[dict[str, Any], ...]:
        """The receipt of a request served by ``generations`` (kept: do not change it)."""
        found = self._receipts.get(generations)
        if found is not None:
            return found
        stages = []
        for slot, generation in zip(self._heads, generations, strict=True):
            warmup = slot.warmup
            decision = self.decisions.get(slot.context.stage_id, "only")
            stages.append({
                "stage": slot.context.stage_id, "backend": slot.binding.backend.name,
                "provider": warmup.placement.target if warmup is not None else None,
                "candidate": slot.candidate, "generation": generation,
                "placement": self.number, "decision": decision,
                "measured_at": self.measured_at if decision in ("measured", "reused")
                else None})
        found = tuple(stages)
        if len(self._receipts) >= 64:  # restarts make new generations: keep a few
            self._receipts.clear()
        self._receipts[generations] = found
        return found


class ServingLineup:
    """The current :class:`Serving` placement and the ones still finishing requests."""

    def __init__(self, serving: Serving, *, lock: threading.RLock | None = None) -> None:
        """Serve on ``serving`` first.

        ``lock``: the lineup's lock (reentrant), when its owner shares its own: the owner
        may then enter and leave within its own lock sections (:meth:`enter_held`,
        :meth:`leave_held`).
        """
        self.current = serving
        self._lock = threading.RLock() if lock is None else lock
        self._idle = threading.Condition(self._lock)
        self._idle_waiters = 0  # threads in wait_idle: leave notifies only then
        self._answered = False  # first_answered is set (read without a call)
        self.first_answered = threading.Event()
        """Set once the first request's result was acknowledged."""

    def enter(self) -> Serving:
        """Take the current placement for one request (hold it until :meth:`leave`)."""
        with self._lock:
            return self.enter_held()

    def enter_held(self) -> Serving:
        """:meth:`enter` within a section of the lineup's lock (its owner's: see ``lock``)."""
        serving = self.current
        serving.holds += 1
        return serving

    def leave(self, serving: Serving, *, answered: bool = True) -> None:
        """The request that entered ``serving`` is done (its result acknowledged).

        ``answered=False``: it leaves unanswered, to enter again on another path (the
        first answer is not counted).
        """
        with self._lock:
            self.leave_held(serving, answered)

    def leave_held(self, serving: Serving, answered: bool = True) -> None:
        """:meth:`leave` within a section of the lineup's lock (its owner's: see ``lock``)."""
        serving.holds -= 1
        if self._idle_waiters and serving.holds <= 0:
            self._idle.notify_all()
        if not self._answered and answered:  # set takes a lock and notifies: once is enough
            self._answered = True
            self.first_answered.set()

    def left_held(self, serving: Serving, answered: bool = True) -> None:
        """What :meth:`leave_held` does after its count, for an owner that counted it itself.

        Within a section of the lineup's lock, once the owner took one from
        ``serving.holds`` (in a run of statements without a call, with what else it gives
        back): idle waiters woken, the first answer noted.
        """
        if self._idle_waiters and serving.holds <= 0:
            self._idle.notify_all()
        if not self._answered and answered:
            self._answered = True
            self.first_answered.set()

    def switch(self, serving: Serving) -> Serving:
        """Make ``serving`` current for requests that start from now on; return the old."""
        with self._lock:
            old, self.current = self.current, serving
            return old

    def wait_idle(self, serving: Serving, timeout_s: float) -> bool:
        """Wait until no request holds ``serving``; False when ``timeout_s`` passed first."""
        end = time.monotonic() + timeout_s
        with self._lock:
            self._idle_waiters += 1
            try:
                while serving.holds > 0:
                    left = end - time.monotonic()
                    if left <= 0:
                        return False
                    self._idle.wait(left)
                return True
            finally:
                self._idle_waiters -= 1
