"""The one serve loop every backend's worker runs, in whatever interpreter the route names.

Standard library only; numpy is imported the first time a frame carries tensors or a
handler emits outputs. Started by the controller as ``python -c "...; main()" FD`` (the
same as ``python -m edge_contracts.worker FD``, minus runpy); FD is the worker's end of
a private socketpair, whose first frame is the controller's ``boot`` frame carrying the
boot configuration (:func:`~edge_contracts.worker_protocol.boot_frame`).

Handler protocol
----------------
The route's entry ``package.module:factory`` is imported and ``factory()`` returns the
handler (see :class:`Handler`; subclass :class:`BaseHandler` for defaults). Then the loop
sends its hello (token, protocol version, features, PID, creation time, and the
handler's :meth:`Handler.versions`) and serves frames in arrival order:

* ``load(config)`` / ``warmup(config)`` run on the loop thread and return a JSON object
  (e.g. a warm-up placement report) sent back as the reply.
* ``submit(call)`` runs on the loop thread for each ``run``/``generate`` request. A
  stateless graph handler computes and returns its outputs (``{name: array}``); the loop
  then sends one terminal DONE event carrying them. A streaming handler hands the call
  to its own engine and returns ``None`` at once; it later emits events from any thread
  with :meth:`Call.emit` (thread-safe) and must end with :meth:`Call.done` or
  :meth:`Call.fail`. An exception from ``submit`` becomes a terminal ERROR event.
* ``query(question)`` (optional: :meth:`BaseHandler.query`) runs on the loop thread as
  soon as a ``query`` frame is read — like a ``ping``, ahead of requests still waiting
  in the worker and while streaming ones go on — and returns a JSON object sent back as
  the reply; it takes no slot.
* ``cancel(request_id)`` is called on the loop thread after the loop has already sent the
  request's terminal CANCELLED event; it should abort the work in place (the worker
  stays). Events the handler emits for a cancelled request are dropped.
* ``close()`` runs once, when the controller asks for shutdown or the channel closes.
  A handler that sets ``exit_after_close`` has the process end right after it (once the
  channel and the segments are closed), without the interpreter's teardown.

When the channel ends without a shutdown (the controller died, or gave up on the
channel), the worker also unlinks the controller's segments of this channel (the peer
prefix it was given): a dead controller cannot, and they would outlive both otherwise.

Before each request, the loop reads every frame already waiting, so that a ``cancel``
(one request, or an epoch fence for a stage) is applied before fenced work starts: a
queued request of a fenced epoch is answered CANCELLED without reaching the handler.
When the request was read just now by a receive that took everything the channel held
(:attr:`~edge_contracts.frame_reader.FrameReader.drained`) and nothing ran since, the
frames already waiting are those in the read buffer, and no poll is made; a frame sent
after that receive is one that arrived while the request ran. Without a spin budget
(none fixed at boot, none permitted by the controller's ``spin`` frames: see
:mod:`edge_contracts.worker_spin`) the loop waits for the next frame in a blocking poll,
then receives: a small request costs the worker a poll, one receive and one send. It
does not wait in the receive itself, though that would save the poll: on Linux a thread
asleep in a unix stream socket's receive is woken, to find nothing and sleep again, each
time the peer reads what this socket sent (the freed send space wakes every sleeper of
the socket), so each reply the controller read cost the worker a second wake-up: a
context switch, and an interrupt to another CPU; a poll for readable data sleeps through
those. A ``ping`` is answered with ``in_flight``, ``pid`` and
``spin`` (:meth:`~edge_contracts.worker_spin.NextFrameSpin.state`).
Inputs are read-only arrays, valid until the request's terminal event (shared-memory
inputs are acknowledged to the controller with it).

The usual request takes a shorter path (:mod:`edge_contracts.worker_kept`): a ``run`` or
``generate`` frame received alone by a receive that took everything the channel held,
equal but for its request id to one the frame reader checked whole (no params, inline
inputs of plain numeric types), is served at once: its id gets the parser's checks, its
inputs are read-only views of a copy of its payload, and a request of a fenced epoch
still goes the general way (CANCELLED). Its DONE, with outputs of the names, dtypes and
shapes of an earlier DONE's that went inline, is written from a kept template: the bytes
the general path writes. A zero-copy request (shared-memory inputs) received so, equal
but for its request id and its references' generations to one the reader checked whole,
is served the same way, its inputs mapped through the consumer's checks (segment, range,
generation; a refusal sends the frame through the general path, which refuses it as
before); its DONE, with outputs in the call's own output buffers, is written from a kept
template with each output's generation and the inputs' acknowledgement put in. The
controller's usual acknowledgement (its fixed part that of one the reader read whole, its
meta the plain ``{"segments":[...]}`` text) is applied from the receive, also when one
whole frame follows it there (then read as if received alone). Anything else is read and
answered by the general path.

With the ``heartbeat`` feature a thread of its own beats while the worker has work
(:mod:`edge_contracts.worker_heartbeat`). ERROR events carry the handler's traceback.
An event whose header would be longer than the channel's ``max_header_bytes`` (large
``data`` or error text), or whose output tensors together are more than its
``max_io_bytes``, is never written, the controller would lose the channel over it: its
request ends with an ``EventTooLarge`` ERROR instead (:meth:`Call.emit`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import select
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from edge_contracts.binary_header import (
    EVENT_BLOCK,
    KIND_CODES,
    ack_pairs_text,
    encode_ack_header,
    pairs_meta,
)
from edge_contracts.call_frames import encode_call_frame
from edge_contracts.errors import (
    ContractError,
    StreamClosed,
    WireError,
)
from edge_contracts.events import EventKind
from edge_contracts.frame_reader import DEFAULT_BUFFER_BYTES, FrameReader, ReceivedFirst
from edge_contracts.headers import FrameHeader, Limits
from edge_contracts.jsonvalues import thaw_json
from edge_contracts.protocol import (
    CONTROL_OPS,
    DATA_OPS,
    FEATURE_BINARY_HEADER,
    FEATURE_EVENT_FIELDS,
    FEATURE_HEARTBEAT,
    FEATURE_SHM_TENSORS,
    KNOWN_FEATURES,
    OP_ACK,
    OP_CANCEL,
    OP_EVENT,
    OP_HEARTBEAT,
    OP_HELLO,
    OP_LOAD,
    OP_PING,
    OP_QUERY,
    OP_REPLY,
    OP_SHUTDOWN,
    OP_SPIN,
)
from edge_contracts.sealed import SEALS_AVAILABLE, FdChannel
from edge_contracts.shm import SHM_AVAILABLE, SegmentConsumer, SegmentProducer, sweep
from edge_contracts.validation import MAX_ID_LENGTH, require_int
from edge_contracts.waiting import ReadableWait
from edge_contracts.wire import (
    BINARY_MAGIC,
    PREFIX,
    PREFIX_SIZE,
    Frame,
    encode_frame,
    refs_of,
    write_frame,
)
from edge_contracts.worker_call import Call
from edge_contracts.worker_errors import error_info, input_fault, print_exception
from edge_contracts.worker_events import KIND_TEXT, event_meta, too_large
from edge_contracts.worker_handler import BaseHandler, Handler
from edge_contracts.worker_heartbeat import Heartbeat
from edge_contracts.worker_kept import (
    MAX_KEPT,
    REFS_PER_KEY,
    REQUEST_ID_AT,
    InPlaceEvent,
    KeptEvent,
    KeptRefsRequest,
    KeptRequest,
    event_template,
    in_place_event_template,
    refs_request_match,
    refs_request_template,
    request_template,
)
from edge_contracts.worker_protocol import (
    BootConfig,
    hello_meta,
    parse_ack,
    parse_spin,
    read_boot,
)
from edge_contracts.worker_spin import NextFrameSpin

if TYPE_CHECKING:
    import socket

    from edge_contracts.worker_transport import Packed, TensorPacker, TensorUnpacker

__all__ = ["BaseHandler", "Call", "Handler", "main", "serve"]

_SHM = frozenset({FEATURE_SHM_TENSORS})
_NO_FEATURES: frozenset[str] = frozenset()
_EVENT_FIELDS = frozenset({FEATURE_EVENT_FIELDS})
_WITH_EVENT_FIELDS: dict[frozenset[str], frozenset[str]] = {}  # a frame's features, plus it
_DONE = KIND_CODES[EventKind.DONE.value]
_UNSEEN: Any = object()
_ID_END = REQUEST_ID_AT + 2  # the request id's byte count: a u16 at offset 4 of the header
# an in-place DONE's prefix and fixed part: magic, header bytes, payload bytes (none), the
# fixed part before its meta length, the meta length, the fixed part after it
_IN_PLACE_HEAD = struct.Struct("<4sIQ14sI16s")
_GENERATION = struct.Struct("<Q")
_ACK_CODE = encode_ack_header(0, ())[2]  # an ack's op code (the byte after the version)
_OP_AT = PREFIX_SIZE + 2  # where a frame's op code lies after its prefix
_META_LEN = struct.Struct("<I")  # the fixed part's meta byte count, at offset 14
_META_LEN_AT = 14
_META_LEN_END = _META_LEN_AT + _META_LEN.size


class _Server:
    """The loop state of one worker: channel, shared memory, requests in flight."""

    def __init__(self, sock: socket.socket, boot: BootConfig, handler: Handler) -> None:
        self.sock = sock
        self.boot = boot
        self.handler = handler
        # checked once: every event header carries it unchecked (prechecked_header)
        require_int(boot.generation, "boot.generation")
        # Only what both ends support: a frame requiring anything else is refused.
        supported = (KNOWN_FEATURES if SHM_AVAILABLE else KNOWN_FEATURES - _SHM) & frozenset(
            boot.features
        )
        self.use_shm = SHM_AVAILABLE and FEATURE_SHM_TENSORS in boot.features
        self.sealed = self.use_shm and uses_sealed(boot)
        # events and acks go with the binary header when the controller reads it
        self.binary = FEATURE_BINARY_HEADER in boot.features
        # seq, kind and created_ns in the binary header's event block (the controller
        # reads it: boot.features is what it supports, and the hello offers the same)
        self.event_fields = self.binary and FEATURE_EVENT_FIELDS in boot.features
        self.limits = Limits(
            max_header_bytes=boot.max_header_bytes,
            max_io_bytes=boot.max_io_bytes,
            supported_features=supported,
        )
        self.supported = supported
        # the longest prefix and header an event may have: a longer one is refused
        # (EventTooLarge) before anything is written, never sent to the controller
        self._longest_head = PREFIX_SIZE + boot.max_header_bytes
        self._send_lock = threading.Lock()
        self._calls_lock = threading.Lock()
        self._calls: dict[str, Call] = {}
        self._fences: dict[str, int] = {}
        self._pending: deque[Frame] = deque()
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        # The usual request is recognised in the loop's own receive buffer (_receive);
        # anything else is handed to the frame reader, which takes it first
        self._recv_into = sock.recv_into
        self._intake = memoryview(bytearray(DEFAULT_BUFFER_BYTES))
        # received, not yet taken by the reader: given to it first
        self._received = ReceivedFirst(self._recv_into)
        self._frames = FrameReader(self._received, self.limits)
        self._usual: dict[bytes, KeptRequest] = {}  # see worker_kept
        self._done_frames: dict[tuple[Any, ...], KeptEvent | None] = {}
        self._usual_refs: dict[bytes, tuple[KeptRefsRequest, ...]] = {}  # zero-copy ones
        self._in_place_frames: dict[tuple[Any, ...], InPlaceEvent | None] = {}
        # an acknowledgement's fixed part but its meta length, once the reader read one
        self._usual_ack: bytes | None = None
        self._ndarray: type | None = None  # numpy's, once tensors are handled
        self._frombuffer: Any = None
        self._sendmsg = sock.sendmsg
        self._next_frame = ReadableWait(sock.fileno(), 0)
        # the budget of the wait for the next frame: fixed at boot (the override), or
        # measured within the cap the controller's spin frames permit
        self._spin = NextFrameSpin(self._next_frame, boot.spin_us)
        self._blocking = os.get_blocking(sock.fileno())
        # no spin permitted and a blocking socket: a plain blocking poll waits, not the
        # measured next-frame wait (and not the receive itself: see the module)
        self._wait_plainly = not self._spin.active and self._blocking
        self._plain = 0  # receives left before the next-frame wait measures again
        self._plain_total = 0
        self._producer: SegmentProducer | None = None
        self._consumer: SegmentConsumer | None = None
        self._packer: TensorPacker | None = None
        self._unpacker: TensorUnpacker | None = None
        self._broken = False
        self._stop = False
        self._orphaned = False  # the channel ended without a shutdown
        self._executing = False
        self._heartbeat = (Heartbeat(self._beat, self._busy)
                           if FEATURE_HEARTBEAT in boot.features else None)

    # -- tensors (numpy imported on first use) ------------------------------------------

    def tensors(self) -> tuple[TensorPacker, TensorUnpacker]:
        """The loop's tensor packer and unpacker (numpy imported on first use)."""
        if self._packer is None or self._unpacker is None:
            from edge_contracts.worker_transport import TensorPacker, TensorUnpacker

            if self.use_shm:
                channel = FdChannel(self.boot.shm_fds) if self.sealed else None
                self._producer = SegmentProducer(
                    self.boot.shm_prefix,
                    max_bytes=self.boot.shm_max_bytes,
                    max_buffers=self.boot.shm_max_buffers,
                    channel=channel,
                )
                self._consumer = SegmentConsumer(self.boot.peer_prefix, channel=channel)
            # outputs over the channel's max_io_bytes are refused before they are leased
            # (the controller's reader would refuse the frame and lose the channel)
            self._packer = TensorPacker(self._producer, self.boot.shm_threshold,
                                        self.boot.max_io_bytes)
            self._unpacker = TensorUnpacker(self._consumer)
            import numpy

            self._ndarray = numpy.ndarray
            self._frombuffer = numpy.frombuffer
        return self._packer, self._unpacker

    # -- sending -----------------------------------------------------------------------

    def send(self, header: FrameHeader, payloads: list[memoryview] | None = None) -> bool:
        """Write one frame; False if the channel is gone."""
        return self._write(encode_frame(header, payloads or [], binary=self.binary))

    def _write(self, parts: list[bytes | memoryview]) -> bool:
        """Write one encoded frame; False if the channel is gone."""
        with self._send_lock:
            if self._broken:
                return False
            try:
                write_frame(self.sock.sendmsg, parts)
            except (OSError, WireError):  # a frame cut short: the channel is done
                self._broken = True
                return False
        return True

    def _beat(self) -> bool:
        return self.send(FrameHeader(OP_HEARTBEAT, "", "", 0, self.boot.generation))

    def _busy(self) -> bool:
        return self._executing or bool(self._calls)

    def _gone(self) -> list[str]:
        return self._producer.take_gone() if self._producer is not None else []

    def _restore_gone(self, names: list[str]) -> None:
        if names and self._producer is not None:
            self._producer.restore_gone(names)

    def reply(self, header: FrameHeader, result: Mapping[str, Any] | None, error: Any) -> None:
        """Answer a control frame with a result or an error."""
        meta: dict[str, Any] = {"ok": error is None}
        if error is None:
            meta["result"] = dict(result or {})
        else:
            meta["error"] = error_info(error)
        try:
            reply = FrameHeader(
                OP_REPLY,
                header.request_id,
                header.stage_id,
                header.epoch,
                self.boot.generation,
                meta=meta,
            )
        except WireError as exc:  # the handler returned something that is not JSON
            reply = FrameHeader(
                OP_REPLY,
                header.request_id,
                header.stage_id,
                header.epoch,
                self.boot.generation,
                meta={"ok": False, "error": error_info(exc)},
            )
        self.send(reply)

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
        """Encode and send one event of ``call`` (called under the call's lock).

        ``packed``: the event's outputs, packed by the call; ``acks``: the segments of
        the request's inputs, on its terminal event only. False when it was not sent (its
        packed outputs are taken back).

        Raises:
            ContractError: the event cannot be sent, nothing was written (its packed
                outputs are the caller's to take back): ``EventTooLarge`` when its header
                would be longer than ``max_header_bytes`` (the controller would refuse
                the frame and lose the channel), ``HeaderMalformed`` when its ``data``
                is not a JSON object.

        """
        if self.binary:
            return self._send_binary_event(call, kind, seq, packed, data, error, acks)
        meta: dict[str, Any] = {
            "seq": seq,
            "kind": KIND_TEXT[kind],  # not the enum's (Python-level) value property
            "data": dict(data or {}),
            "error": None if error is None else error_info(error),
            "created_ns": time.monotonic_ns(),
        }
        if acks is not None:
            meta["acks"] = acks
        gone = self._gone()
        if gone:
            meta["gone"] = gone
        try:
            header = FrameHeader(
                OP_EVENT,
                call.request_id,
                call.stage_id,
                call.epoch,
                self.boot.generation,
                tensors=packed.specs if packed else (),
                meta=meta,
                required_features=packed.features if packed else frozenset(),
            )
            parts = encode_frame(header, packed.payloads if packed else [])
            if len(parts[0]) > self._longest_head:
                raise too_large(kind, data, error, len(parts[0]) - PREFIX_SIZE,
                                self.limits.max_header_bytes)
        except ContractError:  # nothing written: the unlinked names go with a later frame
            self._restore_gone(gone)
            raise
        sent = self._write(parts)
        if not sent and packed is not None:
            self.tensors()[0].take_back(packed.leases)
        return sent

    def _send_binary_event(
        self,
        call: Call,
        kind: EventKind,
        seq: int,
        packed: Packed | None,
        data: Mapping[str, Any] | None,
        error: BaseException | None,
        acks: list[list[Any]] | None,
    ) -> bool:
        """:meth:`send_event` on a binary channel (meta written as text, see worker_events)."""
        producer = self._producer
        gone = producer.take_gone() if producer is not None else []
        specs = packed.specs if packed else ()
        features = packed.features if packed else _NO_FEATURES
        if self.event_fields:
            found = _WITH_EVENT_FIELDS.get(features)
            if found is None:  # a few sets at most (shm-tensors, bfloat16)
                found = _WITH_EVENT_FIELDS[features] = features | _EVENT_FIELDS
            features = found
        if self.event_fields and not data and error is None and not acks and not gone:
            # the usual event: its fields all in the block, no meta text (what event_meta
            # writes for it, without the call); a header far below any limit, unmeasured
            frame = encode_call_frame(
                OP_EVENT, call.request_id, call.stage_id, call.epoch, self.boot.generation,
                specs, packed.payloads if packed else [], features, event_meta=b"",
                event_block=EVENT_BLOCK.pack(seq, time.monotonic_ns(), KIND_CODES[kind]),
            )
        else:
            try:
                meta, block = event_meta(kind, seq, data, error, acks, gone,
                                         block=self.event_fields)
                frame = encode_call_frame(
                    OP_EVENT, call.request_id, call.stage_id, call.epoch,
                    self.boot.generation, specs, packed.payloads if packed else [], features,
                    event_meta=meta, event_block=block,
                    # acks and names change call after call: the meta is written apart
                    meta_apart=bool(acks) or bool(gone),
                )
                if len(frame[0]) > self._longest_head:
                    raise too_large(kind, data, error, len(frame[0]) - PREFIX_SIZE,
                                    self.limits.max_header_bytes)
            except ContractError:  # nothing written: the unlinked names go with a later frame
                if gone and producer is not None:
                    producer.restore_gone(gone)
                raise
        with self._send_lock:
            sent = not self._broken
            if sent:
                try:
                    write_frame(self.sock.sendmsg, frame)
                except (OSError, WireError):  # a frame cut short: the channel is done
                    self._broken, sent = True, False
        if not sent and packed is not None:
            self.tensors()[0].take_back(packed.leases)
        return sent

    def send_usual(self, call: Call, seq: int, outputs: Mapping[str, Any]) -> bool | None:
        """Write ``call``'s DONE event ``seq`` from a kept template, when it is the usual one.

        The usual DONE (see :mod:`edge_contracts.worker_kept`): ``outputs`` a dict of
        C-contiguous arrays whose names, dtypes and shapes, with the call's stage, epoch
        and request id length, are those of a DONE whose template was made (through the
        packer, the first time), and no unlinked segment names to announce. Its header
        is written from the template, the arrays themselves after it, and the call is
        dropped (as :meth:`forget` drops it). Called under the call's lock, the call
        already marked ended (it is open again where this returns None). True when
        written, False when the channel is gone; None for any other DONE, with nothing
        written or taken: the call packs and sends it itself.
        """
        ndarray: Any = self._ndarray
        if ndarray is None or type(outputs) is not dict:
            return None
        request_id = call.request_id.encode()
        value: Any
        parts: list[Any]
        key: tuple[Any, ...]
        if len(outputs) == 1:  # the lone output: its key made as a tuple at once
            ((name, value),) = outputs.items()
            if type(value) is not ndarray:
                return None
            key = (call.stage_id, call.epoch, len(request_id), name, value.dtype,
                   value.shape, value.flags.c_contiguous)
            parts = [b"", value]  # C-contiguous (the template's): written as it is
        else:
            found: list[Any] = [call.stage_id, call.epoch, len(request_id)]
            parts = [b""]
            for name, value in outputs.items():  # a loop, no comprehension: no frame
                if type(value) is not ndarray:
                    return None
                found += (name, value.dtype, value.shape, value.flags.c_contiguous)
                parts.append(value)
            key = tuple(found)  # the lone output's, for one
        kept = self._done_frames.get(key, _UNSEEN)
        if kept is _UNSEEN:
            kept = self._keep_done(call, request_id, outputs, key)
        if kept is None:
            return None
        producer = self._producer
        if producer is not None:
            gone = producer.take_gone()
            if gone:  # announced by the general path's event
                producer.restore_gone(gone)
                return None
        head, stage, tail, total = kept
        parts[0] = b"".join((head, request_id, stage,
                             EVENT_BLOCK.pack(seq, time.monotonic_ns(), _DONE), tail))
        with self._send_lock:
            sent = not self._broken
            if sent:
                try:
                    written = self._sendmsg(parts)
                    if written != total:
                        _write_rest(self._sendmsg, parts, written, total)
                except (OSError, WireError):  # a frame cut short: the channel is done
                    self._broken, sent = True, False
        if self._calls:  # (a call of the usual path the handler answered is not in it)
            with self._calls_lock:
                if self._calls.get(call.request_id) is call:
                    del self._calls[call.request_id]
        return sent

    def _keep_done(self, call: Call, request_id: bytes, outputs: Mapping[str, Any],
                   key: tuple[Any, ...]) -> KeptEvent | None:
        """Make (and keep under ``key``) the template of a DONE with these outputs, or None.

        None (kept too: the key says all it depends on) when it is not a usual DONE: a
        channel without the binary header's ``event-fields``, or outputs
        :func:`~edge_contracts.worker_kept.event_template` does not keep.
        """
        if len(self._done_frames) >= MAX_KEPT:
            self._done_frames.clear()
        kept = None
        if self.event_fields:
            kept = event_template(outputs, self.tensors()[0], request_id, call.stage_id,
                                  call.epoch, self.boot.generation, _EVENT_FIELDS,
                                  self.limits.max_header_bytes)
        self._done_frames[key] = kept
        return kept

    def send_usual_in_place(
        self,
        call: Call,
        seq: int,
        outputs: Mapping[str, Any],
        allocated: dict[int, tuple[Any, Any]],
        acks: list[list[Any]],
    ) -> bool | None:
        """Write ``call``'s DONE event ``seq`` from a kept template, its outputs in place.

        The usual zero-copy DONE (see :mod:`edge_contracts.worker_kept`): ``outputs`` a
        dict of exactly the call's output buffers (``allocated``, each the very array it
        leased) whose names, dtypes, shapes, segments and offsets, with the call's stage,
        epoch and request id length, are those of a DONE whose template was made, no
        unlinked segment names to announce, and a header within ``max_header_bytes``.
        Its header is written from the template with the id, the event block, each
        output's generation and ``acks`` (``{"acks": [...]}``, none without) put in; the
        outputs' leases leave ``allocated`` (sent, as the packer takes them), and the call
        is dropped. Called under the call's lock, as :meth:`send_usual`; None for any
        other DONE, with nothing written or taken.
        """
        if type(outputs) is not dict or len(outputs) != len(allocated):
            return None
        request_id = call.request_id.encode()
        found: list[Any] = [call.stage_id, call.epoch, len(request_id)]
        leases = []
        for name, value in outputs.items():  # a loop, no comprehension: no frame
            owned = allocated.get(id(value))
            # (one buffer under two names: the general path sends the second as a copy)
            if owned is None or owned[0] is not value or owned[1] in leases:
                return None
            lease = owned[1]
            found += (name, value.dtype, value.shape, lease.segment, lease.offset)
            leases.append(lease)
        key = tuple(found)
        kept = self._in_place_frames.get(key, _UNSEEN)
        if kept is _UNSEEN:
            if len(self._in_place_frames) >= MAX_KEPT:
                self._in_place_frames.clear()
            kept = self._in_place_frames[key] = (
                in_place_event_template(outputs, allocated, self.tensors()[0], request_id,
                                        call.stage_id, call.epoch, self.boot.generation,
                                        self.limits.max_header_bytes)
                if self.event_fields else None)
        if kept is None:
            return None
        producer = self._producer
        if producer is not None:
            gone = producer.take_gone()
            if gone:  # announced by the general path's event
                producer.restore_gone(gone)
                return None
        before, after, stage, pieces, header_len = kept
        meta = b"" if not acks else ('{"acks":' + ack_pairs_text(acks) + "}").encode()
        header_len += len(meta)
        if header_len > self.limits.max_header_bytes:  # refused by the general path
            return None
        parts = [_IN_PLACE_HEAD.pack(BINARY_MAGIC, header_len, 0, before, len(meta), after),
                 request_id, stage, EVENT_BLOCK.pack(seq, time.monotonic_ns(), _DONE),
                 pieces[0]]
        index = 1
        for lease in leases:
            parts += (_GENERATION.pack(lease.generation), pieces[index])
            index += 1
        parts.append(meta)
        for value in outputs.values():  # sent as the packer sends them: no longer the call's
            del allocated[id(value)]
        total = PREFIX_SIZE + header_len
        with self._send_lock:
            sent = not self._broken
            if sent:
                try:
                    written = self._sendmsg(parts)
                    if written != total:
                        _write_rest(self._sendmsg, parts, written, total)
                except (OSError, WireError):  # a frame cut short: the channel is done
                    self._broken, sent = True, False
        if not sent:
            self.tensors()[0].take_back([(lease.segment, lease.generation) for lease in leases])
        if self._calls:  # (a call of the usual path the handler answered is not in it)
            with self._calls_lock:
                if self._calls.get(call.request_id) is call:
                    del self._calls[call.request_id]
        return sent

    def forget(self, call: Call) -> None:
        """Drop a call that has ended."""
        with self._calls_lock:
            if self._calls.get(call.request_id) is call:
                del self._calls[call.request_id]

    # -- receiving ---------------------------------------------------------------------

    def _receive(self) -> bool | None:
        """Receive what the socket holds, and serve it now when it is the usual request.

        None: it was the usual request (see :mod:`edge_contracts.worker_kept`), served.
        Else what was received is handed to the frame reader, which reads one frame (as
        :meth:`_read_one`, whose result this is); a request read so, the only frame of
        the receive, is kept as a template when it is a usual one.
        """
        if self._received.left is not None:
            return self._read_one()
        view = self._intake
        try:
            count = self._recv_into(view)
        except OSError as exc:
            print(f"edge worker: channel: refused frame: {exc}", file=sys.stderr)
            return False
        raw = kept = None
        # all the stream held (less than the room given): no frame waits behind it
        if PREFIX_SIZE <= count < DEFAULT_BUFFER_BYTES:
            magic, header_len, payload_len = PREFIX.unpack_from(view)
            header_end = PREFIX_SIZE + header_len
            if (not payload_len and magic == BINARY_MAGIC and header_end <= count
                    and view[_OP_AT] == _ACK_CODE and self._usual_ack is not None
                    and self._ack_usually(view[PREFIX_SIZE:header_end].tobytes())):
                # the usual acknowledgement, applied; perhaps one whole frame after it
                if header_end == count:
                    return None
                view = view[header_end:count]  # the rest, read as if it were all received
                count -= header_end
                if count >= PREFIX_SIZE:
                    magic, header_len, payload_len = PREFIX.unpack_from(view)
                    header_end = PREFIX_SIZE + header_len
            if (magic == BINARY_MAGIC and header_end + payload_len == count
                    and header_len >= _ID_END):  # one whole binary frame
                raw = view[PREFIX_SIZE:header_end].tobytes()  # (no bytes() type call)
                id_end = REQUEST_ID_AT + (raw[4] | raw[5] << 8)
                kept = self._usual.get(raw[:REQUEST_ID_AT] + raw[id_end:])
                if kept is not None and kept[0] == payload_len:
                    try:
                        request_id: str | None = raw[REQUEST_ID_AT:id_end].decode()
                    except UnicodeDecodeError:  # the reader refuses it
                        request_id = None
                    # the parser's checks of an id; a fenced request: dropped by _execute
                    if (request_id is not None
                            and (not request_id or (len(request_id) <= MAX_ID_LENGTH
                                                    and request_id.isprintable()))
                            and not (self._fences and self._fenced_at(kept[2], kept[3]))):
                        _, op, stage_id, epoch, generation, layout = kept
                        inputs: dict[str, Any] = {}
                        if layout:  # read-only views of the loop's own copy of the payload
                            own = view[header_end:count].tobytes()
                            frombuffer = self._frombuffer
                            for name, dtype, number, offset, shape in layout:
                                array = frombuffer(own, dtype, number, offset)
                                inputs[name] = array if shape is None else array.reshape(shape)
                        self._run_usual(Call.usual(self, request_id, op, stage_id, epoch,
                                                   generation, inputs, []))
                        return None
                elif kept is None and self._usual_refs:  # perhaps a zero-copy one
                    candidates = self._usual_refs.get(raw[:REQUEST_ID_AT])
                    if candidates is not None and self._run_usual_refs(
                            raw, id_end, candidates, view[header_end:count]):
                        return None
        self._received.left = view[:count]
        read = self._read_one()
        if raw is not None and kept is None:
            if self._pending:
                self._learn(raw, self._pending[-1].header)
            elif (read and raw[2] == _ACK_CODE and self._usual_ack is None
                  and _META_LEN.unpack_from(raw, _META_LEN_AT)[0] == len(raw) - REQUEST_ID_AT):
                # an acknowledgement the reader read whole (the receive's only frame: one
                # after a usual one, read so, is not looked at here, and one is kept), of
                # nothing but its fixed part and meta (no ids, no entries: as the usual one)
                self._usual_ack = raw[:_META_LEN_AT] + raw[_META_LEN_END:REQUEST_ID_AT]
        return read

    def _ack_usually(self, raw: bytes) -> bool:
        """Apply the usual acknowledgement ``raw`` (a whole binary header); False: not one.

        Usual: its fixed part, but for its meta length, is that of an acknowledgement the
        frame reader read whole (a payload of none, checked by the caller), its length
        within ``max_header_bytes``, and its meta exactly the ``{"segments":[...]}`` text
        :func:`~edge_contracts.binary_header.pairs_meta` reads (what the parser and
        :func:`~edge_contracts.worker_protocol.parse_ack` would make of it). Its leases
        are released as :meth:`_ack` releases them (a stale one frees nothing). False,
        with nothing done, for any other: the frame reader and :meth:`_ack` then read it.
        """
        size = len(raw)
        if (raw[:_META_LEN_AT] + raw[_META_LEN_END:REQUEST_ID_AT] != self._usual_ack
                or size > self.limits.max_header_bytes
                or _META_LEN.unpack_from(raw, _META_LEN_AT)[0] != size - REQUEST_ID_AT):
            return False
        meta = pairs_meta(raw, REQUEST_ID_AT)
        pairs: Any = None if meta is None else meta.view().get("segments")
        if pairs is None:  # (an "acks" key: not an acknowledgement's, released nothing)
            return False
        producer = self._producer
        if producer is not None:
            for segment, generation in pairs:
                producer.release(segment, generation)
        return True

    def _learn(self, raw: bytes, header: FrameHeader) -> None:
        """Keep the template of a request whose header ``raw`` the reader parsed whole."""
        found = request_template(raw, header)
        if found is not None:
            if header.tensors and self._frombuffer is None:
                import numpy  # the usual path's inputs are arrays

                self._frombuffer = numpy.frombuffer
            if len(self._usual) >= MAX_KEPT:
                self._usual.clear()
            self._usual[found[0]] = found[1]
        elif self.use_shm:
            refs = refs_request_template(raw, header)
            if refs is not None:
                if self._frombuffer is None:
                    import numpy  # the usual path's inputs are arrays

                    self._frombuffer = numpy.frombuffer
                if len(self._usual_refs) >= MAX_KEPT:
                    self._usual_refs.clear()
                key, kept = refs
                others = tuple(old for old in self._usual_refs.get(key, ())
                               if old[5] != kept[5])  # (the same pieces: replaced)
                self._usual_refs[key] = (kept, *others[: REFS_PER_KEY - 1])

    def _run_usual_refs(self, raw: bytes, id_end: int,
                        candidates: tuple[KeptRefsRequest, ...], payload: memoryview) -> bool:
        """Run a usual zero-copy request (as :meth:`_execute` runs any); False: not one.

        ``raw`` (a whole binary header, its id ending at ``id_end``) must equal one of
        ``candidates`` but for its id and its references' generations, and ``payload`` be
        that one's length; the id gets the parser's checks, each generation
        :class:`~edge_contracts.headers.ShmRef`'s, and each shared-memory input is mapped
        by :meth:`~edge_contracts.shm.SegmentConsumer.view` (its segment, range and
        generation checked). False, with nothing run, for anything else (any refusal, a
        fenced request): the frame reader and the general path then refuse or answer it
        as any frame.
        """
        found = refs_request_match(raw, id_end, candidates, len(payload))
        consumer = self._consumer
        if found is None or consumer is None:
            return False
        kept, generations = found
        try:
            request_id = raw[REQUEST_ID_AT:id_end].decode()
        except UnicodeDecodeError:  # the reader refuses it
            return False
        _, op, stage_id, epoch, generation, _, _, layout = kept
        # the parser's checks of an id; a fenced request: dropped by _execute
        if ((request_id and not (len(request_id) <= MAX_ID_LENGTH and request_id.isprintable()))
                or (self._fences and self._fenced_at(stage_id, epoch))):
            return False
        inputs: dict[str, Any] = {}
        acks: list[list[Any]] = []
        frombuffer = self._frombuffer
        own = None
        try:
            for name, dtype, count, shape, segment, offset in layout:
                if segment is None:  # inline: a read-only view of the loop's own copy
                    if own is None:
                        own = payload.tobytes()
                    array = frombuffer(own, dtype, count, offset)
                else:  # read-only: the consumer maps the peer's segment so
                    stamp = generations[len(acks)]
                    array = frombuffer(consumer.view(segment, offset, stamp,
                                                     count * dtype.itemsize), dtype, count)
                    acks.append([segment, stamp])
                inputs[name] = array if shape is None else array.reshape(shape)
        except Exception:  # refused again, with its error, by the general path
            return False
        self._run_usual(Call.usual(self, request_id, op, stage_id, epoch, generation,
                                   inputs, acks))
        return True

    def _run_usual(self, call: Call) -> None:
        """Run the call of a usual request on the loop thread, as :meth:`_execute` runs one."""
        heartbeat = self._heartbeat
        if heartbeat is not None and not heartbeat.pending:
            heartbeat.wake()
        self._executing = True
        try:
            # Nothing reads the loop's calls while the handler runs on the loop thread
            # (cancel and ping are read by this thread; the heartbeat sees _executing):
            # a call the handler answers before it returns is never entered, only one
            # it hands on (a streaming handler's: submit returns None), and that one is
            # dropped again at once where it ended meanwhile on another thread (an end
            # marks the call closed before it drops it, and found nothing to drop).
            try:
                outputs = self.handler.submit(call)
            except Exception as exc:  # reported as the request's ERROR event
                call.fail(exc)
                return
            if outputs is not None:
                call.done(outputs)
            else:
                with self._calls_lock:
                    self._calls[call.request_id] = call
                    if call.closed:
                        del self._calls[call.request_id]
        finally:
            self._executing = False

    def _read_one(self) -> bool:
        """Read and dispatch one frame; False at end of stream."""
        try:
            frame = self._frames.read()
        except StreamClosed:
            return False
        except (WireError, OSError) as exc:
            print(f"edge worker: channel: refused frame: {exc}", file=sys.stderr)
            return False
        header = frame.header
        op = header.op
        if op in DATA_OPS or op in CONTROL_OPS:  # meta is the stage's: never ``gone``
            self._pending.append(frame)
        elif op == OP_CANCEL:
            self._cancel(header)
        elif op == OP_ACK:
            try:
                self._ack(header.meta)
            except ContractError as exc:  # a malformed ack frees nothing; the worker stays
                print(f"edge worker: channel: refused ack: {exc}", file=sys.stderr)
        elif op == OP_PING:
            self.reply(header, {"in_flight": len(self._calls), "pid": os.getpid(),
                                "spin": self._spin.state()}, None)
        elif op == OP_QUERY:
            self._query(header)
        elif op == OP_SHUTDOWN:
            self._stop = True
        elif op == OP_SPIN:
            try:
                self._spin.permit(*parse_spin(header.meta))
            except ContractError as exc:  # a malformed cap changes nothing; the worker stays
                print(f"edge worker: channel: refused spin: {exc}", file=sys.stderr)
            self._plain = 0
            self._wait_plainly = not self._spin.active and self._blocking
        else:
            self.reply(header, None, ValueError(f"op: unknown to this worker: {op!r}"))
        return True

    def _query(self, header: FrameHeader) -> None:
        """Answer a ``query`` now with the handler's ``query`` (an error without one)."""
        answer = getattr(self.handler, "query", None)
        if answer is None:
            self.reply(header, None, NotImplementedError(
                f"op: {OP_QUERY!r}: this worker's handler answers no query"))
            return
        if self._heartbeat is not None:
            self._heartbeat.wake()
        executing, self._executing = self._executing, True  # beats while it answers
        try:
            result = answer(thaw_json(header.meta))  # type: ignore[arg-type]
        except Exception as exc:  # reported to the controller
            self.reply(header, None, exc)
        else:
            self.reply(header, result, None)
        finally:
            self._executing = executing

    def _ack(self, meta: Mapping[str, Any]) -> None:
        """Apply an ``ack``: checked whole before anything is released."""
        gone, released, unlinked = parse_ack(meta)
        if gone and self._consumer is not None:
            self._consumer.forget(gone)
        if self._producer is not None:
            for segment, generation in released:
                self._producer.release(segment, generation)
            for segment, generation in unlinked:
                self._producer.release(segment, generation, unlink=True)

    def _cancel(self, header: FrameHeader) -> None:
        target = header.meta.get("target")
        fence = header.meta.get("fence_epoch")
        stage = header.stage_id
        if isinstance(fence, int):
            self._fences[stage] = max(self._fences.get(stage, 0), fence)
        with self._calls_lock:
            victims = [
                call
                for call in self._calls.values()
                if call.request_id == target
                or (isinstance(fence, int) and call.stage_id == stage and call.epoch < fence)
            ]
        for call in victims:
            if call.emit(EventKind.CANCELLED):
                try:
                    self.handler.cancel(call.request_id)
                except Exception:  # the request is already ended
                    print_exception()
        if target is not None:
            for frame in [f for f in self._pending if f.header.request_id == target]:
                self._pending.remove(frame)
                self._drop(frame)

    def _fenced(self, header: FrameHeader) -> bool:
        return header.epoch < self._fences.get(header.stage_id, 0)

    def _fenced_at(self, stage_id: str, epoch: int) -> bool:
        return epoch < self._fences.get(stage_id, 0)

    def _drop(self, frame: Frame) -> None:
        """Answer a request that will never run with CANCELLED, acknowledging its inputs."""
        call = Call(self, frame.header, {}, refs_of(frame) if frame.header.tensors else [])
        call.emit(EventKind.CANCELLED)

    # -- executing ---------------------------------------------------------------------

    def _execute(self, frame: Frame) -> None:
        header = frame.header
        if header.op in CONTROL_OPS:
            config: Mapping[str, Any] = thaw_json(header.meta)  # type: ignore[assignment,arg-type]
            method = self.handler.load if header.op == OP_LOAD else self.handler.warmup
            try:
                result = method(config)
            except Exception as exc:  # reported to the controller
                self.reply(header, None, exc)
            else:
                self.reply(header, result, None)
            return
        if self._fences and self._fenced(header):
            self._drop(frame)
            return
        acks: list[list[Any]] = []
        inputs: dict[str, Any] = {}
        failure: BaseException | None = None
        if header.tensors:
            # imports worker_transport (numpy) the first time
            unpacker = self._unpacker or self.tensors()[1]
            acks = refs_of(frame)
            try:
                inputs = unpacker.unpack(frame)
            except Exception as exc:  # a refused input ends the request
                failure = input_fault(exc)  # a bool input's stray bytes: the request's
        call = Call(self, header, inputs, acks)
        if failure is not None:
            call.fail(failure)
            return
        with self._calls_lock:
            self._calls[call.request_id] = call
        try:
            outputs = self.handler.submit(call)
        except Exception as exc:  # reported as the request's ERROR event
            call.fail(exc)
            return
        if outputs is not None:
            call.done(outputs=outputs)

    def serve(self) -> int:
        """Serve frames until shutdown or end of stream; return the exit status."""
        frames = self._frames
        heartbeat = self._heartbeat
        poll = self._poll.poll
        fresh = False  # the last receive drained the socket and nothing has run since
        try:
            while not self._stop:
                if self._pending:
                    # a frame waits in the read buffer, or (unless the last receive
                    # drained the socket and nothing ran since) on the socket
                    while ((frames.buffered or (not fresh and self._poll.poll(0)))
                           and not self._stop):
                        if not self._read_one():
                            self._orphaned = True
                            return 0
                        fresh = fresh and frames.drained
                    if self._pending and not self._stop:
                        if heartbeat is not None and not heartbeat.pending:
                            heartbeat.wake()
                        self._executing = True
                        fresh = False
                        try:
                            self._execute(self._pending.popleft())
                        finally:
                            self._executing = False
                else:
                    # a frame may wait in the read buffer; without a spin budget a
                    # blocking poll waits for the socket
                    from_socket = not frames.buffered
                    if from_socket:
                        while True:
                            if self._wait_plainly:
                                if self._plain:  # a plain wait the next-frame wait must count
                                    self._plain -= 1
                                    if not self._plain:
                                        self._wait_again()
                                poll()  # woken by data only (see the module)
                            elif not self._calls or not self._blocking:
                                # spins briefly while requests come fast; never while a
                                # stream runs on the handler's threads (then a plain
                                # poll waits)
                                self._next_frame.wait(None)
                                if self._spin.settled:
                                    self._receive_plainly()
                            else:
                                poll()
                            read = self._receive()
                            if read is not None:
                                break
                            # the usual request, served: nothing else ran (no frame read,
                            # none pending, no stop, the reader's buffer still empty)
                            fresh = False
                    else:
                        read = self._read_one()
                    if not read:
                        self._orphaned = True
                        return 0
                    fresh = frames.drained and (from_socket or fresh)
            return 0
        finally:
            self._close()

    def _receive_plainly(self) -> None:
        """A window decided no spin: wait plainly until the next measured wait."""
        self._spin.settled = False
        plain = self._next_frame.plain_waits()
        if plain > 0 and self._blocking:
            self._plain = self._plain_total = plain
            self._wait_plainly = True

    def _wait_again(self) -> None:
        """The plain receives are done: count them, and wait in the next-frame wait again."""
        self._next_frame.skip(self._plain_total)
        self._wait_plainly = not self._spin.active and self._blocking

    def _close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        try:
            self.handler.close()
        except Exception:  # shutting down regardless
            print_exception()
        if self._producer is not None:
            self._producer.close()
        if self._consumer is not None:
            self._consumer.close()
        if self._orphaned and self.use_shm:  # nobody else will unlink the peer's segments
            try:
                sweep(self.boot.peer_prefix)
            except Exception:  # exiting regardless
                print_exception()
        self.sock.close()


def _write_rest(sendmsg: Callable[[list[Any]], int], parts: list[Any], written: int,
                total: int) -> None:
    """Write the rest of a frame whose first gather-write wrote ``written`` of ``total``."""
    if written <= 0:
        raise WireError("frame", 0, f"write made no progress after 0 of {total} bytes")
    write_frame(sendmsg, [memoryview(b"".join(parts))[written:]])


def uses_sealed(boot: BootConfig) -> bool:
    """Whether this worker exchanges sealed memfd segments (a channel and the means)."""
    if boot.shm_fds <= 2 or not SEALS_AVAILABLE:
        return False
    try:
        os.fstat(boot.shm_fds)
    except OSError:
        return False
    return True


def _load_factory(entry: str) -> Callable[[], Handler]:
    module_name, _, attribute = entry.partition(":")
    factory: Callable[[], Handler] = getattr(importlib.import_module(module_name), attribute)
    return factory


def serve(sock: socket.socket, boot: BootConfig) -> int:
    """Create the handler, say hello and serve ``sock`` until shutdown; return the status.

    The hello's ``startup`` says what the entry cost in this process, on its own
    ``time.perf_counter``: ``entry_import_s`` (importing the entry's module: the runtime
    it imports, e.g. onnxruntime) and ``handler_s`` (calling its factory).
    """
    supported = KNOWN_FEATURES if SHM_AVAILABLE else KNOWN_FEATURES - _SHM
    try:
        began = time.perf_counter()
        factory = _load_factory(boot.entry)
        imported = time.perf_counter()
        handler = factory()
        startup = {"entry_import_s": imported - began,
                   "handler_s": time.perf_counter() - imported}
        required = frozenset(handler.required_features())
        versions = handler.versions()
    except Exception as exc:  # reported in the hello, then exit
        meta = hello_meta(
            boot.token, required=frozenset(), offered=frozenset(), versions={}, shm_prefix=None
        )
        meta["error"] = error_info(exc)
        _send_hello(sock, boot, meta)
        sock.close()
        return 1
    meta = hello_meta(
        boot.token,
        required=required,
        offered=supported,
        versions=versions,
        shm_prefix=boot.shm_prefix if SHM_AVAILABLE else None,
    )
    meta["startup"] = startup
    server = _Server(sock, boot, handler)
    meta["sealed_segments"] = server.sealed
    _send_hello(sock, boot, meta)
    _collect_again()
    status = server.serve()
    if getattr(handler, "exit_after_close", False) is True:
        _exit_at_once(status)
    return status


def _collect_again() -> None:
    """Turn the cyclic garbage collector on again, where the worker started without it.

    ``python -c WORKER_MAIN`` (``edge_core.host.bootstrap``) starts a worker with the
    collector off, so that the imports of its start-up are not scanned again and again.
    What they made (modules, classes, the handler) lives as long as the worker: frozen
    first (:func:`gc.freeze`), it is never scanned again, not even once by the first
    collection. A handler that wants the collector off turns it off in its ``load``.
    """
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _exit_at_once(status: int) -> None:
    """End the process now, its output flushed (see ``BaseHandler.exit_after_close``)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _send_hello(sock: socket.socket, boot: BootConfig, meta: dict[str, Any]) -> None:
    header = FrameHeader(OP_HELLO, "", "", 0, boot.generation, meta=meta)
    with contextlib.suppress(OSError):  # the controller is gone: nothing to tell
        write_frame(sock.sendmsg, encode_frame(header, []))


def main(argv: list[str] | None = None) -> int:
    """Entry of ``python -m edge_contracts.worker FD``; returns the exit status.

    The first frame on the channel FD must be the controller's ``boot`` frame.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m edge_contracts.worker FD", file=sys.stderr)
        return 2
    try:  # the C socket type: the ``socket`` module adds ~3 ms of imports to start-up
        from _socket import socket as socket_type
    except ImportError:  # pragma: no cover - an interpreter without CPython's _socket
        from socket import socket as socket_type  # type: ignore[assignment]
    fd = int(args[0])
    os.set_inheritable(fd, False)
    sock: socket.socket = socket_type(fileno=fd)  # type: ignore[assignment]
    try:
        boot = read_boot(sock.recv_into)
    except (ContractError, OSError) as exc:
        print(f"edge worker: boot: {exc}", file=sys.stderr)
        sock.close()
        return 2
    if boot.shm_fds > 2:  # the sealed-segment channel is this process's alone too
        os.set_inheritable(boot.shm_fds, False)
    return serve(sock, boot)


if __name__ == "__main__":
    from edge_contracts.worker import main as _main  # run the importable module, not __main__

    sys.exit(_main())
