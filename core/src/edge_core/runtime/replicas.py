"""A stage served by several reserved, gated workers: pick a free one, wait for one.

``replicas = N`` on a stage makes the pipeline reserve, load and gate N workers (each its
own :class:`~edge_core.runtime.stage_runtime.StageRuntime`, with its own ledger owner
``pipeline/stage#r``). A :class:`ReplicaSet` sends each call to the ready replica with the
most free slots (round robin among equals); when every slot is taken it waits, woken by
any replica's release, up to the caller's deadline. Waiters are served first come, first
served: while anyone waits, a non-blocking :meth:`ReplicaSet.try_submit` does not overtake
them (without this, under four concurrent pages one page's chunk waited behind others for
p95 21 s against a p50 of 8 s). A replica whose worker is lost is
skipped until it is ready again: its own requests fail with typed errors, the others keep
serving; the replica's own runtime retires it, settles its reservation and — under
``restart = "on-failure"`` — restarts it alone (:mod:`edge_core.runtime.restarts`). While
no replica is ready but one is restarting or will be (:meth:`ReplicaSet.restart_pending`),
a request waits for it — holding its admission slot — up to its deadline (else the
stage's ``call_timeout_s``); a cancel ends that wait. Only when no replica is ready and
none will come back does the stage refuse with ``StageClosed``;
:meth:`ReplicaSet.summary` says how many are live.

Input buffers (:meth:`ReplicaSet.input_buffer`) live in one replica's shared memory: each
new one goes to the serving replica that holds the fewest, and a request that carries one
is routed to its owner (it waits for the owner's slot rather than go elsewhere by copy),
so it always travels by reference. Only when the owner no longer serves (its worker was
lost or restarted) does the request go to another replica, the buffer copied like any
array.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edge_core.backend import CancelOutcome
from edge_core.errors import DeadlineExceeded, ResourceUnavailable, StageClosed, WorkerError
from edge_core.host.errors import InputBufferBusy, TransportCapExceeded
from edge_core.runtime.admission import SlotsTaken
from edge_core.runtime.deadlines import deadline_until
from edge_core.runtime.errors import RequestCancelled
from edge_core.runtime.fence import FenceOutcome, strongest_fence
from edge_core.runtime.health import StageState, replica_summary
from edge_core.runtime.pending import CallStage, PendingCall
from edge_core.runtime.stage_runtime import StageRuntime

__all__ = ["ReplicaSet"]

_READY = StageState.READY  # (an enum class's attribute costs a metaclass hook on 3.11)
#: Longest sleep between checks while waiting for a slot (a closed stage is noticed).
_RECHECK_S = 0.05


def _worth_waiting(error: ResourceUnavailable) -> bool:
    """Whether a replica's refusal of a call after its slot was taken may pass with time.

    No for an input buffer the caller still holds (:class:`InputBufferBusy`) and for
    shared memory nothing in flight will give back (:class:`TransportCapExceeded` that
    does not clear): those are the caller's to fix. Yes for memory that clears and for a
    backend's own refusal: a request waits for those as for a slot, bounded by its
    deadline.
    """
    if isinstance(error, InputBufferBusy):
        return False
    if isinstance(error, TransportCapExceeded):
        return error.clears
    return True


def _worker_lost(runtime: StageRuntime) -> bool:
    """True when the replica's worker client says it is not ready any more."""
    client = getattr(runtime.loaded, "client", None)
    health = getattr(client, "health", None)
    if health is None:
        return False
    try:
        return str(health().state) != "ready"
    except Exception:
        return True


class ReplicaSet:
    """The replicas of one stage, in replica order.

    Args:
        runtimes: One runtime per replica (at least one).
    """

    def __init__(self, runtimes: Sequence[StageRuntime]) -> None:
        if not runtimes:
            raise ValueError("a replica set needs at least one runtime")
        self.runtimes = list(runtimes)
        self.lost: set[int] = set()
        self._lost_at: dict[int, int] = {}  # replica index → generation when it was lost
        # The lock is taken directly on the per-call paths; the Condition over it is for
        # waiting only, and is notified only while someone sleeps in it (_sleepers).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._sleepers = 0
        self._wakes = 0
        self._turn = itertools.count()
        self._tickets = itertools.count()
        self._waiting: collections.deque[int] = collections.deque()
        # A stage of one replica: the choice among replicas is no choice (see _submit_free).
        self._only = self.runtimes[0] if len(self.runtimes) == 1 else None
        # The replicas' pools call _wake on every release only once a request has had
        # to wait here (_listen): until then a release has nobody to wake.
        self._listening = False

    @property
    def stage_id(self) -> str:
        """The stage's id."""
        return self.runtimes[0].stage_id

    @property
    def capacity(self) -> int:
        """In-flight calls the serving replicas can take at once."""
        return sum(r.slots.limit for i, r in enumerate(self.runtimes) if i not in self.lost)

    def summary(self) -> dict[str, object]:
        """``{"declared", "live", "state"}`` (:func:`~edge_core.runtime.health.replica_summary`)."""
        return replica_summary([r.state for r in self.runtimes])

    def _listen(self) -> None:
        """Have every replica's pool call :meth:`_wake` on release from now on (holding the lock).

        Called as the first waiter queues its ticket, before it first tries a replica: a
        release before this freed its slot for that try; one after calls ``_wake``.
        """
        if not self._listening:
            for runtime in self.runtimes:
                runtime.slots.listeners.append(self._wake)
            self._listening = True

    def _wake(self) -> None:
        if not self._waiting:  # read without the lock (see submit): nobody to wake
            # A waiter queues its ticket before it first tries a replica, and a pool's
            # release frees the slot before it calls here: one queued after this read
            # finds the slot free on that first try.
            return
        with self._lock:
            self._wakes += 1
            if self._sleepers:
                self._cond.notify_all()

    def note_failure(self, stage: CallStage) -> None:
        """After a failed call on ``stage``: stop routing to that replica if its worker is gone."""
        for index, runtime in enumerate(self.runtimes):
            if runtime is stage and _worker_lost(runtime):
                self.lost.add(index)
                self._lost_at[index] = runtime.generation
                self._wake()

    def _serving(self) -> list[StageRuntime]:
        """The replicas that take calls now (ready and not lost), in replica order."""
        if not self.lost:  # the usual case
            return [r for r in self.runtimes if r.state is StageState.READY]
        for index in list(self.lost):  # restarted (by hand or by its policy) since
            if self.runtimes[index].generation != self._lost_at.get(index):
                self.lost.discard(index)
        return [r for i, r in enumerate(self.runtimes)
                if i not in self.lost and r.state is StageState.READY]

    def _states(self) -> dict[str, str]:
        return {r.stage_id + f"#{i}": ("lost" if i in self.lost else r.state.value)
                for i, r in enumerate(self.runtimes)}

    def restart_pending(self) -> bool:
        """True when some replica not serving now is being restarted or will be.

        See :meth:`StageRuntime.restart_pending`; a replica whose worker was found lost
        before its runtime noticed counts when its policy would restart it.
        """
        for index, runtime in enumerate(self.runtimes):
            if runtime.restart_pending():
                return True
            if (index in self.lost and runtime.state is StageState.READY
                    and runtime.restarter.pending):
                return True
        return False

    @property
    def restart_wait_s(self) -> float:
        """The longest a request without a deadline waits for a replica to come back.

        The stage's ``call_timeout_s`` (the largest of its replicas').
        """
        return max(r.call_timeout_s for r in self.runtimes)

    def _candidates(self) -> list[StageRuntime]:
        """Serving replicas, freest first; empty while none serves and a restart is pending.

        Raises:
            StageClosed: no replica serves and none will come back on its own.
        """
        serving = self._serving()
        if not serving:
            if self.restart_pending():
                return []
            raise StageClosed(f"stages[{self.stage_id}]: no replica serving and no restart "
                              f"pending: {self._states()}")
        if len(serving) == 1:
            return serving
        start = next(self._turn) % len(serving)
        rotated = serving[start:] + serving[:start]
        return sorted(rotated, key=lambda r: -r.slots.free)

    def input_buffer(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """An input buffer on the serving replica that holds the fewest.

        See :meth:`StageRuntime.input_buffer`; requests carrying it go to that replica.

        Raises:
            StageClosed: no replica is serving.
        """
        serving = self._candidates()
        counts = [r.input_buffer_counts()["buffers"] for r in serving]
        return serving[counts.index(min(counts))].input_buffer(name, shape, dtype)

    def owner_of(self, inputs: Mapping[str, Any]) -> StageRuntime | None:
        """The replica that owns an input buffer among ``inputs`` (the first found), if any."""
        if not inputs:
            return None
        for made in self.runtimes:  # a loop, not any(generator): no frame per replica
            if made.made_input_buffers:
                break
        else:
            return None  # the common case costs one attribute read per replica
        for value in inputs.values():
            for runtime in self.runtimes:
                if runtime.owns_input_buffer(value):
                    return runtime
        return None

    def input_buffer_counts(self) -> dict[str, int]:
        """Input-buffer counts summed over the replicas.

        ``buffers``: alive (or held by a request); ``sent``: requests that carried one by
        reference.
        """
        counts = [r.input_buffer_counts() for r in self.runtimes]
        return {key: sum(c[key] for c in counts) for key in ("buffers", "sent")}

    def try_submit(self, inputs: Mapping[str, Any], *,
                   params: Mapping[str, Any] | None = None, until: float | None = None,
                   request_id: str | None = None,
                   abandoned: Callable[[], bool] | None = None,
                   into: list[PendingCall] | None = None) -> PendingCall | None:
        """Submit on a replica with a free slot; ``None`` when none is free or others wait.

        ``abandoned`` and ``into`` go to the replica's :meth:`StageRuntime.submit`.

        Raises:
            StageClosed: no replica is serving.
        """
        with self._lock:
            if self._waiting:
                self._candidates()  # still refuses when no replica serves
                return None
        try:
            return self._submit_free(inputs, params, until, request_id, abandoned, into)
        except ResourceUnavailable as exc:
            if not _worth_waiting(exc):
                raise
            return None  # refused after its slot, for now: the caller waits

    def _submit_free(self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
                     until: float | None, request_id: str | None,
                     abandoned: Callable[[], bool] | None,
                     into: list[PendingCall] | None) -> PendingCall | None:
        only = self._only
        if only is not None and not self.lost and only.state is _READY:
            # One serving replica: no candidates to rank (None when it is full or closes
            # meanwhile, so that the caller waits, as below).
            if only.slots.free <= 0:
                return None
            if only.made_input_buffers:
                only.check_input_buffers(inputs)  # busy: refused at once, not after a slot
            return self._submit_to(only, inputs, params, until, request_id, abandoned,
                                   into)
        candidates = self._candidates()
        owner = self.owner_of(inputs)
        if owner is not None and any(owner is c for c in candidates):
            owner.check_input_buffers(inputs)  # busy: refused at once, not after its slot
            candidates = [owner]  # its input buffer goes by reference to it alone
        refused: ResourceUnavailable | None = None
        for runtime in candidates:
            if runtime.slots.free <= 0:
                continue
            try:
                call = self._submit_to(runtime, inputs, params, until, request_id, abandoned,
                                       into)
            except ResourceUnavailable as exc:
                if not _worth_waiting(exc):
                    raise
                refused = exc  # this one refused after its slot, for now: try the others
                continue
            if call is not None:
                return call
        if refused is not None:
            raise refused
        return None

    def _submit_to(self, runtime: StageRuntime, inputs: Mapping[str, Any],
                   params: Mapping[str, Any] | None, until: float | None,
                   request_id: str | None,
                   abandoned: Callable[[], bool] | None,
                   into: list[PendingCall] | None) -> PendingCall | None:
        """Submit on ``runtime`` if it takes the call now; None when it is taken or closed.

        Any other refusal (``ResourceUnavailable`` from the stage's call: its shared memory
        full, the backend's own "not now") is raised, for the caller to wait or not
        (:func:`_worth_waiting`).
        """
        try:
            return runtime.submit(inputs, params=params, until=until,
                                  request_id=request_id, abandoned=abandoned,
                                  wait_for_slot=False, into=into)
        except (SlotsTaken, StageClosed):
            return None  # taken or closed in between: try the next one
        except WorkerError:
            self.note_failure(runtime)
            if not _worker_lost(runtime):
                raise
        return None

    def submit(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
               deadline_s: float | None = None, until: float | None = None,
               request_id: str | None = None,
               abandoned: Callable[[], bool] | None = None,
               into: list[PendingCall] | None = None) -> PendingCall:
        """Submit on the freest replica, waiting for a slot up to ``deadline_s`` (None: no bound).

        An admitted request waits here rather than failing: the pipeline's admission
        already bounds how many requests can wait. ``until`` (monotonic) is the request's
        deadline: it bounds the wait and the call; ``request_id``, ``abandoned`` and
        ``into`` go to the replica's :meth:`StageRuntime.submit`.

        While no replica serves but one is restarting or will be (:meth:`restart_pending`),
        the request waits for it too — bounded by ``until``/``deadline_s``, else by
        :attr:`restart_wait_s` from when the wait for a restart began. ``abandoned()``
        turning True (the request was cancelled) ends any wait here. A replica that
        refuses the call after its slot was taken is waited for like a taken slot, asleep
        until a slot is released (or the recheck): its shared memory full with the inputs
        of its calls in flight (:class:`~edge_core.host.errors.TransportCapExceeded` that
        ``clears``), or its backend's own ``ResourceUnavailable`` from the call.

        Raises:
            StageClosed: no replica is serving and none will come back (or none came back
                within :attr:`restart_wait_s`, without a deadline).
            TransportCapExceeded: the request's inputs do not fit a replica's shared
                memory and no call in flight there would give any back (what fills it
                is the caller's, or the request alone is over the cap).
            ResourceUnavailable: no slot freed within ``deadline_s``.
            DeadlineExceeded: no slot freed (or no replica came back) before ``until``.
            RequestCancelled: ``abandoned()`` said so while waiting; nothing was sent.
        """
        only = self._only
        if not self._waiting:
            # Nobody queued (read without the lock: one arriving now is served after
            # this request, as if it had come a moment later): no ticket to take.
            if only is not None and not self.lost and only.state is _READY:
                # One serving replica: straight to it, as _submit_free would (its submit
                # takes a free slot or refuses with SlotsTaken, and checks ``abandoned``
                # under its lock; a stage full, filled or closed is waited for below).
                if only.made_input_buffers:
                    only.check_input_buffers(inputs)  # busy: refused at once
                try:
                    return only.submit(inputs, params=params, until=until,
                                       request_id=request_id, abandoned=abandoned,
                                       wait_for_slot=False, into=into)
                except (SlotsTaken, StageClosed):
                    pass  # taken or closed in between: wait for it below
                except ResourceUnavailable as exc:
                    if not _worth_waiting(exc):
                        raise
                    # else refused after its slot, for now: wait below, asleep
                except WorkerError:
                    self.note_failure(only)
                    if not _worker_lost(only):
                        raise
            elif abandoned is None or not abandoned():
                try:
                    call = self._submit_free(inputs, params, until, request_id, abandoned,
                                             into)
                except ResourceUnavailable as exc:
                    if not _worth_waiting(exc):
                        raise
                else:
                    if call is not None:
                        return call
        end = None if deadline_s is None else deadline_until(deadline_s)
        if until is not None:
            end = until if end is None else min(end, until)
        restart_end: float | None = None  # set once the wait for a restart begins
        with self._lock:
            self._listen()
            ticket = next(self._tickets)
            self._waiting.append(ticket)
        try:
            while True:
                if abandoned is not None and abandoned():
                    raise RequestCancelled(f"request {request_id!r}: cancelled while waiting "
                                           f"for stage {self.stage_id!r}")
                with self._lock:
                    seen = self._wakes
                    first = self._waiting[0] == ticket
                refused = False
                try:
                    call = (self._submit_free(inputs, params, until, request_id, abandoned,
                                              into)
                            if first else None)
                except ResourceUnavailable as exc:
                    if not _worth_waiting(exc):
                        raise
                    call, refused = None, True
                if call is not None:
                    return call
                down = not self._serving()
                now = time.monotonic()
                if down and restart_end is None:
                    restart_end = now + self.restart_wait_s
                self._check_bounds(now, end, until, deadline_s, restart_end if down else None)
                remaining = _RECHECK_S if end is None else end - now
                with self._lock:
                    # A refused try released its slot (one wake of its own): after a
                    # refusal, wait for the next release, or the recheck, anyway.
                    if refused or self._wakes == seen:
                        self._sleepers += 1
                        try:
                            self._cond.wait(min(remaining, _RECHECK_S))
                        finally:
                            self._sleepers -= 1
        finally:
            with self._lock:
                self._waiting.remove(ticket)
                self._wakes += 1
                if self._sleepers:
                    self._cond.notify_all()

    def _check_bounds(self, now: float, end: float | None, until: float | None,
                      deadline_s: float | None, restart_end: float | None) -> None:
        """Raise the typed error of the first bound passed (``restart_end``: none serves)."""
        waiting_for = ("a replica to come back" if restart_end is not None
                       else f"a slot of {len(self.runtimes)} replica(s)")
        if end is not None and now >= end:
            if until is not None and end == until:
                raise DeadlineExceeded(f"stages[{self.stage_id}].in_flight: deadline_s expired "
                                       f"waiting for {waiting_for}: {self._states()}")
            if restart_end is not None:
                raise StageClosed(f"stages[{self.stage_id}]: no replica came back within "
                                  f"{deadline_s} s: {self._states()}")
            raise ResourceUnavailable(
                f"stages[{self.stage_id}].in_flight: all {self.capacity} slot(s) of "
                f"{len(self.runtimes)} replica(s) taken for {deadline_s} s: "
                f"{self.capacity}")
        if restart_end is not None and now >= restart_end:
            raise StageClosed(f"stages[{self.stage_id}]: no replica came back within "
                              f"restart_wait_s (the stage's call_timeout_s): "
                              f"{self.restart_wait_s} s: {self._states()}")

    def cancel(self, request_id: str | None = None) -> CancelOutcome:
        """Cancel everything in flight on every replica, or one request alone.

        One request includes its fan-out items (``request_id#i``); the strongest outcome
        wins.
        """
        if request_id is None:
            outcomes = [r.cancel() for r in self.runtimes]
        else:
            outcomes = [r.cancel(rid) for r in self.runtimes for rid in r.request_ids()
                        if rid == request_id or rid.startswith(request_id + "#")]
        for strongest in (CancelOutcome.RETIRE_REQUIRED, CancelOutcome.CANCELLED_IN_PLACE,
                          CancelOutcome.NOT_STARTED):
            if strongest in outcomes:
                return strongest
        return CancelOutcome.ALREADY_FINISHED

    def fence(self, request_id: str) -> FenceOutcome:
        """Cancel one request (and its fan-out items) without interrupting a running call.

        See :meth:`StageRuntime.fence`; the strongest outcome of the items wins
        (:func:`~edge_core.runtime.fence.strongest_fence`).
        """
        return strongest_fence(r.fence(rid) for r in self.runtimes for rid in r.request_ids()
                               if rid == request_id or rid.startswith(request_id + "#"))
