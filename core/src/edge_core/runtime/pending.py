"""A request submitted to one stage: its runtime record and the caller's handle on it.

:class:`PendingCall` is both. The stage runtime keeps it, by request id, as its record of
the request (epoch, serial, whether it was sent, cancelled, finished, delivered, which
bound expired: one object per request, not a record beside the handle). The caller
streams the request's events through it or waits for its result; it turns how the
request ended into a typed error — ``RequestCancelled`` when it was fenced,
``DeadlineExceeded`` when a deadline or ``call_timeout_s`` ended it, ``RequestFailed``
(with the worker's traceback) when the worker ended it with an error.

A pending call knows its stage only through :class:`CallStage`, the four things it asks
of it (a :class:`~edge_core.runtime.stage_runtime.StageRuntime` is one): its id, the
decision on each arriving event, the acknowledgement, the cancel.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from edge_contracts.drafts import draft_class
from edge_contracts.requests import EventKind, StageEvent, StageRequest
from edge_core.backend import CancelOutcome
from edge_core.errors import DeadlineExceeded, EdgeError
from edge_core.runtime.deadlines import TimerHandle
from edge_core.runtime.errors import RequestCancelled, RequestFailed
from edge_core.runtime.results import AckOutcome, ResultKey, StageResult
from edge_core.stage import RetainedOutputs

__all__ = ["CallStage", "PendingCall"]


class CallStage(Protocol):
    """What a :class:`PendingCall` asks of the stage that runs its request."""

    @property
    def stage_id(self) -> str:
        """The stage's id (named in errors)."""
        ...

    def accept(self, request_id: str, serial: int, event: StageEvent | None) -> bool:
        """Decide, atomically with cancellation, what becomes of one arriving event.

        ``event`` is ``None`` when the stream broke. False: the request is fenced and the
        event must not be delivered. A terminal event, a broken stream or a fenced request
        ends the request on the stage.
        """
        ...

    def ack(self, key: ResultKey) -> AckOutcome:
        """Acknowledge a delivered result (frees its slot when the key matches)."""
        ...

    def cancel(self, request_id: str | None = None) -> CancelOutcome:
        """Cancel one request (fenced before this returns); its exact outcome."""
        ...


_KeyDraft = draft_class(ResultKey)  # (edge_contracts.drafts)

_DONE = EventKind.DONE
_CANCELLED = "request {rid}: cancelled"  # worded by _cancelled, on the refusal paths only
_CANCELLED_BY_WORKER = "request {rid}: cancelled by the worker"


class PendingCall:
    """A submitted request: stream its events, or wait for its result.

    Consume it from one thread; :meth:`cancel` may be called from any thread.

    It is also its stage runtime's record of the request, from its registration to its end
    (:attr:`cancelled` to :attr:`timer`: set by the runtime, under its lock). ``source`` is
    the backend's stream of ``(event, outputs)`` pairs: given here, or set by the runtime
    once it has sent the request (the record is registered before the send).
    """

    # The runtime's record: what every request starts with is kept on the class (no
    # slots), a request sets only what changes for it.
    cancelled = False
    finished = False
    delivered = False
    sent = False
    draining = False  # fenced, left to finish in the worker: read to its end
    expired: str | None = None  # which bound ended it: its DeadlineExceeded
    timer: TimerHandle | None = None

    _result: StageResult | None = None  # (on the class: what every call starts with)
    _done = False
    _abandoned = False  # abandon() was called (it acts once)
    _closing = False  # close() cancelled it and reads it to its end (again if cut short)
    # The events before the terminal one and their outputs so far, made by the first
    # such event (the usual call has none: nothing is made for it)
    _partial: tuple[list[StageEvent], dict[str, Any]] | None = None
    # Releases of outputs that are views of worker memory (RetainedOutputs), with their
    # names: handed to the result, or called when the request ends otherwise. Made by
    # the first such output (a tuple, never appended to, until then).
    _retained: list[tuple[set[str], Callable[[], bool]]] | tuple[()] = ()

    def __init__(self, stage: CallStage, request: StageRequest, serial: int,
                 source: Iterator[tuple[StageEvent, Mapping[str, Any]]] | None = None,
                 started: float | None = None) -> None:
        self.stage = stage
        self.request = request
        self.request_id = request.request_id
        """The request's id."""
        self.serial = serial
        self.epoch = request.epoch
        if source is not None:
            self.source = source
        # When the request was handed to the backend (before it was sent): the latency
        # must not start after the send, or a thread descheduled in between would see
        # the work finish "before" it started.
        self._started = time.perf_counter() if started is None else started

    source: Iterator[tuple[StageEvent, Mapping[str, Any]]]
    """The backend's stream of ``(event, outputs)`` pairs for this request."""

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

    def _cancelled(self, message: str) -> EdgeError:
        """The error of a request that ended fenced: DeadlineExceeded when a bound ended it.

        ``message`` is a template: ``{rid}`` becomes the request id (its repr).
        """
        message = message.format(rid=repr(self.request_id))
        expired = self.expired
        if expired is not None:
            return DeadlineExceeded(f"stages[{self.stage.stage_id}]: request "
                                    f"{self.request_id!r}: {expired}")
        return RequestCancelled(message)

    def _next(self) -> tuple[StageEvent, Mapping[str, Any]]:
        stage = self.stage
        try:
            event, tensors = next(self.source)
        except StopIteration:
            self._done = True
            self._drop_retained()
            if stage.accept(self.request_id, self.serial, None):
                raise RequestFailed(self.request_id, "WorkerLost",
                                    "the event stream ended without a terminal event") from None
            raise self._cancelled(_CANCELLED) from None
        except EdgeError as exc:
            self._done = True
            self._drop_retained()
            if stage.accept(self.request_id, self.serial, None):
                raise
            raise self._cancelled(_CANCELLED) from exc
        except Exception as exc:
            # Raised inside the plugin's stream (its own error, raised as it is), or a
            # TypeError or ValueError raised by this frame's unpacking (the checks cost
            # nothing until then): the stream yielded something that is not a
            # (StageEvent, outputs) pair. Either way the stream is over, and the request
            # ends on its stage (its slot freed), as when it broke with an EdgeError.
            trace = exc.__traceback__
            unpacking = (isinstance(exc, TypeError | ValueError) and trace is not None
                         and trace.tb_next is None)
            self._done = True
            self._drop_retained()
            if unpacking:
                self._close_events()
            if not stage.accept(self.request_id, self.serial, None):
                raise self._cancelled(_CANCELLED) from exc
            if not unpacking:
                raise
            plugin = getattr(getattr(stage, "binding", None), "plugin", None)
            raise RequestFailed(
                self.request_id, "PluginError",
                f"stages[{stage.stage_id}]: "
                + (f"plugin {plugin!r}: " if plugin else "")
                + f"edge_call's stream yielded an item that is not a (StageEvent, "
                f"outputs) pair ({exc})") from None
        if self._retained:
            for names, _ in self._retained:  # outputs this event replaces are not theirs
                names.difference_update(tensors)
        if isinstance(tensors, RetainedOutputs):
            self._retained = [*self._retained, (set(tensors), tensors.release)]
        # One locked decision: a fenced request's event is refused, and a terminal event
        # is either delivered (DONE, slot kept until the ack) or ends the request.
        if not stage.accept(self.request_id, self.serial, event):
            self._done = True
            tensors = {}  # let go of the views first, so that their memory can be reused
            self._drop_retained()
            if not event.terminal and self.draining:
                self._read_to_end()  # left to finish: its slot is freed at its end
            self._close_events()
            raise self._cancelled(_CANCELLED)
        partial = self._partial
        if not event.terminal:
            if partial is None:
                self._partial = ([event], dict(tensors))
            else:
                partial[0].append(event)
                partial[1].update(tensors)
            return event, tensors
        self._done = True
        kind = event.kind
        if kind is _DONE:
            outputs: Mapping[str, Any]
            if partial is not None:  # events before it: their outputs under the terminal's
                seen, outputs = partial
                outputs.update(tensors)
                self._partial = None  # the result holds them now
                events: tuple[StageEvent, ...] = (*seen, event)
            else:  # the usual lone terminal event: its outputs are the result's
                outputs, events = tensors, (event,)
            request = self.request
            # The key's four values are the request's own, checked when it was made: set
            # on a draft (edge_contracts.drafts), without attrs' per-field setattr by name.
            key = _KeyDraft()
            key.request_id = request.request_id
            key.epoch = request.epoch
            key.generation = request.generation
            key.serial = self.serial
            key.__class__ = ResultKey
            retained = self._retained
            self._result = StageResult(
                key, outputs, events, time.perf_counter() - self._started, stage.ack,
                retained or None,
            )
            if retained:
                self._retained = ()  # the result holds them now
            return event, tensors
        self._drop_retained()
        if kind is EventKind.CANCELLED:
            raise self._cancelled(_CANCELLED_BY_WORKER)
        info = event.error  # EventKind.ERROR
        raise RequestFailed(self.request_id, info.type if info else "Error",
                            info.message if info else "",
                            traceback=info.traceback if info else None,
                            request_fault=info.fault if info else None,
                            error_detail=info.detail if info else None)

    def _read_to_end(self) -> None:
        """Read a fenced call that was left to finish up to its end, delivering nothing.

        Each event's worker memory goes back as it arrives; the terminal event (or the
        stream's end) ends the request on its stage, which frees its slot.
        """
        stage = self.stage
        while True:
            try:
                event, tensors = next(self.source)
            except (StopIteration, EdgeError):
                stage.accept(self.request_id, self.serial, None)
                return
            if isinstance(tensors, RetainedOutputs):
                tensors.release()
            del tensors
            if event.terminal:
                stage.accept(self.request_id, self.serial, event)
                return

    def _drop_retained(self) -> None:
        """Give back worker memory of a request that ends without a result."""
        retained, self._retained = self._retained, ()
        self._partial = None
        for _, release in retained:
            release()

    def _close_events(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def result(self) -> StageResult:
        """Wait for the terminal event and return the result (acknowledge it when done)."""
        while not self._done:  # what events() yields is not wanted here
            self._next()
        if self._result is None:  # pragma: no cover - _next() raised otherwise
            raise RequestFailed(self.request_id, "NoResult", "no terminal event")
        return self._result

    def close(self) -> None:
        """The caller is done with this request, whatever its state.

        A delivered result is acknowledged (its slot and worker memory go back); a request
        that has not ended is cancelled and then read to its end, delivering nothing (the
        stage's slot is freed by that end: nobody else reads it, so without this a stream
        abandoned half-way would hold its slot for good); one that ended otherwise needs
        nothing, except one whose terminal DONE its stage accepted (keeping the slot until
        the acknowledgement) when a ``KeyboardInterrupt`` came before its result was made:
        that slot is given back by an acknowledgement of the request's own key (stale,
        changing nothing, for any other request). Without a result, the worker memory of
        its outputs goes back too: those the call took, and those its source recorded
        that a ``KeyboardInterrupt`` lost as they were taken (the source's ``close``). A
        close cut short by a ``KeyboardInterrupt`` may be called again (or
        :meth:`abandon`): it reads on to the end, acknowledges once.
        """
        if self._result is not None:
            self._result.ack()
            return
        if not self._done:
            self.cancel()
            self._done = True
            self._closing = True  # (with _done, no call between: read on below, again
        if self._closing:  # when a Ctrl-C cut that short and this is called again)
            self._read_to_end()
            self._closing = False
        # Worker memory nothing holds now: outputs taken for a result that a Ctrl-C kept
        # from being made, and deliveries of the call lost as they were taken (their
        # source's close: a worker stage's CallEvents gives back what its call recorded)
        self._drop_retained()
        self._close_events()
        request = self.request
        self.stage.ack(ResultKey(request_id=request.request_id, epoch=request.epoch,
                                 generation=request.generation, serial=self.serial))

    def abandon(self) -> None:
        """Let this call go: its caller leaves without consuming it (failed, or interrupted).

        A ``KeyboardInterrupt`` (Ctrl-C, the command line's SIGTERM) while the caller
        waited for the call, or read its reply, leaves it without a consumer: nobody would
        take its end, and its stage's slot would stay held. It is closed (:meth:`close`)
        by the thread that queues its end (the stage's ``on_end``, a worker stage's), so
        that a call still running in a worker is fenced and read to its end there, never
        interrupted; else at once (a call that ended: nothing waits). Errors closing it
        are its stage's to report: the caller's own error is what is raised. Once: a
        second abandon (a caller's failure path after a callee's) does nothing.
        """
        if self._abandoned:
            return
        self._abandoned = True
        on_end = getattr(getattr(self.stage, "loaded", None), "on_end", None)
        if on_end is not None:
            with contextlib.suppress(Exception):
                if on_end(self.request_id, self._close_quietly):
                    return
        self._close_quietly()

    def _close_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def cancel(self) -> CancelOutcome:
        """Cancel this request (see :meth:`StageRuntime.cancel`).

        Worker memory behind outputs of events already taken is given back (outputs still
        referenced keep theirs: see :class:`~edge_core.runtime.results.StageResult`).
        """
        outcome = self.stage.cancel(self.request_id)
        if self._result is None:
            self._drop_retained()
        return outcome
