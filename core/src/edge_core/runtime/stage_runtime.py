"""One loaded stage at run time: bounded calls, epochs, acknowledgements, cancel, restart.

The owner's hooks were bound once (:class:`edge_core.binding.OwnerBinding`); a call is one
Python call into the plugin, which returns an iterator of ``(event, tensors)``.

Rules enforced here:

* a request takes a slot at submission; delivery does not free it, a matching
  acknowledgement does (request id, epoch, worker generation and delivery serial);
* cancelling fences at once: events of a fenced request are never delivered;
* :meth:`StageRuntime.fence` cancels one request without interrupting a running
  non-preemptible call: it finishes in the worker and its result is refused on arrival;
* a preemptible backend cancels in place; a non-preemptible one with the request still
  running has its worker retired — the reservation is released only when retirement is
  verified, else quarantined — and the stage refuses work until :meth:`restart` (or the
  automatic restart its policy allows: :mod:`edge_core.runtime.restarts`);
* every call is bounded by the earlier of its request's deadline and the stage's
  ``call_timeout_s`` (:mod:`edge_core.runtime.deadlines`); a worker that dies or stops
  answering fails the stage (``failed``) and its calls with typed errors.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edge_contracts.requests import (
    EventKind,
    Operation,
    StageEvent,
    prechecked_request,
)
from edge_contracts.validation import MAX_ID_LENGTH, require_id
from edge_core.backend import CancelOutcome, StageKind
from edge_core.binding import OwnerBinding
from edge_core.errors import DeadlineExceeded, PluginError, StageClosed
from edge_core.runtime.admission import SlotPool, check_request_size, take_slot
from edge_core.runtime.deadlines import (
    deadline_until,
    default_call_timeout,
    no_action,
    timer,
)
from edge_core.runtime.errors import DuplicateRequest, RequestCancelled
from edge_core.runtime.fence import FenceOutcome
from edge_core.runtime.health import StageHealth, StageState, error_record, restart_coming
from edge_core.runtime.input_buffers import (
    check_input_buffers,
    input_buffer_counts,
    make_input_buffer,
    owns_input_buffer,
)
from edge_core.runtime.pending import PendingCall
from edge_core.runtime.request_inputs import malformed_inputs
from edge_core.runtime.restarts import Restarter, RestartPolicy
from edge_core.runtime.results import AckOutcome, ResultKey
from edge_core.stage import LoadedStage, StageContext

__all__ = ["StageRuntime", "close_all"]

# Enum members read per call, taken once: on 3.11 an enum class's attribute goes through
# its metaclass's __getattr__ hook (about four times a plain global's cost).
_READY = StageState.READY
_DONE = EventKind.DONE
_ACKNOWLEDGED = AckOutcome.ACKNOWLEDGED
_STALE = AckOutcome.STALE

_SEND_WAIT_S = 2.0  # how long a cancel waits for the request's send to complete


class StageRuntime:
    """A loaded stage with bounded calls.

    Built and started by :class:`edge_core.runtime.pipeline.Pipeline`.

    Args:
        binding: The owner's bound hooks.
        context: The stage as the plugin sees it.
        loaded: What ``edge_load`` returned.
        max_in_flight: Requests submitted and not yet acknowledged, at most.
        on_retired: Called with the retire outcome whenever the runtime retires the
            worker itself (cancel of a non-preemptible call, failure), to settle the
            reservation.
        reload: Called by :meth:`restart` with the next generation; returns the new handle
            after the full load and warm-up gate.
        call_timeout_s: The most one call may take, sending included (None: the default
            of the backend's kind, :func:`~edge_core.runtime.deadlines.default_call_timeout`).
        policy: The restart policy (:class:`~edge_core.runtime.restarts.RestartPolicy`).
        on_closed: Called once by :meth:`close`, after the worker's retirement (the
            opener releases the replica's kept bundle copy there).
    """

    def __init__(
        self,
        binding: OwnerBinding,
        context: StageContext,
        loaded: LoadedStage,
        *,
        max_in_flight: int | None = None,
        on_retired: Callable[[Any], object] | None = None,
        reload: Callable[[int], LoadedStage] | None = None,
        retire_deadline_s: float = 5.0,
        call_timeout_s: float | None = None,
        policy: RestartPolicy | None = None,
        on_closed: Callable[[], object] | None = None,
    ) -> None:
        self.binding = binding
        self.context = context
        self.loaded = loaded
        self.state = StageState.READY
        self.generation = context.generation
        self.epoch = 0
        self.retire_deadline_s = retire_deadline_s
        self.call_timeout_s = (default_call_timeout(binding.backend.kinds)
                               if call_timeout_s is None else call_timeout_s)
        limit = max_in_flight or binding.backend.max_concurrency
        # The runtime's lock is its slots' too: a call's slot is taken where it is
        # registered and freed where its entry goes, in one lock section each
        self._lock = threading.RLock()
        self.slots = SlotPool(limit, f"stages[{context.stage_id}].in_flight", lock=self._lock)
        self._timer = timer()  # the process's one deadline timer (kept across a fork)
        # What a call's timer handle runs, bound once (not per call; the restarter holds
        # bound methods of this runtime already: no new cycle)
        self._expire_call = self._expire
        self.made_input_buffers = False
        """True once :meth:`input_buffer` was asked (requests are then checked for them)."""
        self._entries: dict[str, PendingCall] = {}
        self._sent = threading.Condition(self._lock)
        self._send_waiters = 0  # threads in self._sent.wait (under self._lock)
        self._restart_lock = threading.Lock()
        self._serials = itertools.count(1)
        # Generated request ids: a random prefix per stage runtime plus the request's
        # serial (unique like a uuid4, without its cost on every call; one counter for
        # both, and an f-string's int formatting costs less than a %-format's)
        self._id_prefix = f"{secrets.token_hex(8)}-"
        self._on_retired = on_retired
        self._on_closed = on_closed
        self._reload = reload
        self.last_retire: Any = None
        self.closed_reason: str | None = None
        #: The typed error that took the stage out of ``ready`` or failed its last restart.
        self.last_error: BaseException | None = None
        # (generation, error record) of the first BundleChanged met reading this stage's
        # bundle folder (note_bundle_changed), or None.
        self._bundle_changed: tuple[int, dict[str, str]] | None = None
        self._retired = False  # the current worker was retired (at most once)
        self.restarter = Restarter(policy or RestartPolicy(), self._auto_restart,
                                   self._restart_failed, f"edge-restart-{self.name}")
        kinds = binding.backend.kinds
        self._operation = (Operation.GENERATE if StageKind.GENERATE in kinds
                           and StageKind.GRAPH not in kinds else Operation.RUN)
        self._watch(loaded, self.generation)

    @property
    def stage_id(self) -> str:
        """The stage's id."""
        return self.context.stage_id

    @property
    def name(self) -> str:
        """The stage's id, ``stage#r`` for replica r > 0 (as health reports it)."""
        replica = getattr(self.context, "replica", 0)
        return f"{self.stage_id}#{replica}" if replica else self.stage_id

    @property
    def shapes(self) -> Any:
        """The shape set the loaded stage serves (``edge_contracts.shapesets.ShapeSet``).

        ``None`` for stages without one (generate stages, backends that declare none).
        """
        return getattr(self.loaded, "shapes", None)

    @property
    def policy(self) -> RestartPolicy:
        """The stage's restart policy."""
        return self.restarter.policy

    # -- submission -----------------------------------------------------------------

    def submit(
        self,
        inputs: Mapping[str, Any],
        *,
        request_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        deadline_s: float | None = None,
        until: float | None = None,
        abandoned: Callable[[], bool] | None = None,
        wait_for_slot: bool = True,
        into: list[PendingCall] | None = None,
    ) -> PendingCall:
        """Send one request; returns at once with a :class:`PendingCall`.

        Args:
            inputs: The request's tensors.
            request_id: Its id (generated when None).
            params: Request parameters.
            deadline_s: Bound on the whole call from now, waiting for a slot included;
                without it a full stage refuses at once.
            until: The same bound as an absolute ``time.monotonic()`` (the pipeline's).
            abandoned: Checked when the request is registered: True (its pipeline
                request was cancelled while it waited for a slot) refuses it unsent.
            wait_for_slot: False: take a free slot or refuse at once, whatever the
                deadline (a replica set waits across its replicas itself).
            into: The caller's list of its calls: the pending call is appended to it as
                it is registered (no call between), so that a ``KeyboardInterrupt``
                acted on before the caller holds what this returns (as it returns, or
                as any caller on the way returns it) leaves it where the caller's
                failure path finds it to abandon (:meth:`PendingCall.abandon`). Taken
                out again when this fails.

        Raises:
            StageClosed: the stage needs a restart, failed, is restarting or was retired.
            RequestTooLarge: the inputs exceed the stage's ``max_io_bytes``.
            ResourceUnavailable: every in-flight slot is taken.
            DeadlineExceeded: no slot freed before the deadline, or the deadline had
                passed when the request was about to be sent (nothing is sent then).
            DuplicateRequest: ``request_id`` is still in flight or unacknowledged.
            RequestCancelled: ``abandoned()`` said so; nothing was sent.
            InvalidValue: ``inputs`` are no mapping of input names (``str``) to arrays
                (field ``inputs``); nothing was sent.
        """
        if deadline_s is not None:
            own = deadline_until(deadline_s)
            until = own if until is None else min(until, own)
        if self.state is not _READY:
            self._require_ready()
        check_request_size(self.context.stage_id, inputs, self.context.max_io_bytes)
        # A slot waited for up to the deadline is taken here; else one free now is taken
        # as the request is registered, under the same lock (or the request is refused)
        waited = until is not None and wait_for_slot
        if waited:
            take_slot(self.slots, until)
        generated = not request_id  # an id of ours needs no checking; a caller's does
        # The call's serial (unique on this stage, taken from a C counter: no lock needed)
        # names a generated request too
        serial = next(self._serials)
        request_id = request_id or f"{self._id_prefix}{serial}"
        # Bound the call: the earlier of its deadline and call_timeout_s (_expire ends
        # it), from the moment it is registered, sending included. Scheduled with the
        # registration, under the one lock: the call's end (accept) or a retirement
        # cancels it. The reason is worded only on expiry.
        bound = time.monotonic() + self.call_timeout_s
        by_deadline = False
        if until is not None and until <= bound:
            bound, by_deadline = until, True
        registered: PendingCall | None = None  # what the failure path below takes back
        held = waited  # a slot is held (the failure path gives it back)
        try:
            with self._lock:
                if self.state is not _READY:
                    self._require_ready()
                if not waited:  # SlotPool.take_held, counted with ``held``: no call between
                    slots = self.slots
                    if slots.used >= slots.limit:
                        raise slots.refusal(None)
                    slots.used += 1
                    held = True
                if abandoned is not None and abandoned():
                    raise RequestCancelled(f"request {request_id!r}: cancelled before it "
                                           f"was sent to stage {self.stage_id!r}")
                if by_deadline and bound <= time.monotonic():  # nothing ran: nothing retired
                    raise DeadlineExceeded(f"stages[{self.stage_id}]: request "
                                           f"{request_id!r}: deadline_s expired before it "
                                           "was sent")
                if request_id in self._entries:
                    raise DuplicateRequest(
                        f"request_id: already in flight or unacknowledged on stage "
                        f"{self.stage_id!r}: {request_id!r}"
                    )
                # The request (of the epoch it is registered in) and its record: the
                # pending call the caller gets, registered before it is sent
                # (the rest of it is the runtime's own, checked once): a caller's id is
                # checked here as StageRequest checks it, inline for the usual valid one
                if not generated:
                    if not (type(request_id) is str and 0 < len(request_id) <= MAX_ID_LENGTH
                            and request_id.isprintable()):
                        require_id(request_id, "request.request_id")  # raises
                    if params:  # (as StageRequest took them: a dict of what was given)
                        params = dict(params)
                request = prechecked_request(request_id, self.context.stage_id, self.epoch,
                                             self.generation, self._operation, params)
                registered = entry = PendingCall(self, request, serial)
                self._entries[request_id] = entry
                if into is not None:  # the caller holds it from here (see ``into``)
                    into.append(entry)
                # An expiry while the request is still being sent waits for the send
                # (_cancel_targets), as a cancel does. The action names the entry by its
                # serial, not by the entry itself: entry -> handle -> action -> entry
                # would be a reference cycle per call (the handle waits in the timer's
                # inbox until its next drain), freed only by the garbage collector. Its
                # arguments go with the handle: no partial, no bound method per call.
                entry.timer = self._timer.schedule(
                    bound, self._expire_call, request_id, serial, by_deadline)
            try:
                entry.source = iter(self.binding.call(self.loaded, request, inputs))
            except TypeError as exc:
                trace = exc.__traceback__
                if trace is None or trace.tb_next is not None:
                    raise  # raised inside the hook: its own error, as it is
                # raised by iter() here (nothing is checked until then): the hook's answer
                raise PluginError(
                    f"stages[{self.stage_id}]: plugin {self.binding.plugin!r}: edge_call "
                    f"did not return an iterator of (StageEvent, outputs) pairs ({exc})"
                ) from None
            finally:
                # Set before the waiters are read: a cancel that starts waiting after
                # that read sees it set (_cancel_targets checks it under the lock).
                entry.sent = True
                if self._send_waiters:
                    with self._lock:  # the Condition's own lock
                        self._sent.notify_all()
        except BaseException as exc:
            with self._lock:
                if registered is not None:
                    registered.finished = True  # its expiry, if it comes, finds it ended
                    if registered.timer is not None:
                        registered.timer.cancel()
                    if self._entries.get(request_id) is registered:
                        del self._entries[request_id]
                    else:  # a restart took the entry meanwhile and freed its slot with it
                        held = False
                    if into is not None and registered in into:
                        into.remove(registered)  # ended here: nothing for the caller
            if held:
                self.slots.release()
            # A key that is no input name fails where the inputs are packed (a wire
            # error naming a tensor): refused naming ``inputs``, as the pipeline does.
            if isinstance(exc, Exception) and (refusal := malformed_inputs(inputs)):
                raise refusal from None
            raise
        return entry

    def _expire(self, request_id: str, serial: int, by_deadline: bool) -> None:
        """A call outlived its bound: fence it and end it (from the timer's thread).

        ``serial`` is the call's (:attr:`PendingCall.serial`, unique on this stage): an entry
        of ``request_id`` with another serial is a later call's, left alone.
        """
        what = ("deadline_s expired" if by_deadline
                else f"call_timeout_s expired: {self.call_timeout_s}")
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.serial != serial or entry.finished:
                return
            entry.expired = what
        self._cancel_targets([request_id], entry.epoch, failure=f"a call's {what}")

    def restart_pending(self) -> bool:
        """Not serving, but a restart runs or will (:func:`~.health.restart_coming`)."""
        return restart_coming(self.state, self.restarter)

    def _require_ready(self) -> None:
        if self.state is not StageState.READY:
            waiting = self.state in (StageState.NEEDS_RESTART, StageState.FAILED)
            raise StageClosed(
                f"stages[{self.stage_id}]: {self.state.value}"
                + (f" ({self.closed_reason})" if self.closed_reason else "")
                + (": call restart()" if waiting else "")
            )

    # -- input buffers --------------------------------------------------------------------

    def input_buffer(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """Return an array to fill in place and pass as input ``name`` of a later submit.

        On a worker stage with shared memory it lives in the controller's segment and
        travels by reference, without a copy (ownership: :mod:`edge_core.host.inputs`:
        read-only while a request holds it, reusable once that request has ended); on
        other stages, or below the shared-memory threshold, it is a private array.
        """
        self._require_ready()
        require_id(name, "input_buffer.name")
        buffer, own = make_input_buffer(self.loaded, shape, dtype)
        self.made_input_buffers = own or self.made_input_buffers
        return buffer

    def owns_input_buffer(self, value: Any) -> bool:
        """True when ``value`` is an input buffer of this stage's current worker.

        Such a buffer travels by reference only to that worker; sent to another stage or
        replica it is an ordinary array (copied).
        """
        return owns_input_buffer(self.loaded, value)

    def check_input_buffers(self, inputs: Mapping[str, Any]) -> None:
        """Raise ``InputBufferBusy`` when one of ``inputs`` is a buffer a request holds."""
        check_input_buffers(self.loaded, inputs)

    def input_buffer_counts(self) -> dict[str, int]:
        """Input-buffer counts of the current worker (zeros on stages without them).

        ``buffers``: alive; ``sent``: how many requests carried one by reference.
        """
        return input_buffer_counts(self.loaded)

    # -- delivery and acknowledgement -----------------------------------------------------

    def fenced(self, request_id: str, serial: int) -> bool:
        """True when the request's output must not be delivered (cancelled or fenced)."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.serial != serial:
                return True
            return entry.cancelled or entry.epoch < self.epoch

    def accept(self, request_id: str, serial: int, event: StageEvent | None) -> bool:
        """Decide, atomically with cancellation, what becomes of one arriving event.

        Asked by the request's :class:`~edge_core.runtime.pending.PendingCall` (its
        :class:`~edge_core.runtime.pending.CallStage`) for every event it reads. ``event``
        is ``None`` when the stream broke. Returns False when the request is fenced (its
        event must not be delivered). A terminal event, a broken stream or a fenced
        request ends the request: its slot is freed, except after a delivered DONE,
        whose slot the acknowledgement frees.
        """
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.serial != serial:
                return False  # not this request's entry (ended, or its id reused): fenced
            fenced = entry.cancelled or entry.epoch < self.epoch
            if event is not None and not event.terminal:
                if not fenced:
                    return True
                if entry.draining and not entry.finished:
                    return False  # left to finish: refused, and its slot kept until its end
            if entry.finished:
                return not fenced
            entry.finished = True
            timer = entry.timer
            if timer is not None:  # TimerHandle.cancel, without the call: the action
                # (and what it holds) goes now, not when the timer next drains its inbox,
                # where the handle waits (a few objects a call, else, kept for about
                # 1000 calls: the garbage collector's young generation filled by them)
                timer.cancelled = True
                timer.action = no_action  # (before the arguments, as cancel does)
                timer.args = ()
            if event is not None and not fenced and event.kind is _DONE:
                entry.delivered = True
                if self.restarter.restarts:  # served again: the count starts over
                    self.restarter.reset()
                return True
            # The entry and its slot go together (as in ack: SlotPool.release_held's
            # count, with no call between)
            del self._entries[request_id]
            slots = self.slots
            slots.used -= 1
            if slots.waiters:
                slots.wake_held()
        if slots.listeners:  # (called without the lock)
            for listener in slots.listeners:
                listener()
        return not fenced

    def ack(self, key: ResultKey) -> AckOutcome:
        """Free the slot of a delivered result when id, epoch, generation and serial match."""
        with self._lock:
            entry = self._entries.get(key.request_id)
            if (entry is None or not entry.delivered or entry.serial != key.serial
                    or entry.epoch != key.epoch or key.generation != self.generation):
                return _STALE
            # The entry and the slot it holds (counted from its registration until it
            # is removed) go together: SlotPool.release_held's count, with no call
            # between (see SlotPool.used); then a waiter for a slot is woken
            del self._entries[key.request_id]
            slots = self.slots
            slots.used -= 1
            if slots.waiters:
                slots.wake_held()
        if slots.listeners:  # (called without the lock)
            for listener in slots.listeners:
                listener()
        return _ACKNOWLEDGED

    def request_ids(self) -> list[str]:
        """The ids of the requests submitted and not yet acknowledged (or ended)."""
        with self._lock:
            return list(self._entries)

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

        Returns, exactly: ``already-finished`` when nothing was running (the request
        ended, or finished in the worker and its last event is on its way);
        ``cancelled-in-place`` only from a preemptible backend; ``retire-required`` when
        the worker was retired; ``not-started`` when the backend never started it.
        With several requests, the strongest of their outcomes in that reverse order.
        """
        with self._lock:
            if request_id is None:
                fenced_epoch = self.epoch
                self.epoch += 1
                targets = [rid for rid, e in self._entries.items()
                           if not e.finished and e.epoch <= fenced_epoch]
            else:
                entry = self._entries.get(request_id)
                if entry is None or entry.finished:
                    return CancelOutcome.ALREADY_FINISHED
                fenced_epoch = entry.epoch
                targets = [request_id]
            for rid in targets:
                self._entries[rid].cancelled = True
        if not targets:
            return CancelOutcome.ALREADY_FINISHED
        return self._cancel_targets(targets, fenced_epoch, failure=None)

    def fence(self, request_id: str) -> FenceOutcome:
        """Cancel one request without ever interrupting a running non-preemptible call.

        The fence takes effect before this returns, as with :meth:`cancel`: no output of
        the request will be delivered. A preemptible backend is then asked to stop it in
        place; a non-preemptible one is not asked at all: the call finishes in the worker,
        and its terminal event, when the request's consumer reads it, is refused — its
        worker memory given back and its slot freed. The worker is never retired here
        (the call's deadline and ``call_timeout_s`` still bound it as before).

        Returns, exactly: ``already-finished`` when it had ended (or finished in the
        worker, as :meth:`cancel` says); ``cancelled-in-place`` from a preemptible backend;
        ``not-started`` when the backend never started it; ``left-to-finish`` when it is
        in flight and left to finish (a non-preemptible backend, or a preemptible one
        answering that it cannot stop it in place).
        """
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.finished:
                return FenceOutcome.ALREADY_FINISHED
            entry.cancelled = True
            epoch = entry.epoch
            if not self.binding.backend.preemptible:
                entry.draining = True
                return FenceOutcome.LEFT_TO_FINISH
        answer = self._cancel_targets([request_id], epoch, failure=None, retire=False)
        if answer is CancelOutcome.RETIRE_REQUIRED:  # it cannot stop it after all
            with self._lock:
                entry.draining = True
            return FenceOutcome.LEFT_TO_FINISH
        return FenceOutcome(answer.value)

    def _cancel_targets(self, targets: list[str], fenced_epoch: int,
                        failure: str | None, *, retire: bool = True) -> CancelOutcome:
        """Ask the backend to stop fenced requests; retire the worker if it must.

        ``failure`` (a deadline's expiry) marks the stage ``failed`` when the worker is
        retired; a plain cancel leaves it ``needs-restart``. ``retire=False`` (a
        non-interrupting cancel) never retires: ``retire-required`` is only returned.
        """
        answers: list[CancelOutcome] = []
        generation = self.generation
        for rid in targets:
            with self._lock:  # the Condition's own lock, taken directly (see admission.py)
                entry = self._entries.get(rid)
                if entry is None:
                    continue
                entry.cancelled = True
                ended = time.monotonic() + _SEND_WAIT_S
                self._send_waiters += 1
                try:
                    while not entry.sent and time.monotonic() < ended:  # sending right now
                        self._sent.wait(ended - time.monotonic())
                finally:
                    self._send_waiters -= 1
            answer = CancelOutcome(self.binding.cancel(self.loaded, rid, fenced_epoch))
            if (answer is CancelOutcome.CANCELLED_IN_PLACE
                    and not self.binding.backend.preemptible):
                answer = CancelOutcome.RETIRE_REQUIRED  # the declaration decides
            answers.append(answer)
        for outcome in (CancelOutcome.RETIRE_REQUIRED, CancelOutcome.CANCELLED_IN_PLACE,
                        CancelOutcome.NOT_STARTED):
            if outcome in answers:
                break
        else:
            outcome = CancelOutcome.ALREADY_FINISHED
        if outcome is CancelOutcome.RETIRE_REQUIRED and retire:
            left = (self._leave(StageState.NEEDS_RESTART,
                                "a running non-preemptible call was cancelled", generation)
                    if failure is None else
                    self._leave(StageState.FAILED, f"{failure}; its worker was retired",
                                generation,
                                DeadlineExceeded(f"stages[{self.stage_id}]: {failure}")))
            if left:
                self._retire_left(generation)
        return outcome

    def _leave(self, state: StageState, reason: str, generation: int,
               error: BaseException | None = None) -> bool:
        """Leave ``ready`` for ``state`` at once; False when not ready or not ``generation``."""
        with self._lock:
            if self.state is not StageState.READY or generation != self.generation:
                return False
            self.state = state
            self.closed_reason = reason
            self.last_error = error
        return True

    def _retire_left(self, generation: int) -> None:
        """Retire the worker of a stage that left ``ready``, settle, then apply the policy.

        Only the worker of ``generation``, once: a restart that came first retired it.
        """
        with self._restart_lock:
            if generation == self.generation and not self._retired:
                self._retire_current()
        self.restarter.schedule()

    def _retire_current(self) -> None:
        """Retire the current worker and settle its reservation (holding the restart lock)."""
        self._retired = True
        self._settle(self.binding.retire(self.loaded, self.retire_deadline_s))

    # -- failure and restart ----------------------------------------------------------

    def _watch(self, loaded: LoadedStage, generation: int) -> None:
        """Learn at once when the loaded stage's worker is lost (if it can tell)."""
        watch = getattr(loaded, "on_lost", None)
        if callable(watch):
            watch(lambda error: self._lost(error, generation))

    def _lost(self, error: BaseException, generation: int) -> None:
        """The worker of ``generation`` was lost (from the thread that noticed)."""
        if not self._leave(StageState.FAILED, f"worker lost: {error}", generation, error):
            return  # retired on purpose, or an older generation's worker
        threading.Thread(target=self._retire_left, name=f"edge-failed-{self.name}",
                         args=(generation,), daemon=True).start()

    def _auto_restart(self) -> None:
        """One automatic restart attempt (the supervisor's thread)."""
        self._restart(manual=False)

    def _restart_failed(self, error: BaseException) -> None:
        with self._lock:
            if self.state is StageState.RESTARTING:
                self.state = StageState.FAILED
                self.last_error = error
                self.closed_reason = (f"restart {self.restarter.restarts} of "
                                      f"{self.policy.max_restarts} failed: "
                                      f"{type(error).__name__}: {error}")

    def restart(self) -> None:
        """Load again under a new generation, re-running the full load and warm-up gate.

        A ready stage is retired first, its reservation settled like any retirement
        (released when verified, else quarantined). Results not yet acknowledged become
        stale. If the reload fails the stage is ``failed`` and may be restarted again.

        Raises:
            StageClosed: the stage was retired for good, or has no reload function.
        """
        try:
            self._restart(manual=True)
        except BaseException as error:
            self._restart_failed(error)
            raise
        self.restarter.reset()

    def _restart(self, *, manual: bool) -> None:
        with self._restart_lock:
            if self.state is StageState.RETIRED or self._reload is None:
                raise StageClosed(f"stages[{self.stage_id}]: cannot restart: "
                                  f"{self.state.value}")
            if not manual and self.state is StageState.READY:
                return  # restarted by hand meanwhile
            with self._lock:
                self.state = StageState.RESTARTING
                self.closed_reason = "restarting" if manual else "restarting automatically"
            if not self._retired:  # ready, or failed and not yet retired
                self._retire_current()
            generation = self.generation + 1
            loaded = self._reload(generation)  # raises: the stage is failed
            with self._lock:
                closed = self.state is StageState.RETIRED
                if not closed:
                    dropped = len(self._entries)
                    self._entries.clear()
                    self.generation = generation
                    self.loaded = loaded
                    self._retired = False
                    self.state = StageState.READY
                    self.closed_reason = None
                    self.last_error = None
            if closed:  # closed while loading: the new worker goes too
                self._settle(self.binding.retire(loaded, self.retire_deadline_s))
                return
            self._watch(loaded, generation)
            for _ in range(dropped):  # each dropped request held one slot
                self.slots.release()

    def _settle(self, outcome: Any) -> None:
        self.last_retire = outcome
        if self._on_retired is not None:
            self._on_retired(outcome)

    def note_bundle_changed(self, error: BaseException) -> None:
        """Record that reading this stage's bundle folder met ``BundleChanged`` (``error``).

        The bundle the stage opened with (verified in place, or its staged copy) changed
        since it loaded: a ``finish`` or a transform that reads the folder fails every
        request so, until the stage loads again. The worker still serves, so the state
        stays as it is; :meth:`health` reports the first such error under the current
        generation (``bundle_changed``) and the pipeline is not ``ready`` while it does.
        A restart (a new generation, which verifies the bundle again) clears it.
        """
        generation = self.generation
        noted = self._bundle_changed
        if noted is None or noted[0] != generation:
            self._bundle_changed = (generation, error_record(error))

    @property
    def bundle_changed(self) -> dict[str, str] | None:
        """The ``BundleChanged`` met under the current generation, or None.

        Its :func:`~edge_core.runtime.health.error_record` (``{"type", "layer",
        "message"}``), as :meth:`note_bundle_changed` recorded it.
        """
        noted = self._bundle_changed
        return noted[1] if noted is not None and noted[0] == self.generation else None

    def health(self) -> StageHealth:
        """The stage's state, why, its generation, restarts, requests and worker health."""
        report = getattr(self.loaded, "health", None)
        worker: dict[str, Any] | None = None
        if callable(report) and self.state is StageState.READY:
            answer = report()
            worker = answer.to_dict() if hasattr(answer, "to_dict") else dict(answer)
        error = self.last_error
        return StageHealth(self.name, self.state, self.closed_reason, self.generation,
                           self.restarter.restarts, self.outstanding, self.policy, worker,
                           error_record(error) if error is not None
                           and self.state is not StageState.READY else None,
                           self.bundle_changed)

    def retire(self) -> Any:
        """Retire the worker (idempotent); returns the backend's retire outcome."""
        with self._lock:
            already = self._retired
            self._retired = True
            self.state = StageState.RETIRED
            for entry in self._entries.values():
                entry.cancelled = True
                if entry.timer is not None:
                    entry.timer.cancel()
        if already and self.last_retire is not None:
            return self.last_retire
        outcome = self.binding.retire(self.loaded, self.retire_deadline_s)
        self.last_retire = outcome
        return outcome

    def close(self) -> Any:
        """Retire for good (no restart); waits for an automatic restart in progress."""
        with self._lock:  # no restart starts (or completes) from now on
            self.state = StageState.RETIRED
        self.restarter.close()
        try:
            with self._restart_lock:
                outcome = self.retire()
        finally:
            closed, self._on_closed = self._on_closed, None
            if closed is not None:
                closed()
        self.state = StageState.RETIRED
        return outcome


def close_all(runtimes: Sequence[StageRuntime | None],
              ) -> tuple[list[Any], BaseException | None]:
    """Close every runtime at once, one thread each, and wait for all; their outcomes.

    Each :meth:`StageRuntime.close` retires its own worker tree (bounded by its own retire
    deadline, verified as always), so closing them together costs the slowest one rather
    than the sum: a worker's shutdown is mostly waiting for its process to end. Returns
    one entry per runtime, in the order given: its retire outcome, ``None`` for ``None``,
    or the exception its close raised (the caller records it as unverified); and the
    interruption (a ``BaseException`` that is not an ``Exception``: Ctrl-C, SIGTERM) that
    came while closing, or ``None``: the caller raises it once it has settled what was
    closed. It cuts no retirement short, wherever it comes, and finishes while it is in
    flight, so that a second one is ignored by the command line: a close it interrupted
    on the caller's own thread (a lone runtime is closed there) is run again to its end
    (retiring is idempotent); one whose thread it kept from starting is run on the
    caller's thread; every thread started is waited for. Each runtime is closed once,
    by whichever comes first: its thread or the caller's. Before, a close cut short on
    the caller's thread, or a second interruption as the threads were waited for again,
    left workers to the exit hook after ``edge run`` or ``edge plan`` had said it was
    interrupted, and nothing was settled.
    """
    results: list[Any] = [None] * len(runtimes)
    interrupted: BaseException | None = None
    named = [(number, runtime) for number, runtime in enumerate(runtimes) if runtime is not None]
    claimed: set[int] = set()  # closed (or being closed) by their own thread, or here
    done = {number: threading.Event() for number, _ in named}
    claiming = threading.Lock()
    caller = threading.current_thread()

    def close(number: int, runtime: StageRuntime) -> None:
        try:
            results[number] = runtime.close()
        except Exception as error:  # recorded unverified by the caller
            results[number] = error
        except BaseException as error:  # an interruption: handed to the caller's thread
            results[number] = error
            if threading.current_thread() is caller:
                raise

    def close_own(number: int, runtime: StageRuntime) -> None:  # on its own thread
        with claiming:
            if number in claimed:  # the caller's thread closed it: this one began late
                return
            claimed.add(number)
        try:
            close(number, runtime)
        finally:
            done[number].set()

    threads: list[threading.Thread] = []
    try:
        if len(named) == 1:  # one runtime: closed on this thread
            close(*named[0])
        else:
            for number, runtime in named:
                thread = threading.Thread(target=close_own, args=(number, runtime),
                                          daemon=True, name=f"edge-close-{runtime.name}")
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join()
    except BaseException as error:  # interrupted here: everything closes first, in flight
        interrupted = error
        with claiming:  # what no thread began (its start cut short, or this one's close)
            mine = {number for number, _ in named if number not in claimed}
            claimed.update(mine)
        for number, runtime in named:  # closed here, to its end (retiring is idempotent)
            if number in mine:
                close(number, runtime)
        for number, _ in named:  # every one a thread began: waited for
            if number not in mine:
                done[number].wait()
    for result in results:  # a close that raised one on its own thread
        if interrupted is None and isinstance(result, BaseException) \
                and not isinstance(result, Exception):
            interrupted = result
    return results, interrupted
