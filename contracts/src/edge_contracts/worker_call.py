"""One request inside the worker: :class:`Call`, the handler's way to answer it.

Split from :mod:`edge_contracts.worker` (which re-exports :class:`Call`): a call holds a
request's ids, params and inputs, numbers its events and sends them through the serve
loop (:class:`CallServer`, the part of the loop a call uses). Events may be emitted from
any thread; the first terminal one ends the request.

Standard library only, like the rest of the worker side.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from edge_contracts.errors import ContractError, PayloadTooLarge
from edge_contracts.events import TERMINAL_KINDS, EventKind
from edge_contracts.headers import FrameHeader
from edge_contracts.jsonvalues import EMPTY_OBJECT, thaw_json
from edge_contracts.worker_errors import print_exception
from edge_contracts.worker_events import outputs_too_large

if TYPE_CHECKING:
    from edge_contracts.worker_protocol import BootConfig
    from edge_contracts.worker_transport import Packed, TensorPacker, TensorUnpacker

__all__ = ["Call", "CallServer"]

_new = object.__new__
_Lock = threading.Lock


class CallServer(Protocol):
    """What a :class:`Call` needs of the serve loop that made it."""

    boot: BootConfig
    use_shm: bool

    def tensors(self) -> tuple[TensorPacker, TensorUnpacker]:
        """The loop's tensor packer and unpacker (numpy imported on first use)."""
        ...

    def send_event(
        self,
        call: Call,
        kind: EventKind,
        seq: int,
        packed: Packed | None,
        data: Mapping[str, Any] | None,
        error: BaseException | None,
        acks: list[list[Any]] | None,
    ) -> bool:
        """Encode and send one event of ``call`` (under its lock); False when not sent.

        ``packed`` holds the event's outputs (packed by the call into its own leases);
        ``acks``, the input segments to acknowledge, comes with the terminal event only.
        Raises a ``ContractError`` when the event cannot be encoded (its header over the
        channel's ``max_header_bytes``: ``EventTooLarge``; data that is not JSON), with
        nothing written and ``packed`` left to the caller.
        """
        ...

    def send_usual(self, call: Call, seq: int, outputs: Mapping[str, Any]) -> bool | None:
        """Write ``call``'s DONE event ``seq`` with ``outputs`` on the usual path.

        Called under the call's lock, the call already marked ended (its end must be
        seen before it is dropped); it is open again where this returns None. True when
        written, False when the channel is gone; None when the event is not a usual one
        (the call then packs and sends it through :meth:`send_event`), with nothing
        written, taken or leased.
        """
        ...

    def send_usual_in_place(
        self,
        call: Call,
        seq: int,
        outputs: Mapping[str, Any],
        allocated: dict[int, tuple[Any, Any]],
        acks: list[list[Any]],
    ) -> bool | None:
        """Write ``call``'s DONE event ``seq`` on the usual path, its outputs in place.

        As :meth:`send_usual`, for outputs that are all the call's output buffers
        (``allocated``: ``id(array)`` -> ``(array, lease)``, emptied of them when written),
        with ``acks`` (the input segments to acknowledge) in its meta. None when the event
        is not a usual one, with nothing written or taken (``allocated`` as it was).
        """
        ...

    def forget(self, call: Call) -> None:
        """Drop a call that has ended."""
        ...


class Call:
    """One request inside the worker: its ids, params and inputs, and the way to answer."""

    __slots__ = (
        "_acks",
        "_allocated",
        "_closed",
        "_lock",
        "_seq",
        "_server",
        "epoch",
        "generation",
        "inputs",
        "operation",
        "params",
        "request_id",
        "stage_id",
    )

    def __init__(
        self,
        server: CallServer,
        header: FrameHeader,
        inputs: dict[str, Any],
        acks: list[list[Any]],
    ) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self._acks = acks
        self._allocated: dict[int, tuple[Any, Any]] = {}
        self.request_id = header.request_id
        self.stage_id = header.stage_id
        self.epoch = header.epoch
        self.generation = header.generation
        self.operation = header.op
        meta = header.meta
        # no params (the usual request): a fresh empty dict without thawing anything
        self.params: dict[str, Any] = (
            {} if meta is EMPTY_OBJECT else thaw_json(meta))  # type: ignore[assignment,arg-type]
        self.inputs = inputs

    @classmethod
    def usual(
        cls,
        server: CallServer,
        request_id: str,
        operation: str,
        stage_id: str,
        epoch: int,
        generation: int,
        inputs: dict[str, Any],
        acks: list[list[Any]],
    ) -> Call:
        """The call of a request without params, from checked values.

        For the serve loop's usual path (see :mod:`edge_contracts.worker_kept`): the same
        call :class:`Call` makes of such a request's header, without the header. ``acks``:
        its shared-memory inputs' ``[segment, generation]`` in header order (as
        :func:`~edge_contracts.wire.refs_of` lists them; empty without), acknowledged by
        its end.
        """
        self = _new(cls)  # set as __init__ sets a call's fields
        self._server = server
        self._lock = _Lock()
        self._seq = 0
        self._closed = False
        self._acks = acks
        self._allocated = {}
        self.request_id = request_id
        self.stage_id = stage_id
        self.epoch = epoch
        self.generation = generation
        self.operation = operation
        self.params = {}
        self.inputs = inputs
        return self

    @property
    def closed(self) -> bool:
        """True once a terminal event was sent (including a CANCELLED one)."""
        return self._closed

    def emit(
        self,
        kind: EventKind | str,
        *,
        outputs: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        error: BaseException | None = None,
    ) -> bool:
        """Send one event; return False when it was dropped (request already ended).

        Thread-safe. A terminal kind (DONE, ERROR, CANCELLED) ends the request. An event
        that cannot be sent — its header longer than the channel's ``max_header_bytes``
        (large ``data`` or error text: put large values in output tensors), or ``data``
        that is not a JSON object — is not sent either (False): the request ends at once
        with an ERROR event carrying why (``EventTooLarge`` naming ``event.data`` or
        ``event.error`` and the sizes; ``HeaderMalformed``), and later emits are dropped.
        """
        if type(kind) is not EventKind:  # members pass without the enum's __call__
            kind = EventKind(kind)
        with self._lock:
            if self._closed:
                unsent = self._take_unsent()
                sent = ended = False
            else:
                seq = self._seq
                self._seq += 1
                packed = None
                try:  # a ContractError raised here is why the request ends (_refused)
                    if (outputs and kind is not EventKind.ERROR
                            and kind is not EventKind.CANCELLED):
                        try:
                            packed = self._server.tensors()[0].pack(outputs, self._allocated)
                        except PayloadTooLarge:  # over max_io_bytes: refused, nothing leased
                            packer = self._server.tensors()[0]
                            raise outputs_too_large(kind, packer.sizes(outputs),
                                                    packer.max_bytes) from None
                        except Exception as exc:  # becomes the request's ERROR event
                            kind, error, data = EventKind.ERROR, exc, None
                    if kind in TERMINAL_KINDS:
                        self._closed = True
                    sent = self._server.send_event(self, kind, seq, packed, data, error,
                                                   self._acks if self._closed else None)
                except ContractError as refused:  # not sendable: the request ends with it
                    sent = self._refused(seq, packed, refused)
                ended = self._closed
                unsent = self._take_unsent() if ended and self._allocated else []
        if unsent:
            # A request the loop ended (CANCELLED) may still have a handler thread
            # writing into its buffers: those segments are unlinked, never reused.
            self._server.tensors()[0].take_back(unsent, unlink=kind is EventKind.CANCELLED
                                                 or not ended)
        if ended:
            self._server.forget(self)
        return sent

    def _refused(self, seq: int, packed: Packed | None, refused: ContractError) -> bool:
        """End the request with an ERROR event carrying why its event ``seq`` was refused.

        Under the lock. The refused event's outputs are taken back (as when a send
        fails); the ERROR takes its ``seq`` and acknowledges the request's inputs; later
        emits are dropped. Returns False: the handler's event was not sent.
        """
        self._closed = True
        if packed is not None:
            self._server.tensors()[0].take_back(packed.leases)
        report = refused.with_traceback(None)  # the loop's own frames: nothing to tell
        try:
            self._server.send_event(self, EventKind.ERROR, seq, None, None, report,
                                    self._acks)
        except ContractError:  # not even the report fits: the channel's limit is tiny
            print(f"edge worker: request {self.request_id!r}: no event could be sent:",
                  file=sys.stderr)
            print_exception()
        return False

    def _take_unsent(self) -> list[tuple[str, int]]:
        """The leases of buffers this request allocated and did not send (under the lock)."""
        if not self._allocated:
            return []
        unsent = [(lease.segment, lease.generation) for _, lease in self._allocated.values()]
        self._allocated.clear()
        return unsent

    def output_buffer(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """Return a writable numpy array to compute one output into.

        Returned from :meth:`Handler.submit` (or passed to :meth:`emit`) as an output,
        this very array travels without a copy when it is large enough for shared memory
        (it lives in one of this worker's segments); a smaller one is private memory.
        Do not write into it after it was sent. Buffers a request does not send are
        taken back when the request ends.
        """
        packer = self._server.tensors()[0]
        with self._lock:
            if self._closed:  # ended already (cancelled): private memory, nothing leased
                return packer.allocate(tuple(shape), dtype, private=True)[0]
            array, lease = packer.allocate(tuple(shape), dtype)
            if lease is not None:
                self._allocated[id(array)] = (array, lease)
        return array

    @property
    def zero_copy_bytes(self) -> int | None:
        """Output size from which :meth:`output_buffer` gives shared memory (None: never)."""
        server = self._server
        return server.boot.shm_threshold if server.use_shm else None

    def token(self, data: Mapping[str, Any]) -> bool:
        """Emit a TOKEN event (streaming)."""
        return self.emit(EventKind.TOKEN, data=data)

    def output(self, outputs: Mapping[str, Any], data: Mapping[str, Any] | None = None) -> bool:
        """Emit a non-terminal OUTPUT event."""
        return self.emit(EventKind.OUTPUT, outputs=outputs, data=data)

    def done(
        self, outputs: Mapping[str, Any] | None = None, data: Mapping[str, Any] | None = None
    ) -> bool:
        """End the request successfully, optionally with outputs."""
        # the usual end of a graph call, tried first: inline outputs without input
        # segments to acknowledge, or outputs in the call's own output buffers (their
        # DONE acknowledges the inputs in its meta, written in by the usual path too)
        if outputs and data is None:
            server = self._server
            with self._lock:
                allocated = self._allocated
                if not self._closed and (allocated or not self._acks):
                    # Ended before send_usual drops it from the loop's calls: a handed-on
                    # call its loop enters meanwhile (after its handler returned) is seen
                    # ended there and dropped, not left in flight for good.
                    self._closed = True
                    sent = None
                    try:
                        sent = (server.send_usual_in_place(self, self._seq, outputs, allocated,
                                                           self._acks)
                                if allocated else server.send_usual(self, self._seq, outputs))
                    finally:
                        if sent is None:  # not a usual DONE: emit sends it below
                            self._closed = False
                    if sent is not None:  # written (or the channel gone): ended
                        self._seq += 1
                        return sent
        return self.emit(EventKind.DONE, outputs=outputs, data=data)

    def fail(self, error: BaseException) -> bool:
        """End the request with an ERROR event naming ``error``'s type and message."""
        return self.emit(EventKind.ERROR, error=error)
