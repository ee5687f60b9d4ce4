"""Controller-side view of one request in flight: its event stream and its deliveries.

A :class:`Call` is returned by :meth:`WorkerClient.submit`; iterate it (or call
:meth:`Call.next`) for :class:`Delivery` objects until the terminal one. Its other side,
the feed, is the worker client's: :meth:`Call.deliver` and :meth:`Call.fail`, from
whichever thread reads the channel, and :meth:`Call.deliver_done` for a usual reply (a
DONE without shared memory, as its event and arrays: :meth:`Call.take` hands the pair on
as it is, where no Delivery is needed). Delivering an
event does not free its shared memory: :meth:`Delivery.release` acknowledges it to the
worker (``with delivery:`` does so on exit). :meth:`Call.result` is the convenience for a
graph stage: it collects every output as owned copies and releases as it goes.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

import numpy.typing as npt

from edge_contracts.buffers import BufferDescriptor
from edge_contracts.copying import owned_copy
from edge_contracts.dtypes import DType
from edge_contracts.errors import ContractError
from edge_contracts.events import TERMINAL_KINDS
from edge_contracts.requests import ErrorInfo, EventKind, StageEvent, prechecked_event
from edge_contracts.tensors import dtype_of
from edge_contracts.validation import INT64_MAX, require_seconds
from edge_core.errors import DeadlineExceeded, StageClosed
from edge_core.host.errors import ProtocolViolation, RemoteError, TransportCapExceeded

__all__ = ["Call", "CallCancelled", "Delivery", "output_descriptor"]

#: A call's record of deliveries with shared memory is rid of those released at this length
_HELD_PRUNED_AT = 64

_NO_WAIT = "must be a finite number of seconds, or None to wait for the next event"

Array = npt.NDArray[Any]


class CallCancelled(StageClosed):
    """The request ended with CANCELLED (its epoch was fenced or it was cancelled)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(f"request[{request_id}]: cancelled: no output")


class Delivery:
    """One event of a request, with its output arrays.

    Arrays that came through shared memory are read-only views of the worker's segment,
    valid until :meth:`release`; inline ones are views of the received frame.
    ``event``: the delivery's :attr:`event` when its reader built it already (a usual
    reply, from a kept template); else it is built when first read.
    """

    __slots__ = (
        "_ack",
        "_refs",
        "arrays",
        "created_ns",
        "data",
        "epoch",
        "error",
        "event",
        "generation",
        "kind",
        "request_id",
        "retained",
        "seq",
        "stage_id",
        "terminal",
    )

    event: StageEvent
    """The validated :class:`StageEvent`: as its reader gave it, else built on first read.

    (Its slot stays empty until then: a read of it finds it there, or builds it through
    :meth:`__getattr__`, never a call per read.)
    """

    def __init__(
        self,
        *,
        request_id: str,
        stage_id: str,
        epoch: int,
        generation: int,
        seq: int,
        kind: EventKind,
        data: Mapping[str, Any],
        error: ErrorInfo | None,
        created_ns: int,
        arrays: dict[str, Array],
        refs: list[list[Any]],
        ack: Callable[[list[list[Any]], bool], None] | None,
        event: StageEvent | None = None,
    ) -> None:
        self.request_id = request_id
        self.stage_id = stage_id
        self.epoch = epoch
        self.generation = generation
        self.seq = seq
        self.kind = kind
        self.terminal = kind in TERMINAL_KINDS  # (EventKind.terminal, without the call)
        self.data = data
        self.error = error
        self.created_ns = created_ns
        self.arrays = arrays
        self._refs = refs
        self._ack = ack
        if event is not None:
            self.event = event
        self.retained = bool(refs)
        """True while this delivery still holds worker shared memory."""

    def __getattr__(self, name: str) -> Any:
        """Build :attr:`event` on its first read (the only slot ever left empty).

        What the header parser did not check is checked here (``error`` against ``kind``,
        outputs against ``kind``, ``data`` frozen, ``seq`` and ``created_ns`` in range): an
        event that fails it is the worker's — the controller's reader parsed a well-formed
        frame of a malformed event — so the ``ContractError`` is raised as a
        :class:`~edge_core.host.errors.ProtocolViolation` (a ``WorkerError``: the stage's
        fault, never the request's) naming the stage and the event's field
        (``stages[s0].event.error``), the original kept as its ``__cause__``. The
        request ends with it; the worker and its other calls go on.
        """
        if name != "event":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        arrays = self.arrays
        try:  # (a NOP on the way of a well-formed event)
            if len(arrays) == 1:  # the usual one output: no generator to run
                (array,) = arrays.values()
                # the kept descriptor looked up here, _descriptor called only for a new one
                found = _DESCRIPTORS.get((self.generation, array.dtype, array.shape))
                outputs: tuple[BufferDescriptor, ...] = (
                    found if found is not None else _descriptor(self.generation, array),)
            else:
                outputs = tuple([_descriptor(self.generation, a) for a in arrays.values()])
            if 0 <= self.seq <= INT64_MAX and 0 <= self.created_ns <= INT64_MAX:
                # ids, epoch and generation passed the header parser; kind is an enum
                event = prechecked_event(
                    self.request_id, self.stage_id, self.epoch, self.generation, self.seq,
                    self.kind, self.error, outputs, self.data, self.created_ns)
            else:
                event = StageEvent(
                    request_id=self.request_id,
                    stage_id=self.stage_id,
                    epoch=self.epoch,
                    generation=self.generation,
                    seq=self.seq,
                    kind=self.kind,
                    terminal=self.terminal,
                    error=self.error,
                    outputs=outputs,
                    data=self.data,
                    created_ns=self.created_ns,
                )
        except ContractError as error:
            raise ProtocolViolation(f"stages[{self.stage_id}].{error.field}",
                                    f"the worker sent a malformed event: {error.reason}",
                                    error.value) from error
        self.event = event
        return event

    def release(self, *, unlink: bool = False) -> None:
        """Acknowledge the shared memory behind :attr:`arrays` (idempotent).

        With ``unlink`` the worker drops the segments instead of reusing them: for views
        that are still referenced here and must keep their bytes. The references are let
        go once acknowledged: a release cut short (a ``KeyboardInterrupt``) and called
        again acknowledges them (perhaps a second time: a stale acknowledgement frees
        nothing), never forgets them.
        """
        refs = self._refs
        if refs and self._ack is not None:
            self._ack(refs, unlink)
        self._refs = []
        self.retained = False

    def __enter__(self) -> Delivery:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class Call:
    """A request in flight on one worker; iterate for its deliveries."""

    __slots__ = (
        "_cancel",
        "_ended",
        "_held",
        "_on_end",
        "_queue",
        "_queued_end",
        "_wait",
        "epoch",
        "last_seq",
        "request_id",
        "stage_id",
    )

    def __init__(
        self,
        request_id: str,
        stage_id: str,
        epoch: int,
        cancel: Callable[[str], None],
        wait: Callable[[queue.SimpleQueue[Any], float | None], Any] | None = None,
    ) -> None:
        self.request_id = request_id
        self.stage_id = stage_id
        self.epoch = epoch
        self.last_seq = -1
        self._cancel = cancel
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wait = wait
        self._ended = False
        self._queued_end = False  # the terminal delivery (or an error) is in the queue
        self._on_end: list[Callable[[], None]] | None = None  # on_end's, until called
        # Each delivery queued with worker shared memory, recorded before it is queued
        # (by the feed: no consumer's call in between); released by release_held
        self._held: list[Delivery] | tuple[()] = ()

    # -- the feed: what the worker client puts in, from whichever thread reads ------------

    def deliver(self, delivery: Delivery, again: bool = False) -> None:
        """Hand the consumer the request's next event (the client's reading side).

        ``again``: a delivery of this event was begun before and cut short (a
        ``KeyboardInterrupt``; the reader tries it again): it is queued only if that try
        did not queue it (:attr:`last_seq` is set as it is queued, with no point between
        where an interrupt can act), and what follows the queuing is done. A delivery with
        shared memory is recorded as it is queued, with no such point between
        (:meth:`release_held`).
        """
        if not again or self.last_seq != delivery.seq:
            # Recorded first (release_held): a consumer interrupted as it takes it loses
            # nothing. A new list each time, no Python call and no point where an
            # interrupt can act from the record's store to the queuing: release_held may
            # be reading the old list; a long stream's is rid of those released at times
            if delivery.retained:
                held = self._held
                if len(held) >= _HELD_PRUNED_AT:
                    held = [kept for kept in held if kept.retained]
                self._held = [*held, delivery]
            self.last_seq = delivery.seq
            self._queue.put(delivery)
        if delivery.terminal:
            self._queued_end = True
            if self._on_end:
                self._end_queued()

    def delivered_again(self, terminal: bool) -> None:
        """The rest of a delivery that a try cut short had queued already (see :meth:`deliver`).

        The reader that begins it again does not read the frame's shared memory a second
        time (its consumer may have given it back, the worker reused it): it only ends
        the call, where the event was its end.
        """
        if terminal:
            self._queued_end = True
            if self._on_end:
                self._end_queued()

    def end_cancelled(self, delivery: Delivery) -> None:
        """Queue the request's end made on this side: its CANCELLED, not an event of the worker's.

        :attr:`last_seq` stays the worker's last event queued, so that a delivery of one
        begun before and cut short (:meth:`deliver` with ``again``) still finds it queued.
        """
        self._queue.put(delivery)
        self._queued_end = True
        if self._on_end:
            self._end_queued()

    def deliver_done(self, event: StageEvent, arrays: dict[str, Array]) -> None:
        """Hand the consumer the request's DONE without shared memory: its event, its arrays.

        What :meth:`deliver` does with a :class:`Delivery` of them, without making one
        (the client's reader of a usual reply, whose event it built already): :meth:`take`
        returns the pair as it is, :meth:`next` a Delivery made of it.
        """
        self.last_seq = event.seq
        self._queue.put((event, arrays))
        self._queued_end = True
        if self._on_end:
            self._end_queued()

    def fail(self, error: BaseException) -> None:
        """End the request for the consumer with ``error`` (the channel ended)."""
        self._queue.put(error)
        self._queued_end = True
        if self._on_end:
            self._end_queued()

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the call's end is queued: its terminal delivery or error.

        Called once, from the thread that queues the end (the channel's reader, a
        canceller, a failing channel), or here at once when it is queued already; the
        consumer can then take every delivery without waiting. ``callback`` must not
        raise and must not take deliveries itself (it runs inside the channel's read).
        One registered while another waits (a call abandoned after the event loop took
        its end: :meth:`PendingCall.abandon`) is called too, after it: none replaces one.
        """
        pending = self._on_end
        if pending is None:
            self._on_end = [callback]
        else:  # one registered before and not called yet is kept: each is called once
            pending.append(callback)
        if self._queued_end:
            self._end_queued()

    def _end_queued(self) -> None:
        pending = self._on_end
        if pending is None:
            return
        while True:  # list.pop is atomic: the queuing side and on_end may both get here
            try:
                callback = pending.pop(0)
            except IndexError:
                return
            callback()

    # -- consumer side -----------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """True once the terminal delivery (or an error) has been taken."""
        return self._ended

    def next(self, timeout: float | None = None) -> Delivery:
        """Return the next delivery; raise the call's error, or :class:`DeadlineExceeded`.

        ``timeout`` is a finite number of seconds (zero or less: no wait), or ``None`` to
        wait for as long as the call takes. One that is no such number (NaN, an infinity,
        a string) is refused with ``InvalidValue`` naming ``timeout`` when the wait would
        use it (a delivery already in is returned): the call goes on, to be waited for
        again. Checked on the wait's failure path only, which a call's usual path never
        takes.
        """
        item = self.take(timeout)
        if isinstance(item, Delivery):
            return item
        event, arrays = item  # a DONE handed over by deliver_done
        return Delivery(request_id=event.request_id, stage_id=event.stage_id,
                        epoch=event.epoch, generation=event.generation, seq=event.seq,
                        kind=event.kind, data=event.data, error=None,
                        created_ns=event.created_ns, arrays=arrays, refs=[], ack=None,
                        event=event)

    def take(self, timeout: float | None = None) -> Delivery | tuple[StageEvent, dict[str, Array]]:
        """:meth:`next`, but a DONE handed over by :meth:`deliver_done` comes as it was given.

        That is, as its ``(event, arrays)`` pair: no :class:`Delivery` is made of it (one
        would hold no shared memory to release).
        """
        if self._ended:
            raise StopIteration
        try:
            if self._wait is not None:  # this thread reads the channel while it waits
                item = self._wait(self._queue, timeout)
            else:
                item = self._queue.get(timeout=timeout)
        except (queue.Empty, TimeoutError):
            if timeout is not None:  # NaN and -inf end a wait at once: no wait was asked
                require_seconds(timeout, "timeout", reason=_NO_WAIT)
            raise DeadlineExceeded(
                f"request[{self.request_id}]: no event within the timeout: {timeout}"
            ) from None
        except Exception:  # the channel has ended: this call ends with its error
            if timeout is not None:  # or the timeout could not be waited for: it goes on
                require_seconds(timeout, "timeout", reason=_NO_WAIT)
            self._ended = True
            raise
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        if item.__class__ is tuple or item.terminal:  # a DONE's pair, or a Delivery
            self._ended = True
        return item  # type: ignore[no-any-return]  # (either: no cast call)

    def __iter__(self) -> Iterator[Delivery]:
        while not self._ended:
            yield self.next()

    def release_held(self) -> None:
        """Give back the shared memory of every delivery of this call not released yet.

        For a consumer that is done with the call without a result holding its memory (its
        request ended otherwise, or a ``KeyboardInterrupt`` came as a delivery was taken,
        after it left the queue and before anything held it: the delivery is then nobody's
        but this record's). Each is unlinked, never reused: a view of it may still be
        referenced (by the interrupted frames). Idempotent: a delivery released already
        (by whoever held it) acknowledges nothing again.
        """
        for delivery in self._held:
            delivery.release(unlink=True)

    def cancel(self) -> None:
        """Cancel this request: it ends CANCELLED at once; later events are dropped."""
        self._cancel(self.request_id)

    def result(self, timeout: float | None = None, *, copy: bool = True) -> dict[str, Array]:
        """Wait for the end; return every output array by name (later events win).

        With ``copy`` (the default) arrays are owned copies and shared memory is released
        as soon as it is copied; without, views are returned and the caller must keep
        them only as long as it does not care about reuse (they are released here too).
        Raises :class:`RemoteError` on ERROR (or :class:`TransportCapExceeded` when the
        worker hit its shared-memory cap) and :class:`CallCancelled` on CANCELLED.
        """
        outputs: dict[str, Array] = {}
        while True:
            delivery = self.next(timeout)
            with delivery:
                for name, array in delivery.arrays.items():
                    outputs[name] = owned_copy(array) if copy else array
            if delivery.terminal:
                break
        if delivery.kind is EventKind.ERROR:
            raise _remote(self.request_id, delivery.error)
        if delivery.kind is EventKind.CANCELLED:
            raise CallCancelled(self.request_id)
        return outputs


def output_descriptor(generation: int, dtype: DType, shape: tuple[int, ...],
                      nbytes: int) -> BufferDescriptor:
    """The descriptor of an output array of a worker of ``generation`` (validated).

    What :attr:`Delivery.event` lists for each of its arrays (the owner is the worker's
    generation).
    """
    return BufferDescriptor(f"worker-g{generation}", generation, dtype, shape, nbytes)


def _descriptor(generation: int, array: Array) -> BufferDescriptor:
    """The output descriptor of ``array``: validated once per generation, dtype and shape.

    A stream repeats the same few output shapes, so the checked descriptors are kept
    (bounded); only a shape not seen before is validated.
    """
    key = (generation, array.dtype, array.shape)
    found = _DESCRIPTORS.get(key)
    if found is None:
        found = output_descriptor(generation, dtype_of(array), tuple(array.shape),
                                  array.nbytes)
        if len(_DESCRIPTORS) >= 1024:
            _DESCRIPTORS.clear()
        _DESCRIPTORS[key] = found
    return found


_DESCRIPTORS: dict[tuple[Any, ...], BufferDescriptor] = {}


def _remote(request_id: str, error: ErrorInfo | None) -> Exception:
    kind = error.type if error else "Error"
    message = error.message if error else "-"
    if kind == "ShmCapExceeded":
        return TransportCapExceeded(
            f"request[{request_id}].outputs", "worker cap: " + message, kind
        )
    return RemoteError(f"request[{request_id}]", kind, message,
                       error.detail if error else None)
