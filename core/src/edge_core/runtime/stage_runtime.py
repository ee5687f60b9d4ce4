"""One loaded stage at run time: bounded calls, epochs, acknowledgements, cancel, restart.

The owner's hooks were bound once (:class:`edge_core.binding.OwnerBinding`); a call is one
Python call into the plugin, which returns an iterator of ``(event, tensors)``.

Rules enforced here:

* a request takes a slot at submission; delivery does not free it, a matching
  acknowledgement does (request id, epoch, worker generation and delivery serial);
* cancelling fences at once: events of a fenced request are never delivered;
* a preemptible backend cancels in place; a non-preemptible one with the request still
  running has its worker retired — the reservation is released only when retirement is
  verified, else quarantined — and the stage refuses work until :meth:`restart`.
"""

from __future__ import annotations

import enum
import itertools
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from edge_contracts.requests import EventKind, Operation, StageEvent, StageRequest
from edge_core.backend import CancelOutcome, StageKind
from edge_core.binding import OwnerBinding
from edge_core.errors import EdgeError, StageClosed
from edge_core.runtime.errors import DuplicateRequest, RequestCancelled, RequestFailed
from edge_core.runtime.flow import SlotPool
from edge_core.runtime.results import AckOutcome, ResultKey, StageResult
from edge_core.stage import LoadedStage, RetainedOutputs, StageContext

__all__ = ["PendingCall", "StageRuntime", "StageState"]


class StageState(enum.StrEnum):
    """Where a stage is in its life."""

    READY = "ready"
    #: A non-preemptible call was cancelled and its worker retired: restart() is needed.
    NEEDS_RESTART = "needs-restart"
    #: Shut down for good.
    RETIRED = "retired"


class _Entry:
    __slots__ = ("cancelled", "delivered", "epoch", "finished", "serial")

    def __init__(self, serial: int, epoch: int) -> None:
        self.serial = serial
        self.epoch = epoch
        self.cancelled = False
        self.finished = False
        self.delivered = False


class PendingCall:
    """A submitted request: stream its events, or wait for its result.

    Consume it from one thread; :meth:`cancel` may be called from any thread.
    """

    def __init__(self, stage: StageRuntime, request: StageRequest, serial: int,
                 events: Iterator[tuple[StageEvent, Mapping[str, Any]]],
                 started: float | None = None) -> None:
        self.stage = stage
        self.request = request
        self.serial = serial
        self._events = events
        # When the request was handed to the backend (before it was sent): the latency
        # must not start after the send, or a thread descheduled in between would see
        # the work finish "before" it started.
        self._started = time.perf_counter() if started is None else started
        self._seen: list[StageEvent] = []
        self._outputs: dict[str, Any] = {}
        # Releases of outputs that are views of worker memory (RetainedOutputs), with
        # their names: handed to the result, or called when the request ends otherwise.
        self._retained: list[tuple[set[str], Callable[[], bool]]] = []
        self._result: StageResult | None = None
        self._done = False

    @property
    def request_id(self) -> str:
        """The request's id."""
        return self.request.request_id

    def events(self) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
        """Yield the non-terminal events (tokens, partial outputs) as they arrive.

        Ends after the terminal event; :meth:`result` then returns the result at once.

        Raises:
            RequestCancelled: the request was cancelled; nothing of it is delivered.
            RequestFailed: the worker ended it with an error.
        """
        while not self._done:
            event, tensors = self._next()
            if not event.terminal:
                yield event, tensors

    def _next(self) -> tuple[StageEvent, Mapping[str, Any]]:
        stage = self.stage
        cancelled = f"request {self.request_id!r}: cancelled"
        try:
            event, tensors = next(self._events)
        except StopIteration:
            self._done = True
            self._drop_retained()
            if stage._accept(self.request_id, self.serial, None):
                raise RequestFailed(self.request_id, "WorkerLost",
                                    "the event stream ended without a terminal event") from None
            raise RequestCancelled(cancelled) from None
        except EdgeError as exc:
            self._done = True
            self._drop_retained()
            if stage._accept(self.request_id, self.serial, None):
                raise
            raise RequestCancelled(cancelled) from exc
        for names, _ in self._retained:  # outputs this event replaces are not theirs
            names.difference_update(tensors)
        if isinstance(tensors, RetainedOutputs):
            self._retained.append((set(tensors), tensors.release))
        # One locked decision: a fenced request's event is refused, and a terminal event
        # is either delivered (DONE, slot kept until the ack) or ends the request.
        if not stage._accept(self.request_id, self.serial, event):
            self._done = True
            self._close_events()
            tensors = {}  # let go of the views first, so that their memory can be reused
            self._drop_retained()
            raise RequestCancelled(cancelled)
        self._seen.append(event)
        self._outputs.update(tensors)
        if event.terminal:
            self._done = True
            if event.kind is EventKind.CANCELLED:
                self._drop_retained()
                raise RequestCancelled(f"{cancelled} by the worker")
            if event.kind is EventKind.ERROR:
                self._drop_retained()
                info = event.error
                raise RequestFailed(self.request_id, info.type if info else "Error",
                                    info.message if info else "")
            self._result = StageResult(
                ResultKey(self.request_id, self.request.epoch, self.request.generation,
                          self.serial),
                self._outputs, tuple(self._seen), time.perf_counter() - self._started,
                stage.ack, self._retained,
            )
            self._outputs, self._retained = {}, []  # the result holds them now
        return event, tensors

    def _drop_retained(self) -> None:
        """Give back worker memory of a request that ends without a result."""
        retained, self._retained = self._retained, []
        self._outputs = {}
        for _, release in retained:
            release()

    def _close_events(self) -> None:
        close = getattr(self._events, "close", None)
        if close is not None:
            close()

    def result(self) -> StageResult:
        """Wait for the terminal event and return the result (acknowledge it when done)."""
        for _ in self.events():
            pass
        if self._result is None:  # pragma: no cover - events() raised otherwise
            raise RequestFailed(self.request_id, "NoResult", "no terminal event")
        return self._result

    def cancel(self) -> CancelOutcome:
        """Cancel this request (see :meth:`StageRuntime.cancel`).

        Worker memory behind outputs of events already taken is given back (outputs still
        referenced keep theirs: see :class:`~edge_core.runtime.results.StageResult`).
        """
        outcome = self.stage.cancel(self.request_id)
        if self._result is None:
            self._drop_retained()
        return outcome


class StageRuntime:
    """A loaded stage with bounded calls.

    Built and started by :class:`edge_core.runtime.pipeline.Pipeline`.

    Args:
        binding: The owner's bound hooks.
        context: The stage as the plugin sees it.
        loaded: What ``edge_load`` returned.
        max_in_flight: Requests submitted and not yet acknowledged, at most.
        on_retired: Called with the retire outcome whenever the runtime retires the
            worker itself (cancel of a non-preemptible call), to settle the reservation.
        reload: Called by :meth:`restart` with the next generation; returns the new handle
            after the full load and warm-up gate.
    """

    def __init__(
        self,
        binding: OwnerBinding,
        context: StageContext,
        loaded: LoadedStage,
        *,
        max_in_flight: int | None = None,
        on_retired: Callable[[Any], None] | None = None,
        reload: Callable[[int], LoadedStage] | None = None,
        retire_deadline_s: float = 5.0,
    ) -> None:
        self.binding = binding
        self.context = context
        self.loaded = loaded
        self.state = StageState.READY
        self.generation = context.generation
        self.epoch = 0
        self.retire_deadline_s = retire_deadline_s
        limit = max_in_flight or binding.backend.max_concurrency
        self.slots = SlotPool(limit, f"stages[{context.stage_id}].in_flight")
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._restart_lock = threading.Lock()
        self._serials = itertools.count(1)
        # Generated request ids: a random prefix per stage runtime plus a counter
        # (unique like a uuid4, without its cost on every call).
        self._id_prefix = secrets.token_hex(8) + "-"
        self._ids = itertools.count(1)
        self._on_retired = on_retired
        self._reload = reload
        self.last_retire: Any = None
        self.closed_reason: str | None = None
        kinds = binding.backend.kinds
        self._operation = (Operation.GENERATE if StageKind.GENERATE in kinds
                           and StageKind.GRAPH not in kinds else Operation.RUN)

    @property
    def stage_id(self) -> str:
        """The stage's id."""
        return self.context.stage_id

    @property
    def shapes(self) -> Any:
        """The shape set the loaded stage serves (``edge_contracts.shapesets.ShapeSet``).

        ``None`` for stages without one (generate stages, backends that declare none).
        """
        return getattr(self.loaded, "shapes", None)

    # -- submission -----------------------------------------------------------------

    def submit(
        self,
        inputs: Mapping[str, Any],
        *,
        request_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        deadline_s: float | None = None,
    ) -> PendingCall:
        """Send one request; returns at once with a :class:`PendingCall`.

        Raises:
            StageClosed: the stage needs a restart or was retired.
            ResourceUnavailable: every in-flight slot is taken (at once, or after
                ``deadline_s`` seconds of waiting).
            DuplicateRequest: ``request_id`` is still in flight or unacknowledged.
        """
        self._require_ready()
        self.slots.acquire(deadline_s)
        request_id = request_id or f"{self._id_prefix}{next(self._ids):x}"
        serial = 0
        try:
            with self._lock:
                self._require_ready()
                if request_id in self._entries:
                    raise DuplicateRequest(
                        f"request_id: already in flight or unacknowledged on stage "
                        f"{self.stage_id!r}: {request_id!r}"
                    )
                serial = next(self._serials)
                entry = _Entry(serial, self.epoch)
                self._entries[request_id] = entry
            request = StageRequest(
                request_id=request_id, stage_id=self.stage_id, epoch=entry.epoch,
                generation=self.generation, operation=self._operation,
                params=dict(params or {}),
            )
            started = time.perf_counter()
            events = self.binding.call(self.loaded, request, inputs)
        except BaseException:
            with self._lock:
                live = self._entries.get(request_id)
                if live is not None and live.serial == serial:
                    del self._entries[request_id]
            self.slots.release()
            raise
        return PendingCall(self, request, serial, iter(events), started)

    def _require_ready(self) -> None:
        if self.state is not StageState.READY:
            raise StageClosed(
                f"stages[{self.stage_id}]: {self.state.value}"
                + (f" ({self.closed_reason})" if self.closed_reason else "")
                + (": call restart()" if self.state is StageState.NEEDS_RESTART else "")
            )

    # -- delivery and acknowledgement -----------------------------------------------------

    def fenced(self, request_id: str, serial: int) -> bool:
        """True when the request's output must not be delivered (cancelled or fenced)."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.serial != serial:
                return True
            return entry.cancelled or entry.epoch < self.epoch

    def _accept(self, request_id: str, serial: int, event: StageEvent | None) -> bool:
        """Decide, atomically with cancellation, what becomes of one arriving event.

        ``event`` is ``None`` when the stream broke. Returns False when the request is
        fenced (its event must not be delivered). A terminal event, a broken stream or a
        fenced request ends the request: its slot is freed, except after a delivered DONE,
        whose slot the acknowledgement frees.
        """
        release = False
        with self._lock:
            entry = self._entries.get(request_id)
            live = entry is not None and entry.serial == serial
            fenced = (not live or entry is None or entry.cancelled
                      or entry.epoch < self.epoch)
            if event is not None and not event.terminal and not fenced:
                return True
            if live and entry is not None and not entry.finished:
                entry.finished = True
                if event is not None and not fenced and event.kind is EventKind.DONE:
                    entry.delivered = True
                    return True
                del self._entries[request_id]
                release = True
        if release:
            self.slots.release()
        return not fenced

    def ack(self, key: ResultKey) -> AckOutcome:
        """Free the slot of a delivered result when id, epoch, generation and serial match."""
        with self._lock:
            entry = self._entries.get(key.request_id)
            if (entry is None or not entry.delivered or entry.serial != key.serial
                    or entry.epoch != key.epoch or key.generation != self.generation):
                return AckOutcome.STALE
            del self._entries[key.request_id]
        self.slots.release()
        return AckOutcome.ACKNOWLEDGED

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet acknowledged (or ended undelivered)."""
        with self._lock:
            return len(self._entries)

    # -- cancellation -------------------------------------------------------------------

    def cancel(self, request_id: str | None = None) -> CancelOutcome:
        """Cancel one request, or (``None``) everything in flight by bumping the epoch.

        The fence takes effect before this returns: no output of the cancelled work will
        be delivered. Then the backend is asked to stop it; a non-preemptible backend
        with work still running gets its worker retired.
        """
        with self._lock:
            if request_id is None:
                fenced_epoch = self.epoch
                self.epoch += 1
                running = [rid for rid, e in self._entries.items()
                           if not e.finished and e.epoch <= fenced_epoch]
                targets = running
            else:
                entry = self._entries.get(request_id)
                if entry is None or entry.finished:
                    return CancelOutcome.ALREADY_FINISHED
                entry.cancelled = True
                fenced_epoch = entry.epoch
                targets = [request_id]
            for rid in targets:
                self._entries[rid].cancelled = True
        if not targets:
            return CancelOutcome.ALREADY_FINISHED
        outcome = CancelOutcome.CANCELLED_IN_PLACE
        for rid in targets:
            answer = self.binding.cancel(self.loaded, rid, fenced_epoch)
            if answer is CancelOutcome.RETIRE_REQUIRED:
                outcome = answer
        if outcome is CancelOutcome.RETIRE_REQUIRED:
            self._retire_for_cancel()
        return outcome

    def _retire_for_cancel(self) -> None:
        with self._lock:
            if self.state is not StageState.READY:
                return
            self.state = StageState.NEEDS_RESTART
            self.closed_reason = "a running non-preemptible call was cancelled"
        self._settle(self.binding.retire(self.loaded, self.retire_deadline_s))

    # -- restart and retirement -----------------------------------------------------------

    def restart(self) -> None:
        """Load again under a new generation, re-running the full load and warm-up gate.

        A ready stage is retired first, its reservation settled like any retirement
        (released when verified, else quarantined). Results not yet acknowledged become
        stale. If the reload fails the stage stays closed and may be restarted again.

        Raises:
            StageClosed: the stage was retired for good, or has no reload function.
        """
        with self._restart_lock:
            if self.state is StageState.RETIRED or self._reload is None:
                raise StageClosed(f"stages[{self.stage_id}]: cannot restart: "
                                  f"{self.state.value}")
            if self.state is StageState.READY:
                with self._lock:
                    self.state = StageState.NEEDS_RESTART
                    self.closed_reason = "restarting"
                self._settle(self.binding.retire(self.loaded, self.retire_deadline_s))
            generation = self.generation + 1
            loaded = self._reload(generation)  # raises: the stage stays NEEDS_RESTART
            with self._lock:
                dropped = len(self._entries)
                self._entries.clear()
                self.generation = generation
                self.loaded = loaded
                self.state = StageState.READY
                self.closed_reason = None
            for _ in range(dropped):  # each dropped request held one slot
                self.slots.release()

    def _settle(self, outcome: Any) -> None:
        self.last_retire = outcome
        if self._on_retired is not None:
            self._on_retired(outcome)

    def retire(self) -> Any:
        """Retire the worker (idempotent); returns the backend's retire outcome."""
        with self._lock:
            already = self.state is not StageState.READY
            if not already:
                self.state = StageState.RETIRED
            for entry in self._entries.values():
                entry.cancelled = True
        if already and self.last_retire is not None:
            return self.last_retire
        outcome = self.binding.retire(self.loaded, self.retire_deadline_s)
        self.last_retire = outcome
        return outcome

    def close(self) -> Any:
        """Retire for good (no restart)."""
        outcome = self.retire()
        self.state = StageState.RETIRED
        return outcome
