"""Reading frames from a stream with one receive call per small frame.

:func:`~edge_contracts.wire.read_frame` reads exactly one frame in three exact-size reads
(prefix, header, payload), so it never takes a byte of the next frame; that suits one-off
reads such as the hello. A channel that reads frame after frame pays three system calls
per frame that way. :class:`FrameReader` keeps a receive buffer instead: one
``recv_into`` usually brings a whole small frame (and perhaps the start of the next),
and the parts are taken from the buffer. A payload larger than what is buffered gets its
own buffer, filled by reads straight into it, so a large tensor is not copied twice; that
buffer grows as the bytes arrive (:func:`~edge_contracts.wire.receive_payload`), so a
declared length never becomes an allocation before the peer has sent the bytes.

The checks are those of ``read_frame``, in the same order: the prefix and header are
checked before the payload buffer is allocated.

Because bytes can wait in the buffer, a caller that polls the socket must first ask
:attr:`FrameReader.buffered`: a frame may be complete in the buffer while the socket
has nothing more to read. :attr:`FrameReader.drained` says whether the last receive
took everything the stream held at that instant (it filled less than the room it was
given), so that a caller who must see every frame already sent before it acts can skip
a poll right after such a read.
"""

from __future__ import annotations

from collections.abc import Callable

from edge_contracts.binary_header import kept_header
from edge_contracts.errors import FrameTruncated, StreamClosed, WireError
from edge_contracts.headers import Limits
from edge_contracts.protocol import FEATURE_BINARY_HEADER
from edge_contracts.wire import (
    BINARY_MAGIC,
    PREFIX,
    PREFIX_SIZE,
    Frame,
    decode_prefix,
    parse_header,
    prechecked_frame,
    receive_payload,
)

__all__ = ["DEFAULT_BUFFER_BYTES", "FrameReader", "ReceivedFirst", "ReceivedFirstKept"]

DEFAULT_BUFFER_BYTES = 16384
"""Receive-buffer size: frames of a few KiB (headers, tiny tensors) take one read."""


class ReceivedFirst:
    """A ``recv_into`` that hands out bytes already received first, then reads the socket.

    For a channel that looks at what one receive brought before its :class:`FrameReader`
    does (a usual frame served from a kept template): whatever it does not serve itself it
    sets as :attr:`left`, and the reader, given this object as its ``recv_into``, reads
    those bytes first, as if they had just arrived.

    Attributes:
        left: bytes received and not yet taken by the reader (None: none).

    """

    __slots__ = ("_recv_into", "left")

    def __init__(self, recv_into: Callable[[memoryview], int]) -> None:
        self._recv_into = recv_into
        self.left: memoryview | None = None

    def __call__(self, view: memoryview) -> int:
        """Fill a prefix of ``view`` from :attr:`left`, else from the socket; the count."""
        left = self.left
        if left is None:
            return self._recv_into(view)
        count = min(len(left), len(view))
        view[:count] = left[:count]
        self.left = left[count:] if count < len(left) else None
        return count


class ReceivedFirstKept(ReceivedFirst):
    """A :class:`ReceivedFirst` whose socket receive hands its count on with no point between.

    For :meth:`FrameReader.read_into`, which must not lose a receive's bytes to a
    ``KeyboardInterrupt``: CPython acts on one after a call returns, so
    ``return recv_into(view)`` can drop bytes taken off the socket between the receive
    and the return. Here the receive is a ``for`` loop's step (called from C, stored with
    no check for a signal between), and what is taken from :attr:`left` is taken as
    :attr:`left` is stored (a copy beyond it, interrupted before that store, is copied
    again).
    """

    __slots__ = ()

    def __call__(self, view: memoryview) -> int:
        """Fill a prefix of ``view`` from :attr:`left`, else from the socket; the count."""
        left = self.left
        if left is None:
            for count in map(self._recv_into, (view,)):  # noqa: B007 (one step: see above)
                break
            return count
        count = min(len(left), len(view))
        view[:count] = left[:count]
        self.left = left[count:] if count < len(left) else None
        return count


class FrameReader:
    """Reads frames one after another from ``recv_into``, buffering what arrives early.

    Args:
        recv_into: fills a prefix of the view it is given and returns the byte count,
            0 at end of stream (e.g. ``socket.recv_into``).
        limits: the reader's limits, checked on every frame.
        buffer_bytes: size of the receive buffer (at least 2 * 16 bytes).

    Not thread-safe: one thread reads at a time (the channel's read role).

    Attributes:
        drained: True when the last receive filled less than the room it offered (read
            it, never set it). The stream then held no more bytes at that instant: every
            frame sent before it is in the buffer (or was read). False before the first
            receive and after a payload read straight into its own buffer (which may stop
            at the frame's end). A plain attribute, not a property: a serve loop reads it
            per frame.
    """

    __slots__ = ("_binary", "_buffer", "_end", "_header_cap", "_io_cap", "_limits",
                 "_recv_into", "_size", "_start", "_view", "drained")

    drained: bool

    def __init__(
        self,
        recv_into: Callable[[memoryview], int],
        limits: Limits,
        *,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    ) -> None:
        if type(buffer_bytes) is not int or buffer_bytes < 2 * PREFIX_SIZE:
            raise WireError("reader.buffer_bytes", buffer_bytes, f"must be >= {2 * PREFIX_SIZE}")
        self._recv_into = recv_into
        self._limits = limits
        # What decode_prefix checks a binary prefix against, read once (limits are frozen)
        self._binary = FEATURE_BINARY_HEADER in limits.supported_features
        self._header_cap = limits.max_header_bytes
        self._io_cap = limits.max_io_bytes
        self._buffer = bytearray(buffer_bytes)
        self._size = buffer_bytes
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        self.drained = False

    @property
    def buffered(self) -> bool:
        """True when bytes of a frame wait in the buffer (read them before polling)."""
        return self._end > self._start

    def has_buffered(self) -> bool:
        """:attr:`buffered` as a method, for a caller that is handed a callable."""
        return self._end > self._start

    def read(self) -> Frame:
        """Read and check the next frame.

        Raises:
            StreamClosed: the stream ended before the first byte of a frame.
            FrameTruncated: the stream ended inside a frame.
            WireError: any other refusal (see :func:`~edge_contracts.wire.decode_prefix`
                and :func:`~edge_contracts.wire.parse_header`).

        """
        # Positions are kept in locals and written back where a call (or a raise) may
        # need them: the per-frame path reads no attribute twice.
        start = self._start
        end = self._end
        view = self._view
        if start == end:  # the usual case: nothing buffered, one receive from 0
            count = self._recv_into(view)
            room = self._size
            if not 0 <= count <= room:
                raise WireError("prefix", count, f"recv_into must return 0..{room} bytes")
            self.drained = count < room
            self._start = start = 0
            self._end = end = count
            if count < PREFIX_SIZE:
                if not count:
                    raise StreamClosed("prefix", 0, "end of stream before the next frame")
                self._have(PREFIX_SIZE, "prefix")
                start, end = self._start, self._end
        elif end - start < PREFIX_SIZE:
            self._have(PREFIX_SIZE, "prefix")
            start, end = self._start, self._end
        magic, header_len, payload_len = PREFIX.unpack_from(self._buffer, start)
        # The usual prefix passes decode_prefix's checks inline; any other is decoded by
        # it (which raises what is wrong, in its order).
        usual = (magic == BINARY_MAGIC and self._binary and 0 < header_len <= self._header_cap
                 and payload_len <= self._io_cap)
        binary = usual or magic == BINARY_MAGIC
        if not usual:
            header_len, payload_len = decode_prefix(view[start : start + PREFIX_SIZE],
                                                    self._limits)
        start += PREFIX_SIZE
        raw: bytes | bytearray
        if header_len <= self._size:
            if end - start < header_len:
                self._start = start
                self._have(header_len, "header")
                start, end = self._start, self._end
            raw = bytes(view[start : start + header_len])
            self._start = start = start + header_len
            # A usual binary header equal to a kept one but for its request id (and
            # event block) is built from it; anything else goes through the full parser.
            header = kept_header(raw, self._limits, payload_len) if usual else None
        else:  # a header larger than the buffer (only with raised limits)
            self._start = start
            raw = bytearray(header_len)
            self._take_into(memoryview(raw), "header")
            start, end = self._start, self._end
            header = None
        if header is None:
            header = parse_header(raw, self._limits, payload_len=payload_len, binary=binary,
                                  kept=not usual)  # a usual one was looked up above
        buffered = min(payload_len, end - start)
        head = view[start : start + buffered]
        start += buffered
        if start == end:
            self._start = self._end = 0
        else:
            self._start = start
        if buffered == payload_len:  # all here already (small frames): one copy out
            # parse_header checked payload_len against the header's inline bytes
            return prechecked_frame(header, bytearray(head))
        self.drained = False  # read exactly to the frame's end: more may wait
        return Frame(header, receive_payload(self._recv_into, payload_len, head))

    def read_into(self, frames: list[Frame]) -> None:
        """Read and check the next frame, and append it to ``frames``: all of it or nothing.

        :meth:`read`, safe to interrupt: a ``KeyboardInterrupt`` wherever CPython acts on
        one (after a call returns, at a function's start, at a backward jump) leaves the
        reader where it was but for bytes received into its buffer, so the next read
        reads the same frame. The buffer's start moves past the frame only as the frame
        is appended, with no such point between, and each receive stores its count with
        none between either (give the reader a :class:`ReceivedFirstKept`, or a receive
        implemented in C). A frame that does not fit the buffer whole (its header and
        payload over ``buffer_bytes``) is read as :meth:`read` reads it: the part of it
        taken off the stream before an interrupt is lost.

        Raises what :meth:`read` raises.
        """
        start = self._start
        if self._end - start < PREFIX_SIZE:
            self._fill(PREFIX_SIZE, "prefix")
            start = self._start
        magic, header_len, payload_len = PREFIX.unpack_from(self._buffer, start)
        usual = (magic == BINARY_MAGIC and self._binary and 0 < header_len <= self._header_cap
                 and payload_len <= self._io_cap)
        binary = usual or magic == BINARY_MAGIC
        if not usual:
            header_len, payload_len = decode_prefix(self._view[start : start + PREFIX_SIZE],
                                                    self._limits)
        header_end = PREFIX_SIZE + header_len
        size = header_end + payload_len
        if size > self._size:  # not whole in the buffer: as read() reads it (its frame
            for frame in map(FrameReader.read, (self,)):  # stored with no point between)
                frames += (frame,)
            return
        if self._end - start < size:
            self._fill(header_end, "header")
            self._fill(size, "payload")
            start = self._start
        view = self._view
        at = start + PREFIX_SIZE
        raw = bytes(view[at : at + header_len])
        header = kept_header(raw, self._limits, payload_len) if usual else None
        if header is None:
            header = parse_header(raw, self._limits, payload_len=payload_len, binary=binary,
                                  kept=not usual)
        at += header_len
        frame = prechecked_frame(header, bytearray(view[at : at + payload_len]))
        at += payload_len
        # From here to the append, no point where an interrupt can act
        if at == self._end:
            self._start = self._end = 0
        else:
            self._start = at
        frames += (frame,)

    def _fill(self, wanted: int, part: str) -> None:
        """:meth:`_have`, each receive's count stored with no point between (read_into)."""
        available = self._end - self._start
        if available >= wanted:
            return
        if not available:
            self._start = self._end = 0
        elif self._start + wanted > self._size:  # the tail to the front (no call: one step)
            self._view[:available] = self._view[self._start : self._end]
            self._start, self._end = 0, available
        while self._end - self._start < wanted:
            end = self._end
            room = self._size - end
            for count in map(self._recv_into, (self._view[end:],)):  # noqa: B007 (one step)
                break
            if not 0 <= count <= room:
                raise WireError(part, count, f"recv_into must return 0..{room} bytes")
            self._end = end + count
            self.drained = count < room
            if count == 0:
                got = end - self._start
                if part == "prefix" and got == 0:
                    raise StreamClosed(part, 0, "end of stream before the next frame")
                raise FrameTruncated(part, got, f"stream ended after {got} of {wanted} bytes")

    def _have(self, wanted: int, part: str) -> None:
        """Make ``wanted`` (<= buffer size) bytes available at the buffer's start index."""
        available = self._end - self._start
        if available >= wanted:
            return
        if not available:
            self._start = self._end = 0
        elif self._start + wanted > len(self._buffer):  # move the tail to the front
            self._view[:available] = self._view[self._start : self._end]
            self._start, self._end = 0, available
        while self._end - self._start < wanted:
            count = self._recv(self._view[self._end :], part)
            if count == 0:
                got = self._end - self._start
                if part == "prefix" and got == 0:
                    raise StreamClosed(part, 0, "end of stream before the next frame")
                raise FrameTruncated(part, got, f"stream ended after {got} of {wanted} bytes")
            self._end += count

    def _take_into(self, view: memoryview, part: str) -> None:
        """Fill ``view`` from the buffer first, then by reads straight into it."""
        wanted = len(view)
        got = min(wanted, self._end - self._start)
        if got:
            view[:got] = self._view[self._start : self._start + got]
            self._start += got
        if self._start == self._end:
            self._start = self._end = 0
        while got < wanted:
            count = self._recv(view[got:], part)
            if count == 0:
                raise FrameTruncated(part, got, f"stream ended after {got} of {wanted} bytes")
            got += count

    def _recv(self, view: memoryview, part: str) -> int:
        count = self._recv_into(view)
        room = len(view)
        if not 0 <= count <= room:
            raise WireError(part, count, f"recv_into must return 0..{room} bytes")
        self.drained = count < room
        return count
