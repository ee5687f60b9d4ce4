"""The controller's handle on one running worker: calls, control, liveness, health, retirement.

A :class:`WorkerClient` is made by :func:`edge_core.host.bootstrap.start_worker` once the
worker's hello was verified. Incoming frames are demultiplexed by request id (so many
requests can be in flight on one channel) by whichever thread reads the channel: the
thread waiting for a call reads it itself, a background reader when nobody waits
(:class:`~edge_core.host.reading.ChannelReader`). A
:class:`~edge_core.host.health.Watchdog` thread sees the process exit. Both threads are
created at start; the per-call path creates no thread, serialises no tensor data to JSON
and writes each frame with one scatter-gather ``sendmsg``.

When the worker dies or breaks protocol, every call in flight fails at once with a typed
error (:class:`~edge_core.host.errors.WorkerGone`, a ``WorkerLost``, or
:class:`~edge_core.host.errors.ProtocolViolation`) and :meth:`WorkerClient.health` says
why; the worker's shared-memory segments are swept. :meth:`WorkerClient.retire` is
idempotent and bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import socket
import struct
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_contracts.binary_header import FIXED, ID_LENGTHS, SHM_TENSORS_BIT, kept_header
from edge_contracts.call_frames import encode_ack_frame, encode_call_frame
from edge_contracts.drafts import draft_class
from edge_contracts.error_details import ErrorDetail
from edge_contracts.errors import (
    ContractError,
    HeaderMalformed,
    InvalidValue,
    StreamClosed,
    WireError,
)
from edge_contracts.frame_reader import DEFAULT_BUFFER_BYTES, FrameReader, ReceivedFirstKept
from edge_contracts.headers import FrameHeader, Limits, prechecked_header, tensor_totals
from edge_contracts.jsonvalues import EMPTY_OBJECT, JSONObject, thaw_json
from edge_contracts.protocol import (
    FEATURE_BINARY_HEADER,
    FEATURE_HEARTBEAT,
    FEATURE_SHM_TENSORS,
    FEATURE_SPIN_FOLLOW,
    FEATURE_WORKER_SPIN,
    OP_ACK,
    OP_CANCEL,
    OP_EVENT,
    OP_HEARTBEAT,
    OP_LOAD,
    OP_PING,
    OP_QUERY,
    OP_REPLY,
    OP_SHUTDOWN,
    OP_SPIN,
    OP_WARMUP,
)
from edge_contracts.request_faults import RequestFault
from edge_contracts.requests import (
    MAX_ERROR_MESSAGE,
    ErrorInfo,
    EventKind,
    Operation,
    StageEvent,
    StageRequest,
)
from edge_contracts.shm import Lease, SegmentConsumer, SegmentProducer, ShmCapExceeded, sweep
from edge_contracts.validation import INT64_MAX, require_int, require_seconds
from edge_contracts.waiting import ReadableWait, readable
from edge_contracts.wire import (
    BINARY_MAGIC,
    PREFIX,
    PREFIX_SIZE,
    Frame,
    encode_frame,
    prechecked_frame,
    write_frame,
)
from edge_contracts.worker_protocol import spin_meta
from edge_contracts.worker_transport import Packed, TensorPacker, TensorUnpacker, refs_of
from edge_core.errors import DeadlineExceeded
from edge_core.host.calls import Call, Delivery
from edge_core.host.devlock import DEFAULT_LOCK_TIMEOUT_S, DeviceLock
from edge_core.host.errors import (
    ProtocolViolation,
    RemoteError,
    TransportCapExceeded,
    WorkerGone,
    WorkerUnresponsive,
)
from edge_core.host.health import LOST, READY, RETIRED, Health, Watchdog, describe_exit
from edge_core.host.identity import ProcessIdentity
from edge_core.host.inputs import InputBuffers
from edge_core.host.liveness import monitor
from edge_core.host.loop_reading import LoopReading
from edge_core.host.reading import ChannelReader
from edge_core.host.reply_kept import MAX_KEPT, STAMP, KeptReply, reply_template
from edge_core.host.request_kept import MAX_KEPT as MAX_KEPT_REQUESTS
from edge_core.host.request_kept import (
    KeptRefRequest,
    KeptRequest,
    ref_request_template,
    request_template,
)
from edge_core.host.retire import DEFAULT_RETIRE_DEADLINE_S, ProcessTree, RetireOutcome
from edge_core.host.routes import Route
from edge_core.host.spinning import SpinDecision, governor
from edge_core.host.start_path import SPAWNED, StartPath

if TYPE_CHECKING:  # typing only: edge run imports no asyncio
    import asyncio

__all__ = ["FIRST_CONTROL_ID", "WorkerClient"]

FIRST_CONTROL_ID = "ctl-1"
"""The request id of a channel's first control op (the first of ``WorkerClient``'s own
``ctl-N`` ids): the one :func:`~edge_core.host.bootstrap.start_worker` sends, when it
sends one, before the client exists."""

_EMPTY: dict[str, Any] = {}
_NOT_PACKED = Packed((), [], [], frozenset())  # a kept request's: nothing leased
_GENERATION = struct.Struct("<Q")  # a reference's generation in a kept zero-copy request
_NOTHING_CLAIMED: dict[int, Any] = {}
_EVENT_KINDS: dict[object, EventKind] = {kind.value: kind for kind in EventKind}
_TERMINAL_KINDS = frozenset(kind for kind in EventKind if kind.terminal)
_OP_TEXT: dict[Operation, str] = {op: op.value for op in Operation}  # no enum property per call
_FIXED_SIZE = FIXED.size  # where a binary header's request id begins
_STAMP_SIZE = STAMP.size
_DONE = EventKind.DONE
# A draft of the event class (edge_contracts.drafts): a usual reply's event is set as
# prechecked_event sets one, without a call
_EventDraft = draft_class(StageEvent)
_frombuffer = np.frombuffer
# A receive that returns at once when the socket holds nothing (the channel reader's
# read before its poll); None where the platform has no such flag: the reader polls first.
_DONTWAIT: int | None = getattr(socket, "MSG_DONTWAIT", None)
_EXIT_GRACE_S = 0.25  # how long an end of stream waits to learn the exit status


def _error_of(error: Mapping[str, Any]) -> ErrorInfo:
    if not isinstance(error, Mapping):  # (a JSON value of another type: the worker's fault)
        raise HeaderMalformed("header.meta.error", error, "must be an object or null")
    trace = error.get("traceback")
    fault = None
    if error.get("fault") is not None:
        # a malformed declaration is dropped: the error then counts as the server's
        with contextlib.suppress(ContractError):
            fault = RequestFault.from_dict(error["fault"])
    detail = None
    if error.get("detail") is not None:
        # a malformed detail is dropped: the message still says everything
        with contextlib.suppress(ContractError):
            detail = ErrorDetail.from_dict(error["detail"])
    return ErrorInfo(str(error["type"]), str(error["message"]),
                     str(trace)[-MAX_ERROR_MESSAGE:] if trace is not None else None, fault,
                     detail)


class WorkerClient:
    """A started, verified worker. Build with :func:`~edge_core.host.bootstrap.start_worker`.

    Attributes:
        route: the route it was started from.
        generation: the worker generation (stamped on every frame both ways).
        identity: the worker's ``(pid, create_time)``, checked against its hello.
        hello: the hello's meta (versions, features, pid, create_time).
        features: the features in use on this channel.

    """

    def __init__(
        self,
        *,
        route: Route,
        generation: int,
        sock: socket.socket,
        limits: Limits,
        tree: ProcessTree,
        popen: Any,
        hello: Mapping[str, Any],
        features: frozenset[str],
        producer: SegmentProducer | None,
        consumer: SegmentConsumer | None,
        worker_prefix: str | None,
        threshold: int,
        staged: Path | None,
        spin_us: int | None = 0,
        sent_control: str | None = None,
        start_path: StartPath | None = None,
    ) -> None:
        self.route = route
        self.generation = require_int(generation, "worker.generation")  # sent unchecked
        self.identity: ProcessIdentity = tree.main
        self.hello = hello
        self.features = features
        self.start_path: StartPath = start_path or StartPath(SPAWNED)
        """How the worker was started: forked by the warm pool, or spawned (and why)."""
        self._sock = sock
        self._limits = limits
        self._binary = FEATURE_BINARY_HEADER in features  # requests and acks in binary
        self._tree = tree
        self._popen = popen
        self._producer = producer
        self._consumer = consumer
        self._worker_prefix = worker_prefix
        self._packer = TensorPacker(producer, threshold, field="inputs")
        self._inputs = InputBuffers(self._packer)
        self._unpacker = TensorUnpacker(consumer)
        self._staged = staged
        self._send_lock = threading.Lock()
        self._spin_lock = threading.Lock()
        self._spin_told = 0  # the cap the worker was last told (it starts with none)
        self._follow_told: int | None = None  # what it was last told to follow (None: none)
        self._spin_frame: list[bytes | memoryview] | None = None  # to go with the next write
        self._lock = threading.Lock()
        # Calls in flight by request id. One change to it takes no lock: the reader of a
        # usual reply takes its call out by one pop (atomic). Everything else that changes
        # it or reads more than one entry holds _lock, iterates over a copy (list() makes
        # it in C, atomically) and takes a call out only by a pop, so that whoever pops a
        # call ends it. A call is registered under _lock too: while _lock is held an id
        # can only leave the dict, never come back as another call, so a pop under the
        # lock of a call seen in the copy finds that call or nothing (cancel relies on it:
        # a registration without the lock let a cancel pop a newer call of a reused id).
        self._calls: dict[str, Call] = {}
        self._replies: dict[str, Call] = {}
        self._control_ids = itertools.count(1)
        # The control op start_worker sent as this channel's first (ctl-1) once the hello
        # was verified: its waiter is in place before the reader below starts, so that the
        # reply, wherever it is by then, is not read and dropped by the background thread
        self._sent_control: tuple[str, str, Call] | None = None
        if sent_control is not None:
            next(self._control_ids)  # ctl-1 is taken
            first = FIRST_CONTROL_ID
            waiter = Call(first, "", 0, lambda _: None,
                          lambda inbox, timeout_s: reader.wait(inbox, timeout_s))
            self._replies[first] = waiter
            self._sent_control = (sent_control, first, waiter)
        self._state = READY
        self._reason: str | None = None
        self._failure: BaseException | None = None
        self._exit_status: int | None = None
        self._retire_lock = threading.Lock()
        self._outcome: RetireOutcome | None = None
        # The usual reply is recognised in the client's own receive buffer (_read_one), and
        # a zero-copy reply alone in its receive gets its kept header there too; anything
        # else is handed to the frame reader, which takes it first
        self._intake = memoryview(bytearray(DEFAULT_BUFFER_BYTES))
        self._receive_with(sock.recv_into)
        # received, not yet taken by the reader: given to it first
        self._received = ReceivedFirstKept(self._recv_into)
        # A frame waits: parsed and not yet delivered (in _pending), or bytes of one in the
        # reader's buffer (or handed to it): False only when neither
        self._more = False
        # Frames read and not yet delivered, the first being delivered: a frame is
        # appended as its bytes leave the reader's buffer and removed once delivered, each
        # with no point between where a KeyboardInterrupt can act, so that an interrupt
        # at any point of its reading or delivery leaves it to the next reader (before it
        # reads the socket again), which delivers it (once: _head_call)
        self._pending: list[Frame] = []
        # The call of the frame being delivered, set (before anything is queued) as its
        # delivery begins and cleared once it is delivered: found set, the delivery is
        # one begun before (a terminal event's call taken out of _calls already) and
        # queues its event only if that one did not (Call.deliver's ``again``)
        self._head_call: Call | None = None
        self._usual: dict[bytes, KeptReply] = {}  # see reply_kept
        self._kept_requests: dict[tuple[object, ...], KeptRequest] = {}  # see request_kept
        self._kept_ref_requests: dict[tuple[object, ...], KeptRefRequest] = {}  # (the same)
        self._frames = FrameReader(self._received, limits)
        # what the frame reader checks a binary prefix against before it looks a header
        # up in the kept ones (kept_header), for _read_one's own look-up of a whole frame
        self._kept_prefix = FEATURE_BINARY_HEADER in limits.supported_features
        self._header_cap = limits.max_header_bytes
        self._io_cap = limits.max_io_bytes
        self._reader = ChannelReader(
            sock.fileno(),
            self._read_one,
            self._gone_error,
            spin_us=spin_us,
            name=f"edge-reader-{tree.main.pid}",
            peer_pid=tree.main.pid,
            read_now=None if _DONTWAIT is None else partial(self._read_one, _DONTWAIT),
            buffered=partial(getattr, self, "_more"),  # (what _read_one answers)
        )
        reader = self._reader  # what the first control's waiter reads with
        # What each Call is given, bound once (the reader holds this client's bound methods
        # already: no new cycle)
        self._cancel_call = self.cancel
        self._reader_wait = self._reader.wait
        self._watchdog = Watchdog(popen, self._on_exit)
        self._listeners: list[Callable[[BaseException], None]] = []
        self._owed: set[str] = set()  # cancelled here, the worker's own end not yet heard
        self._loop_reading: LoopReading | None = None  # an event loop reading for its calls
        self.last_heard = time.monotonic()  # liveness: the last frame read from the worker
        self.heartbeats = FEATURE_HEARTBEAT in features
        monitor().watch(self)
        if self._reader.governed and FEATURE_WORKER_SPIN in features:
            tell = weakref.WeakMethod(self._tell_spin)  # the governor keeps no client alive
            governor().follow(self._reader.lead_wait,
                              lambda: (method := tell()) is not None and method())

    # -- control calls -------------------------------------------------------------------

    def control(
        self, op: str, meta: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Send a control op (``load``, ``warmup``, ``ping``, ``query``); wait for its reply.

        ``timeout_s`` is a finite number of seconds (zero or less: no wait), or ``None``
        to wait for as long as the reply takes; anything else (NaN, an infinity, a bool,
        a string) is refused with ``InvalidValue`` naming ``timeout_s``, before anything
        is sent.
        """
        if timeout_s is not None:
            require_seconds(timeout_s, "timeout_s", reason="must be a finite number of "
                            "seconds, or None to wait for the reply")
        self._refuse_if_down()
        request_id = f"ctl-{next(self._control_ids)}"
        waiter = Call(request_id, "", 0, lambda _: None, self._reader.wait)
        with self._lock:
            self._replies[request_id] = waiter
        return self._control_reply(op, request_id, waiter, timeout_s,
                                   FrameHeader(op, request_id, "", 0, self.generation, meta=meta))

    def sent_control_reply(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the reply to the control op that started this channel; return it.

        :func:`~edge_core.host.bootstrap.start_worker` sends it (``first_control``) as
        soon as the worker's hello is verified, so that the worker works on it (a load)
        while the client is built. ``timeout_s`` as for :meth:`control`. Raises
        ``InvalidValue`` when the channel was started without one, or it was awaited
        already.
        """
        if timeout_s is not None:
            require_seconds(timeout_s, "timeout_s", reason="must be a finite number of "
                            "seconds, or None to wait for the reply")
        sent, self._sent_control = self._sent_control, None
        if sent is None:
            raise InvalidValue("sent_control", None, "no control op started this channel, or "
                               "its reply was awaited already")
        op, request_id, waiter = sent
        return self._control_reply(op, request_id, waiter, timeout_s)

    def _control_reply(self, op: str, request_id: str, waiter: Call, timeout_s: float | None,
                       send: FrameHeader | None = None) -> dict[str, Any]:
        """Send ``send`` (unless None: sent already), wait for control ``request_id``'s reply.

        Its waiter, registered in ``_replies``, leaves them however this ends.
        """
        try:
            if send is not None:
                self._send(send)
            delivery = waiter.next(timeout_s)
        except DeadlineExceeded:
            if op != OP_PING:
                raise
            raise WorkerUnresponsive(
                "worker.ping", f"no answer within {timeout_s} s", self.identity.pid
            ) from None
        finally:
            with self._lock:
                self._replies.pop(request_id, None)
        if delivery.error is not None:
            raise RemoteError(f"worker.{op}", delivery.error.type, delivery.error.message,
                              delivery.error.detail)
        return thaw_json(delivery.data)  # type: ignore[return-value,arg-type]

    def load(self, config: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Ask the worker's handler to load; return its report."""
        return self.control(OP_LOAD, config, timeout_s=timeout_s)

    def warmup(
        self, config: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Ask the worker's handler to warm up; return its report (e.g. node -> provider)."""
        return self.control(OP_WARMUP, config, timeout_s=timeout_s)

    def query(
        self, question: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Ask the worker's handler a question that takes no slot; return its JSON answer.

        The worker answers as soon as it reads the frame, while requests stream and ahead
        of those still queued in it (:data:`edge_contracts.protocol.OP_QUERY`). Raises
        :class:`RemoteError` when the handler failed or answers no query,
        :class:`WorkerGone` when the worker is down, ``DeadlineExceeded`` after
        ``timeout_s``.
        """
        return self.control(OP_QUERY, question, timeout_s=timeout_s)

    def initialise(
        self,
        load_config: Mapping[str, Any],
        warmup_config: Mapping[str, Any],
        *,
        device_id: str | None = None,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        timeout_s: float | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load then warm up, holding the device's initialisation lock across both.

        ``device_id`` is the physical identity of the device the worker initialises
        (None: no lock). Waiting for the lock is bounded by ``lock_timeout_s`` and ends
        in :class:`~edge_core.host.errors.DeviceLockTimeout` naming the holder's PID.
        """
        if device_id is None:
            return self.load(load_config, timeout_s=timeout_s), self.warmup(
                warmup_config, timeout_s=timeout_s
            )
        with DeviceLock(device_id, timeout_s=lock_timeout_s):
            loaded = self.load(load_config, timeout_s=timeout_s)
            return loaded, self.warmup(warmup_config, timeout_s=timeout_s)

    @property
    def reply_wait(self) -> ReadableWait:
        """The wait a leading caller spends for this worker's socket.

        Its spin budget and its measured waits (:mod:`edge_core.host.spinning`).
        """
        return self._reader.lead_wait

    @property
    def spin_decision(self) -> SpinDecision | None:
        """The controller's spin budget on this channel and why.

        None when the channel's budget was given at start instead of governed
        (:mod:`edge_core.host.spinning`).
        """
        return governor().decision_for(self._reader.lead_wait) if self._reader.governed else None

    @property
    def worker_spin_cap(self) -> int:
        """The most the worker was last told it may spin for its next request (µs).

        0 when it was told nothing (its budget was given at start, or it does not take
        ``spin`` frames) or when the controller runs more processes than cores; what the
        worker does within it, it measures (its ``ping`` answer's ``spin``, see
        :mod:`edge_contracts.worker_spin`).
        """
        return self._spin_told

    def _tell_spin(self) -> None:
        """Tell the worker the cap the governor permits it now, and what it follows, if changed.

        What it follows (``follow_us``) goes only to a worker that offered ``spin-follow``.
        The ``spin`` frame goes out with the next frame this client writes, in the same
        write: what it says matters only to the worker's waits for its next frame, and
        this may run inside a wait for the worker's reply, where a write could block on a
        worker that is itself blocked writing to the waiting thread.
        """
        with self._spin_lock:
            wait = self._reader.lead_wait
            cap = governor().worker_cap_for(wait)
            follow = (governor().worker_follow_for(wait)
                      if FEATURE_SPIN_FOLLOW in self.features else None)
            if (cap is None or (cap == self._spin_told and follow == self._follow_told)
                    or self._state != READY):
                return
            self._spin_frame = encode_frame(
                FrameHeader(OP_SPIN, "", "", 0, self.generation, meta=spin_meta(cap, follow)),
                [], binary=self._binary)
            self._spin_told = cap
            self._follow_told = follow

    def ping(self, *, timeout_s: float = 5.0) -> dict[str, Any]:
        """Round-trip a ping through the worker's loop; return its answer.

        Raises :class:`WorkerUnresponsive` when no answer comes within ``timeout_s`` (the
        loop answers between requests: a ping behind a long graph call waits for it).
        """
        return self.control(OP_PING, {}, timeout_s=timeout_s)

    # -- liveness (what the monitor asks, :mod:`edge_core.host.liveness`) -----------------

    @property
    def liveness_pid(self) -> int:
        """The worker's PID, for the liveness monitor."""
        return self.identity.pid

    def outstanding(self) -> int:
        """Calls, control calls and cancelled calls whose last event the worker owes."""
        busy = len(self._calls) + len(self._replies) + len(self._owed)
        return busy if self._state == READY else 0

    def unread(self) -> bool:
        """True when bytes from the worker wait to be read (it spoke; this side is slow)."""
        if self._frames.buffered or self._pending:
            return True
        try:
            return readable(self._sock.fileno(), 0.0)
        except (OSError, ValueError):  # closed meanwhile
            return False

    def unresponsive(self, reason: str) -> None:
        """The liveness monitor's verdict: fail everything in flight with WorkerUnresponsive."""
        pid = self.identity.pid
        self._lost(f"worker: unresponsive: {reason}: pid {pid}",
                   WorkerUnresponsive("worker", f"unresponsive: {reason}", pid))

    def on_lost(self, listener: Callable[[BaseException], None]) -> None:
        """Call ``listener(error)`` once, from the thread that notices, when the worker is lost.

        Also when it is retired (the error then says ``retired``); listeners must be quick.
        A worker lost already is reported at once.
        """
        with self._lock:
            if self._state == READY:
                self._listeners.append(listener)
                return
        listener(self._gone_error())

    # -- health ------------------------------------------------------------------------

    def health(self) -> Health:
        """Report the worker's state; also captures its current process tree."""
        if self._state == READY:
            self._tree.capture()
        with self._lock:
            return Health(
                state=self._state,
                reason=self._reason,
                exit_status=self._exit_status,
                in_flight=len(self._calls),
                identity=self.identity,
            )

    def _lost(self, reason: str, error: BaseException) -> None:
        """Mark the worker lost (first reason wins) and fail everything in flight."""
        with self._lock:
            if self._state != READY:
                return
            self._state = LOST
            self._reason = reason
            self._failure = error
            # each call taken out by a pop (see _calls): one a usual reply's reader took
            # meanwhile is ended by that reader alone, not failed here too (but a call
            # whose frame a reader is delivering, _head_call, is failed: it may be one an
            # interrupt left undelivered; one being delivered now ends with this error,
            # its delivery queued behind it never taken: the worker is gone anyway)
            pop = self._calls.pop
            calls = [call for call in map(pop, list(self._calls), itertools.repeat(None))
                     if call is not None] + list(self._replies.values())
            self._replies.clear()
            # a call whose end was read, taken out and not delivered yet (interrupted)
            head, self._head_call = self._head_call, None
            if head is not None and head not in calls:
                calls.append(head)
        for listener in self._listeners:  # first: who sees the error sees the state too
            listener(error)
        for call in calls:
            call.fail(error)
        with self._send_lock, contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._worker_prefix is not None and self._exit_status is not None:
            sweep(self._worker_prefix)

    def _channel_closed(self) -> None:
        """End of stream: name the death if the process has exited (usually it just has)."""
        if self._state != READY:
            return
        try:
            status = self._popen.wait(timeout=_EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self._lost(
                f"worker: channel closed: pid {self.identity.pid}",
                WorkerGone("worker.channel", "closed by the worker", self.identity.pid),
            )
        else:
            self._on_exit(status)

    def _on_exit(self, status: int | None) -> None:
        self._exit_status = status
        # The process is gone: sweep its segments before the health turns, so that a
        # caller who sees the worker lost never sees its shared memory still there.
        if self._worker_prefix is not None:
            sweep(self._worker_prefix)
        reason = f"worker: {describe_exit(status)}: pid {self.identity.pid}"
        self._lost(reason, WorkerGone("worker", describe_exit(status), self.identity.pid))

    def _gone_error(self) -> Exception:
        """A fresh copy of the error that took the worker down."""
        error = self._failure
        if isinstance(error, WorkerGone | ProtocolViolation):  # incl. WorkerUnresponsive
            return type(error)(error.field, error.reason, error.value)
        return WorkerGone("worker", f"not ready ({self._state})", self._reason)

    def _refuse_if_down(self) -> None:
        if self._state != READY:
            raise self._gone_error()

    # -- sending -----------------------------------------------------------------------

    def _send(
        self,
        header: FrameHeader,
        payloads: list[memoryview] | None = None,
        *,
        before: FrameHeader | None = None,
    ) -> None:
        binary = self._binary
        parts = encode_frame(header, payloads or [], binary=binary)
        if before is not None:  # both frames in one write
            parts = [*encode_frame(before, [], binary=binary), *parts]
        self._write(parts)

    def _write(self, parts: list[bytes | memoryview]) -> None:
        with self._send_lock:
            if self._spin_frame is not None:  # told since the last write: goes first
                with self._spin_lock:
                    parts = [*self._spin_frame, *parts]
                    self._spin_frame = None
            try:
                write_frame(self._sock.sendmsg, parts)
            except OSError as exc:
                raise self._send_failed(exc) from None

    def _send_failed(self, error: OSError) -> WorkerGone:
        """What a failed write to the worker raises."""
        return WorkerGone("worker.channel", f"send failed ({error})", self.identity.pid)

    def send_bytes(self, data: bytes) -> None:
        """Write ``data`` to the worker as it is, between whole frames.

        For fault injection (the conformance kit sends malformed frames this way): the
        bytes are not checked, and the worker is expected to refuse them.
        """
        with self._send_lock:
            self._sock.sendall(data)

    @property
    def shm_prefixes(self) -> tuple[str, ...]:
        """The prefixes of the shared-memory segments of this channel, worker's first.

        The worker's own (its outputs) and this controller's producer's (inputs), each
        when there is one; what a leak check of this worker counts.
        """
        controller = self._producer.prefix if self._producer is not None else None
        return tuple(p for p in (self._worker_prefix, controller) if p)

    def in_flight(self, request_id: str) -> bool:
        """True until the reader has seen the request's terminal event.

        False once it has, even if the caller has not taken that event yet.
        """
        with self._lock:
            return request_id in self._calls

    def calls_in_flight(self) -> int:
        """How many requests were sent whose terminal event the reader has not seen."""
        with self._lock:
            return len(self._calls)

    def call_in_flight(self, request_id: str) -> Call | None:
        """The :class:`Call` of ``request_id`` until the reader has seen its terminal event.

        ``None`` once it has (as :meth:`in_flight` says False), or for an unknown id.
        """
        with self._lock:
            return self._calls.get(request_id)

    def input_buffer(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An array to fill in place and send as an input by reference (see host.inputs)."""
        return self._inputs.allocate(shape, dtype)

    def owns_input_buffer(self, value: Any) -> bool:
        """True when ``value`` is one of this channel's input buffers (sent by reference)."""
        return self._inputs.owns(value)

    def check_input_buffers(self, inputs: Mapping[str, Any]) -> None:
        """Raise :class:`InputBufferBusy` when one of ``inputs`` is a buffer still held."""
        self._inputs.check(inputs)

    def input_buffer_counts(self) -> dict[str, int]:
        """``buffers``: input buffers alive or held; ``sent``: sends by reference so far."""
        return {"buffers": self._inputs.held, "sent": self._inputs.sent}

    def submit(self, request: StageRequest, inputs: Mapping[str, Any] | None = None) -> Call:
        """Send one request with its input arrays; return the :class:`Call` to iterate.

        Inputs of at least the shared-memory threshold are copied into this controller's
        segments, retained until the worker acknowledges them with its terminal event.
        Raises :class:`TransportCapExceeded` when that retention would exceed the caps
        (``clears`` when calls in flight on this channel hold some of it),
        :class:`WorkerGone` when the worker is down.

        A usual request (one array, no params: :mod:`edge_core.host.request_kept`) whose
        frame was written before but for its request id is written from the kept bytes.
        """
        if self._state != READY:  # _refuse_if_down, without the call
            raise self._gone_error()
        request_id = request.request_id
        # Made first: the call names the claims of its input buffers (see host.inputs),
        # which the failure path below undoes whether or not they got to be known here
        call = Call(request_id, request.stage_id, request.epoch, self._cancel_call,
                    self._reader_wait)
        try:
            key: tuple[object, ...] | None = None  # a usual request's (see request_kept)
            kept: KeptRequest | None = None
            lease: Lease | None = None  # a lone input buffer's, claimed (a zero-copy request)
            kept_ref: KeptRefRequest | None = None  # its template, if kept (see request_kept)
            if inputs is not None and len(inputs) == 1 and request.params is EMPTY_OBJECT:
                ((name, value),) = inputs.items()
                if not self._inputs.by_id:  # no input buffer can be among them
                    if type(value) is np.ndarray and value.flags.c_contiguous:
                        rid = request_id.encode()
                        key = (len(rid), name, value.dtype, value.shape, request.operation,
                               request.stage_id, request.epoch)  # the key: see request_kept
                        kept = self._kept_requests.get(key)
                else:  # perhaps an input buffer: claimed here (its refusal claims nothing)
                    lease = self._inputs.claim_lone(name, value, call)
                    if lease is not None:
                        rid = request_id.encode()
                        key = (len(rid), name, lease.segment, lease.offset, value.dtype,
                               value.shape, request.operation, request.stage_id, request.epoch)
                        kept_ref = self._kept_ref_requests.get(key)
            if lease is not None:  # the lone input buffer, claimed: packed (or kept) by reference
                claimed = {id(value): (value, lease)}
                if kept_ref is None:
                    try:
                        packed = self._inputs.pack_claimed(inputs, claimed)
                    except BaseException as exc:
                        self._inputs.unsent(claimed)
                        if isinstance(exc, ShmCapExceeded):
                            raise TransportCapExceeded(exc.field, exc.reason, exc.value,
                                                       clears=bool(self._calls)) from None
                        raise
                else:
                    packed = _NOT_PACKED
            elif kept is None:
                try:  # input buffers (InputBuffers.allocate) travel by reference
                    packed, claimed = self._inputs.pack(inputs, call)
                except ShmCapExceeded as exc:
                    raise TransportCapExceeded(exc.field, exc.reason, exc.value,
                                               clears=bool(self._calls)) from None
            else:  # one inline array: nothing leased or claimed
                packed, claimed = _NOT_PACKED, _NOTHING_CLAIMED
            with self._lock:  # (see _calls: registered under the lock)
                registered = self._calls.setdefault(request_id, call) is call
            if not registered:
                self._inputs.take_back(packed.leases, claimed)
                raise ProtocolViolation("request.request_id", "already in flight", request_id)
            # (announced once a frame carried them: an interrupt before leaves them there)
            gone = self._producer.gone_names() if self._producer is not None else []
            try:
                if kept is not None and not gone:  # the kept bytes around this request's id
                    before, after, total = kept
                    head = before + rid + after
                    if self._spin_frame is None:  # (one told meanwhile goes with the next write)
                        with self._send_lock:
                            try:
                                written = self._sock.sendmsg([head, value])
                                if written != total:  # the rest, resumed as write_frame does
                                    write_frame(self._sock.sendmsg,
                                                [memoryview(head + value.tobytes())[written:]])
                            except OSError as exc:
                                raise self._send_failed(exc) from None
                    else:
                        self._write([head, value.data.cast("B")])
                    return call
                if kept_ref is not None and not gone:  # the kept bytes around its id, generation
                    before, middle, after = kept_ref
                    head = b"".join((before, rid, middle,
                                     _GENERATION.pack(lease.generation), after))  # type: ignore[union-attr]
                    total = len(head)  # (before the write: no call between it and the return)
                    if self._spin_frame is None:  # (one told meanwhile goes with the next write)
                        with self._send_lock:
                            try:
                                written = self._sock.sendmsg([head])
                                if written != total:  # the rest, resumed as write_frame does
                                    write_frame(self._sock.sendmsg, [memoryview(head)[written:]])
                            except OSError as exc:
                                raise self._send_failed(exc) from None
                    else:
                        self._write([head])
                    return call
                if kept is not None:  # segment names to announce first: the general path
                    packed, claimed = self._inputs.pack(inputs, call)
                elif kept_ref is not None:  # the same, its buffer claimed already
                    packed = self._inputs.pack_claimed(inputs, claimed)
                # Checked once already: StageRequest, the generation at start, the packer.
                specs, features = packed.specs, packed.features
                params: JSONObject = request.params  # type: ignore[assignment]  # (no cast call)
                ids = (_OP_TEXT[request.operation], request_id, request.stage_id,
                       request.epoch, self.generation)
                if gone or not self._binary:
                    inline, total = tensor_totals(specs, features) if specs else (0, 0)
                    header = prechecked_header(*ids, specs, params, features, inline, total)
                    # a request's meta is its params: the names go in an ack before it
                    notice = (FrameHeader(OP_ACK, "", "", 0, self.generation, meta={"gone": gone})
                              if gone else None)
                    self._send(header, packed.payloads, before=notice)
                    if gone:
                        self._producer.announced(gone)  # type: ignore[union-attr]
                else:
                    parts = encode_call_frame(*ids, specs, packed.payloads, features, meta=params)
                    self._write(parts)
                    if lease is not None:  # a lone input buffer's: kept by its reference
                        ref = specs[0].ref if len(specs) == 1 else None
                        if (key is not None and len(parts) == 1 and ref is not None
                                and ref.segment == lease.segment):  # (its only lease)
                            self._keep_ref_request(key, parts[0], lease.generation)
                    elif (key is not None and not features and not packed.leases and value.ndim
                            and value.size and len(specs) == 1 and specs[0].ref is None):
                        self._keep_request(key, parts[0], value.nbytes)
            except BaseException:
                with self._lock:
                    self._calls.pop(request_id, None)
                self._inputs.take_back(packed.leases, claimed)
                raise
        except BaseException:
            # Not sent (refused, failed, or cut short by a Ctrl-C, even as the claim of an
            # input buffer returned or as the request was registered): what the paths
            # above gave back is given back; a claim or a registration of this call's
            # left (unknown to them) is undone here
            with self._lock:
                if self._calls.get(request_id) is call:
                    del self._calls[request_id]
            self._inputs.unclaim(inputs, call)
            raise
        return call

    def _keep_request(self, key: tuple[object, ...], first: bytes | memoryview,
                      nbytes: int) -> None:
        """Keep the frame of a usual request just written (see :mod:`.request_kept`)."""
        template = request_template(first, key[0], nbytes)  # type: ignore[arg-type]
        if template is not None:
            if len(self._kept_requests) >= MAX_KEPT_REQUESTS:
                self._kept_requests.clear()
            self._kept_requests[key] = template

    def _keep_ref_request(self, key: tuple[object, ...], first: bytes | memoryview,
                          generation: int) -> None:
        """Keep the frame of a zero-copy request just written (see :mod:`.request_kept`)."""
        template = ref_request_template(first, key[0], generation)  # type: ignore[arg-type]
        if template is not None:
            if len(self._kept_ref_requests) >= MAX_KEPT_REQUESTS:
                self._kept_ref_requests.clear()
            self._kept_ref_requests[key] = template

    def on_end(self, call: Call, callback: Callable[[], None],
               loop: asyncio.AbstractEventLoop | None = None) -> None:
        """:meth:`Call.on_end` for a call of this channel that no thread waits for.

        With ``loop`` (called on that loop's thread), the loop reads the channel itself
        until the call's end is queued (:class:`~edge_core.host.loop_reading.LoopReading`):
        ``callback()`` is then called on the loop, or from the thread of a caller that
        led the reading meanwhile. Without (or while another loop reads this channel) the
        channel's background reader reads whenever no caller leads
        (:meth:`ChannelReader.listening`) and calls it.
        """
        watch = self._loop_reading
        if loop is not None and (watch is None or watch.loop is not loop):
            if watch is None or watch.idle:
                if watch is not None:  # lingering after its last call: it stops watching
                    watch.leave()
                watch = self._loop_reading = LoopReading(loop, self._reader, self._sock.fileno())
            else:
                watch = None  # another loop reads: the background reader serves this one
        if loop is not None and watch is not None:
            watch.opened()

            def ended() -> None:
                watch.closed()
                callback()
        else:
            reader = self._reader
            reader.listening(1)

            def ended() -> None:
                reader.listening(-1)
                callback()

        call.on_end(ended)

    def cancel(
        self, request_id: str | None = None, *, stage_id: str = "", fence_epoch: int | None = None
    ) -> None:
        """Cancel one request, and/or fence every request of ``stage_id`` older than an epoch.

        Affected calls end with CANCELLED at once, here; events the worker still sends for
        them are dropped (their shared memory is acknowledged). The worker is told too, so
        that it aborts the work in place and drops fenced requests it has not started.
        """
        calls = self._calls
        # Each victim is recorded before it is taken out, and counted as its end is
        # queued: a Ctrl-C anywhere here takes out and ends each one recorded (none is
        # left out of the channel without its end: its consumer would wait for good).
        # The first ``owing`` victims are in _owed: counted with no point between where a
        # Ctrl-C can act, so that the cleanup adds only the others, each once, and only
        # one it took out itself (never one the reader discarded since: heard, its
        # worker owes nothing; else outstanding() would count it for good)
        victims: list[Call] = []
        owing = 0
        ended = 0
        try:
            with self._lock:  # over a copy, each victim popped: see _calls
                for call in list(calls.values()):
                    if (call.request_id == request_id
                            or (fence_epoch is not None and call.stage_id == stage_id
                                and call.epoch < fence_epoch)):
                        victims.append(call)
                        # stored with no point between (a usual reply takes its call out
                        # without the lock: see _read_one): taken here, counted owed
                        # before the next point
                        for popped in map(calls.pop, (call.request_id,), (None,)):  # noqa: B007
                            break
                        if popped is call:
                            owing += 1
                            self._owed.add(call.request_id)  # its worker still answers it
                        else:
                            victims.pop()  # (its reply took it)
            for call in victims:
                call.end_cancelled(self._cancelled(call))
                ended += 1
        except BaseException:
            with self._lock:  # at most the last victim is not counted: still registered
                for call in victims[owing:]:  # (taken out here), else its reply took it
                    if calls.get(call.request_id) is call:
                        for popped in map(calls.pop, (call.request_id,), (None,)):  # noqa: B007
                            break
                        if popped is call:  # (else its reply took it meanwhile: no end owed)
                            self._owed.add(call.request_id)
            for call in victims[ended:]:  # (the one cut short may get a second end: unread)
                call.end_cancelled(self._cancelled(call))
            raise
        if victims:
            self._reader.nudge()  # a victim's own thread may be waiting on the socket
        if self._state != READY:
            return
        header = FrameHeader(
            OP_CANCEL,
            "",
            stage_id,
            fence_epoch or 0,
            self.generation,
            meta={"target": request_id, "fence_epoch": fence_epoch},
        )
        with contextlib.suppress(WorkerGone):
            self._send(header)

    def _cancelled(self, call: Call) -> Delivery:
        return Delivery(
            request_id=call.request_id,
            stage_id=call.stage_id,
            epoch=call.epoch,
            generation=self.generation,
            seq=call.last_seq + 1,
            kind=EventKind.CANCELLED,
            data=_EMPTY,
            error=None,
            created_ns=0,
            arrays={},
            refs=[],
            ack=None,
        )

    def _ack(self, refs: list[list[Any]], unlink: bool = False) -> None:
        if self._state != READY:
            return
        # (announced once the frame went: an interrupt before leaves them for the next)
        gone = self._producer.gone_names() if self._producer is not None else []
        try:
            if self._binary:  # written directly: one per call that read shared memory
                self._write([encode_ack_frame(self.generation, () if unlink else refs,
                                              refs if unlink else (), gone)])
            else:
                meta: dict[str, Any] = ({"segments": [], "unlink": refs} if unlink
                                        else {"segments": refs})
                if gone:  # segments this side unlinked: the worker unmaps them now
                    meta["gone"] = gone
                self._send(FrameHeader(OP_ACK, "", "", 0, self.generation, meta=meta))
        except WorkerGone:
            return  # (the names stay: nobody maps them any more)
        if gone:
            self._producer.announced(gone)  # type: ignore[union-attr]

    # -- receiving ---------------------------------------------------------------------

    def _read_one(self, flags: int = 0) -> bool | None:
        """Read and dispatch one frame (by whichever thread reads); None once ended.

        Returns whether bytes of another frame wait in the frame reader's buffer (the
        channel reader reads them before it polls the socket again). ``flags``: the
        receive's (``MSG_DONTWAIT``: the channel reader's ``read_now``, which reads
        before it polls; nothing in the socket then returns False, nothing read).

        A receive that holds the usual reply alone is delivered from its kept template
        (:mod:`edge_core.host.reply_kept`); one that holds a frame with shared-memory
        entries alone (a zero-copy reply) gets its header from the frame reader's kept
        ones (:func:`~edge_contracts.binary_header.kept_header`, after the reader's own
        prefix checks) and is dispatched without the reader; what else it holds is handed
        to the frame reader, whose frame is dispatched, and kept as a template when it is
        a usual one. A frame the reader read is dispatched from :attr:`_pending` (one that
        an interrupt left there first: see its comment in ``__init__``).
        """
        raw = None  # the header of a receive that held one whole binary frame
        kept = None  # its template (then kept already), if it has one
        # Bytes a receive took that are neither delivered nor handed to the frame reader
        # yet: a KeyboardInterrupt meanwhile reads on from them (_read_taken)
        taken = 0
        popped = None  # a call the usual path took out and has not delivered yet
        try:
            if self._more:  # a frame waits: read, undelivered, or its bytes buffered
                pending = self._pending
                more = None  # (whether another waits after it: asked once it is delivered)
                if not pending:
                    self._frames.read_into(pending)
            else:
                view = self._intake
                try:
                    for taken in self._receives[flags]:  # noqa: B007 (one receive, its count
                        break  # stored with no call between: see _receive_with)
                except BlockingIOError:  # (MSG_DONTWAIT) nothing waits: the reader polls
                    return False
                count = taken
                # all the stream held (less than the room given): no frame waits behind it
                if count < DEFAULT_BUFFER_BYTES:
                    # (of fewer than PREFIX_SIZE bytes, the sum below exceeds the count)
                    magic, header_len, payload_len = PREFIX.unpack_from(view)
                    header_end = PREFIX_SIZE + header_len
                    if (magic == BINARY_MAGIC and header_end + payload_len == count
                            and header_len >= _FIXED_SIZE):  # one whole binary frame
                        raw = view[PREFIX_SIZE:header_end].tobytes()  # (less than bytes() of it)
                        id_bytes, stage_bytes = ID_LENGTHS.unpack_from(raw, 4)
                        id_end = _FIXED_SIZE + id_bytes
                        stage_end = id_end + stage_bytes
                        # reply_key, written out: one call fewer per reply
                        kept = self._usual.get(raw[:_FIXED_SIZE] + raw[id_end:stage_end]
                                               + raw[stage_end + _STAMP_SIZE :])
                        if kept is not None:  # the usual reply (a DONE: the key holds the
                            # kind), but for its id, its stamp and its payload's bytes:
                            # the stamp gets the parser's checks, the id must name a call
                            # in flight (ids checked when their requests were made) of the
                            # template's epoch; else the general path reads the frame, and
                            # refuses or drops it
                            seq, created_ns = STAMP.unpack_from(view, PREFIX_SIZE + stage_end)
                            try:
                                request_id = raw[_FIXED_SIZE:id_end].decode()
                            except UnicodeDecodeError:  # refused by the reader
                                request_id = ""  # (names no call)
                            call = None
                            if kept[0] == payload_len and (seq | created_ns) <= INT64_MAX:
                                # Taken out without the lock (see _calls) by one pop
                                # (DONE is terminal): an interrupt after it finds the call
                                # gone from the channel, as its waiter's close does. A call
                                # of another epoch is left where it is (the general path
                                # reads the frame): taken out and put back, a call of its
                                # id registered in between would have displaced it.
                                calls = self._calls
                                call = calls.get(request_id)
                                if call is not None and call.epoch == kept[2]:
                                    # stored with no check point between (as the receive's
                                    # count): an interrupt until its delivery puts it back
                                    for popped in map(calls.pop, (request_id,), (None,)):  # noqa: B007
                                        break
                                    if popped is not call:  # another thread took it first,
                                        call = None  # and one of its id came: back it goes
                                        if popped is not None:
                                            with self._lock:
                                                calls.setdefault(request_id, popped)
                                            popped = None
                                else:
                                    call = None
                            if call is not None:  # its end is delivered here (an
                                # interrupt before deliver_done queues it puts the call
                                # back and reads the bytes on; after, nothing is left)
                                self.last_heard = time.monotonic()
                                _, stage_id, epoch, generation, layout, outputs = kept
                                arrays: dict[str, Any] = {}
                                if layout:  # as the unpacker makes them: read-only views
                                    # of a copy of the payload (bytes: read-only itself)
                                    own = view[header_end:count].tobytes()
                                    for name, dtype, number, at, shape in layout:
                                        array = _frombuffer(own, dtype, number, at)
                                        arrays[name] = (array if shape is None
                                                        else array.reshape(shape))
                                # its event, as prechecked_event builds it from the same
                                # values (each checked by the parser or the template's)
                                event = _EventDraft()
                                event.request_id = request_id
                                event.stage_id = stage_id
                                event.epoch = epoch
                                event.generation = generation
                                event.seq = seq
                                event.kind = _DONE
                                event.terminal = True
                                event.error = None
                                event.outputs = outputs
                                event.data = EMPTY_OBJECT
                                event.created_ns = created_ns
                                event.__class__ = StageEvent
                                call.deliver_done(event, arrays)  # (no Delivery made)
                                return False  # all the receive held was read
                header = None
                if (raw is not None and raw[3] & SHM_TENSORS_BIT and self._kept_prefix
                        and header_len <= self._header_cap and payload_len <= self._io_cap):
                    # the only, whole frame of its receive, with shared-memory entries (a
                    # zero-copy reply: never a usual one) and the prefix the frame reader
                    # takes as usual: a header equal to one its parser checked but for
                    # what kept_header checks itself (the entries' generations, the acks)
                    # is built as the reader builds it, without the reader's own read
                    header = kept_header(raw, self._limits, payload_len)
                if header is not None:  # the payload: exactly the header's inline bytes
                    frame = prechecked_frame(header, bytearray(view[header_end:count]))
                    self.last_heard = time.monotonic()
                    # Delivered with the receive still counted taken: an interrupt until
                    # its end reads it on (below), and that delivery, begun again, queues
                    # nothing twice (_head_call): this frame needs no place in _pending
                    try:
                        self._on_event(frame)
                    except Exception as exc:
                        self._undelivered(exc)
                        return None
                    self._head_call = None
                    return False  # all the receive held was read
                pending = self._pending  # (empty: _more was False)
                # the receive held one whole frame (raw): nothing waits after it
                more = False if raw is not None else None
                # the frame reader's now (no point between these three stores): an
                # interrupt in its read leaves the bytes to the next reader
                self._received.left = view[:count]
                self._more = True
                taken = 0
                self._frames.read_into(pending)
        except StreamClosed:
            self._channel_closed()
            return None
        except WireError as exc:
            self._lost(
                f"worker: protocol violation: {exc}",
                ProtocolViolation("worker.channel", f"refused frame ({exc.reason})", exc.field),
            )
            return None
        except ConnectionResetError:
            self._channel_closed()
            return None
        except OSError as exc:
            self._lost(
                f"worker: channel error: {exc}",
                WorkerGone("worker.channel", f"read failed ({exc})", self.identity.pid),
            )
            return None
        except BaseException:  # a KeyboardInterrupt: what the receive took is read on
            if taken:
                if popped is None:
                    self._read_taken(taken)
                elif popped.last_seq != seq:  # the reply's call, taken out undelivered
                    # (deliver_done sets last_seq and queues with no check point between),
                    # goes back (its own thread may be another: it must get it), and the
                    # receive, this reply alone, is read on
                    with self._lock:
                        self._calls.setdefault(popped.request_id, popped)
                    self._read_taken(taken)
            raise
        # The first frame read and not delivered: delivered here, then taken out of
        # _pending (an interrupt before leaves it to the next reader, which delivers it)
        frame = pending[0]
        self.last_heard = time.monotonic()
        try:
            if frame.header.op == OP_EVENT:  # the usual frame, without _dispatch's call
                self._on_event(frame)
            else:
                self._dispatch(frame)
        except Exception as exc:
            self._undelivered(exc)
            return None
        # Delivered: out of _pending, with no point between the removal and the stores
        if more is None:
            more = len(pending) > 1 or self._frames.has_buffered() or (
                self._received.left is not None)
        del pending[0]
        self._head_call = None
        self._more = more
        header = frame.header
        # the only frame of its receive, an event without shared memory: perhaps a usual
        # one, whose template is kept
        if (raw is not None and kept is None and header.op == OP_EVENT
                and FEATURE_SHM_TENSORS not in header.required_features):
            found = reply_template(raw, header, self.generation)
            if found is not None:
                if len(self._usual) >= MAX_KEPT:
                    self._usual.clear()
                self._usual[found[0]] = found[1]
        return more

    def _undelivered(self, exc: Exception) -> None:
        """Fail the channel for a frame that could not be delivered: the worker's fault.

        The frame belonged to some call, perhaps not the reading thread's: the channel
        fails for every call rather than raise into an unrelated caller.
        """
        if isinstance(exc, ContractError):
            self._lost(
                f"worker: protocol violation: {exc}",
                ProtocolViolation(exc.field, exc.reason, exc.value),
            )
        elif isinstance(exc, KeyError | TypeError | ValueError):
            self._lost(
                f"worker: protocol violation: {exc!r}",
                ProtocolViolation("frame.meta", "malformed event", repr(exc)),
            )
        else:  # e.g. its shared memory could not be mapped (EMFILE)
            self._lost(
                f"worker: frame could not be delivered: {exc!r}",
                WorkerGone("worker.channel", f"frame not delivered ({exc!r})", self.identity.pid),
            )

    def _receive_with(self, recv_into: Callable[..., int]) -> None:
        """Receive into the intake with ``recv_into`` (the socket's; a test's watcher).

        One receive per step of an iterator (for flags 0, and ``MSG_DONTWAIT``):
        :meth:`_read_one` takes its count from a ``for`` over one, which stores it with
        no call between the receive and the store (a Ctrl-C acts where a call returns).
        """
        self._recv_into = recv_into
        intake = itertools.repeat(self._intake)
        self._receives = {flags: map(recv_into, intake, itertools.repeat(0),
                                     itertools.repeat(flags))
                          for flags in {0, _DONTWAIT or 0}}

    def _read_taken(self, count: int) -> None:
        """Read and dispatch the frames in the ``count`` bytes a receive took (see below).

        A ``KeyboardInterrupt`` acted on after a receive, before its bytes were delivered
        or handed to the frame reader, would drop them: a reply lost, its call never
        ended (its stage's slot held), the channel torn. They are handed to the frame
        reader and every frame they hold is read and dispatched (the rest of a frame they
        cut short, already on its way, is read too) before the interrupt goes on.
        """
        self._received.left = self._intake[:count]
        self._more = True
        while self._read_one():  # until no byte is left in the reader's buffer
            pass

    def _dispatch(self, frame: Frame) -> None:
        header = frame.header
        if header.op == OP_EVENT:  # the usual frame: its ``gone`` is read by _on_event
            self._on_event(frame)
            return
        meta = header.meta
        gone = meta.get("gone")
        if gone and self._consumer is not None:
            self._consumer.forget([str(name) for name in gone])
        if header.op == OP_HEARTBEAT:  # heard: ``last_heard`` is all it is for
            return
        elif header.op == OP_REPLY:
            with self._lock:
                waiter = self._replies.get(header.request_id)
            again = self._head_call is not None  # (see _head_call)
            if again:
                waiter = self._head_call
            if waiter is not None:
                self._head_call = waiter
                error = meta.get("error")
                waiter.deliver(
                    Delivery(
                        request_id=header.request_id,
                        stage_id="",
                        epoch=0,
                        generation=header.generation,
                        seq=0,
                        kind=EventKind.DONE if meta.get("ok") else EventKind.ERROR,
                        data=meta.get("result") or _EMPTY,
                        error=None if error is None else _error_of(error),
                        created_ns=0,
                        arrays={},
                        refs=[],
                        ack=None,
                    ),
                    again,
                )
        else:
            raise ProtocolViolation("frame.op", "not expected from a worker", header.op)

    def _on_event(self, frame: Frame) -> None:
        header = frame.header
        # A FrameHeader's meta is always frozen (a JSONObject); several keys are read
        # here, so through a view whose lookups run in C.
        frozen: JSONObject = header.meta  # type: ignore[assignment]  # (no cast call)
        meta: Mapping[str, Any] = frozen.view()
        gone = meta.get("gone")
        if gone and self._consumer is not None:
            self._consumer.forget([str(name) for name in gone])
        acks = meta.get("acks")
        if acks and self._producer is not None:
            for segment, generation in acks:
                if not self._inputs.acknowledged(str(segment), int(generation)):
                    self._producer.release(str(segment), int(generation))
        kind = _EVENT_KINDS.get(meta["kind"])  # a dict lookup, not the enum's __call__
        if kind is None:  # caught by _read_one: a protocol violation, as before
            raise ValueError(f"{meta['kind']!r} is not a valid EventKind")
        terminal = kind in _TERMINAL_KINDS
        # The call is kept as _head_call until the frame is delivered (a terminal event's
        # taken out for its end): a delivery begun again after an interrupt finds it
        # there (not gone from _calls: stale) and queues nothing twice
        call: Call | None
        if self._head_call is not None:
            call = self._head_call
            again = True
            if call.last_seq == int(meta["seq"]):  # queued by the try cut short: the rest
                call.delivered_again(terminal)  # (its shared memory not read again)
                return
            with self._lock:  # a token whose call was cancelled meanwhile: dropped as stale
                stale = not terminal and self._calls.get(header.request_id) is not call
        else:
            again = False
            with self._lock:
                call = self._calls.get(header.request_id)
                stale = (call is None or header.generation != self.generation
                         or header.epoch != call.epoch)
                if not stale:
                    self._head_call = call  # (no point between it and the pop)
                    if terminal:
                        self._calls.pop(header.request_id, None)  # (see _calls)
        if stale or call is None:  # cancelled, fenced or unknown: drop, free what it holds
            refs = refs_of(frame)
            if refs:
                self._ack(refs)
            if terminal:  # heard, once its memory is given back (outstanding() counts it)
                self._owed.discard(header.request_id)
            return
        # A shared-memory entry needs the frame's ``shm-tensors`` feature (the header's
        # checks refuse it otherwise): without it there is no reference to look for.
        refs = refs_of(frame) if FEATURE_SHM_TENSORS in header.required_features else []
        try:  # what the frame's meta says, read here: a failure is the worker's (_read_one)
            arrays = self._unpacker.unpack(frame)
            error = meta.get("error")
            delivery = Delivery(
                request_id=header.request_id,
                stage_id=header.stage_id,
                epoch=header.epoch,
                generation=header.generation,
                seq=int(meta["seq"]),
                kind=kind,
                data=meta.get("data") or EMPTY_OBJECT,  # frozen already: not frozen again
                error=None if error is None else _error_of(error),
                created_ns=int(meta.get("created_ns", 0)),
                arrays=arrays,
                refs=refs,
                ack=self._ack if refs else None,
            )
        except Exception:  # its segments acknowledged (once: no delivery holds them)
            if refs:
                self._ack(refs)
            raise
        call.deliver(delivery, again)

    # -- retirement --------------------------------------------------------------------

    def retire(
        self, deadline_s: float = DEFAULT_RETIRE_DEADLINE_S, *, graceful_s: float | None = None
    ) -> RetireOutcome:
        """Stop the worker and its whole tree within ``deadline_s``; idempotent.

        Graceful shutdown first, then SIGTERM, then SIGKILL, then verification of every
        captured identity. The graceful wait is a third of the deadline and at most 1 s
        (taken from the deadline) unless ``graceful_s`` is given: a window the worker's
        handler declared for its own shutdown, waited in full before the deadline starts
        (the whole retirement is then bounded by ``graceful_s + deadline_s``, and the
        signal phases keep all of the deadline). Calls in flight fail with
        :class:`WorkerGone`. Every segment either side produced is unlinked; the staging
        directory is removed.
        """
        with self._retire_lock:
            if self._outcome is not None and self._outcome.verified:
                return self._outcome
            if self._state == READY:
                self._tree.capture()
                with contextlib.suppress(WorkerGone):
                    self._send(FrameHeader(OP_SHUTDOWN, "", "", 0, self.generation))
            self._lost("worker: retired", WorkerGone("worker", "retired", self.identity.pid))
            with self._lock:
                self._state = RETIRED
            if graceful_s is None:
                outcome = self._tree.retire(deadline_s, graceful_s=min(1.0, deadline_s / 3))
            else:
                outcome = self._tree.retire(deadline_s, window_s=max(graceful_s, 0.0))
            self._close_resources()
            self._outcome = outcome
            return outcome

    def _close_resources(self) -> None:
        monitor().forget(self)
        self._watchdog.stop()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._reader.close():  # no thread is inside a read any more
            self._sock.close()
        # else a reading thread is stuck: closing now could let it read a reused
        # descriptor number; the socket is closed when the object is collected.
        if self._producer is not None:
            self._producer.close()
        if self._consumer is not None:
            self._consumer.close()
        if self._worker_prefix is not None:
            sweep(self._worker_prefix)
        if self._staged is not None:
            shutil.rmtree(self._staged, ignore_errors=True)
        for stream in (self._popen.stdout, self._popen.stderr, self._popen.stdin):
            if stream is not None:
                stream.close()

    def close(self) -> RetireOutcome:
        """Same as :meth:`retire` with the default deadline."""
        return self.retire()

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.retire()
