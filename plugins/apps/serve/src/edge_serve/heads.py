"""Request heads that do not arrive in time: one sweep closes their connections.

uvicorn bounds no read of a request's head (its request line and headers): a client that
opens a connection and sends nothing, or trickles a head a byte at a time and never ends
it (slowloris), held the connection — one of the server's file descriptors — for ever, and
enough of them leave the server unable to accept any connection. uvicorn's keep-alive
timeout covers only a connection idle after an answer, and only until its next byte.

:class:`SlowHeads` gives a connection ``timeout_s`` seconds to complete a request head,
counted from its opening and from the end of each answer. One timer for the whole server:
a sweep every :attr:`SlowHeads.tick` seconds looks at the server's open connections, notes
each one that waits for a head (no request of it running: none yet, or the last one
answered) and since when it was seen waiting, and closes those that waited ``timeout_s``
or longer — with a 408 (JSON, ``code: "header_timeout"``, ``Connection: close``) when part
of a head had arrived, silently when nothing had (an idle connection, as uvicorn closes an
idle keep-alive one). A connection is thus closed between ``timeout_s`` and ``timeout_s``
plus two ticks after it began to wait. The request path pays nothing for it: no timer and
no note per request or per connection, one look per open connection a tick instead.
Nothing is charged for such a connection: its request never reached the app.

The sweep reads the state of uvicorn's httptools protocol (:data:`PROTOCOL`, the one
``edge serve`` runs): whether a request of the connection is running, and whether a new
head has begun since the last.

A head is bounded in size too: httptools takes a header of any length (one line of 60 MiB
sent in six seconds grew the server by 80 MiB before the time bound cut it). The protocol
:func:`bounded_protocol` makes counts the bytes of each read that continues an unfinished
head, and a head past :data:`MAX_HEAD_BYTES` is answered 431 (``code:
"header_too_large"``, ``Connection: close``) at once, and its connection closed after
lingering (:func:`edge_serve.lingering.refuse`). Only reads that lie wholly inside a head
are counted (the one a head begins in is not), so no byte of a body is ever taken for a
head's, and a head is cut at most two reads (256 KiB each, as asyncio reads) past the
bound.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from edge_serve.guards import MAX_TIMEOUT_S
from edge_serve.lingering import REFUSED, drop, refuse
from edge_serve.outcomes import HttpRefusal, describe

__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "MAX_HEAD_BYTES", "PROTOCOL", "SlowHeads",
           "bounded_protocol", "head_too_large_refusal", "header_timeout_refusal"]

PROTOCOL: Final = HttpToolsProtocol
"""uvicorn's HTTP protocol ``edge serve`` runs (its C parser): the one the sweep reads."""

DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
"""How long, in seconds, a connection may take to send a whole request head (``edge serve
--header-timeout``'s default), from its opening and from the end of each answer."""

MAX_HEAD_BYTES: Final = 64 * 1024
"""The most bytes of a request head (request line and headers) the server reads: a head
past it is refused 431 (see the module docstring for how it is counted)."""

_BUSY: Final = object()
"""A connection with a request running (or closing): not waiting for a head."""


def header_timeout_refusal(timeout_s: float) -> HttpRefusal:
    """The 408 a connection whose head did not arrive within ``timeout_s`` is sent."""
    return HttpRefusal(408, "head", f"the request line and headers were not complete within "
                       f"{timeout_s:g} s (--header-timeout)", kind="HeaderTimeout",
                       code="header_timeout", headers={"Connection": "close"})


def head_too_large_refusal(limit: int) -> HttpRefusal:
    """The 431 a connection whose request head ran past ``limit`` bytes is sent."""
    return HttpRefusal(431, "head", f"the request line and headers are over {limit} bytes",
                       kind="HeaderTooLarge", code="header_too_large",
                       headers={"Connection": "close"})


def bounded_protocol(limit: int = MAX_HEAD_BYTES,
                     on_refused: Callable[[], None] | None = None) -> type[HttpToolsProtocol]:
    """The httptools protocol of uvicorn with each request head bounded to ``limit`` bytes.

    ``on_refused`` is told of each connection refused 431. A request pays two calls more
    (the head's begin and end); each read one comparison; a connection notes when it
    opened (:meth:`SlowHeads.waiting` orders by it).
    """
    if limit < 1:
        raise ValueError(f"limit: must be at least 1 byte: {limit!r}")
    answer = json.dumps(describe(head_too_large_refusal(limit))).encode()

    class BoundedHeads(PROTOCOL):  # type: ignore[misc,valid-type]
        """httptools' protocol, refusing a request head over ``limit`` bytes (431)."""

        refused = False  # answered and lingering (edge_serve.lingering): arrivals dropped
        dropped = 0  # bytes dropped while lingering (edge_serve.lingering.drop)
        head_open = False  # between a head's begin and its end
        head_begun = False  # a head began during the read being parsed
        head_bytes = 0  # of the open head, in reads that lay wholly inside it
        opened_at = 0.0  # time.monotonic() at the connection's opening

        def connection_made(self, transport: asyncio.Transport) -> None:
            self.opened_at = time.monotonic()
            super().connection_made(transport)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.head_open = self.head_begun = True
            self.head_bytes = 0

        def on_headers_complete(self) -> None:
            self.head_open = False
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            if self.refused:  # answered and half-closed: dropped until the close
                drop(self, len(data))
                return
            inside = self.head_open
            self.head_begun = False
            super().data_received(data)
            if inside and self.head_open and not self.head_begun:
                self.head_bytes += len(data)
                if self.head_bytes > limit and not self.refused \
                        and not self.transport.is_closing():
                    refuse(self, b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
                            answer)
                    if on_refused is not None:
                        on_refused()

    return BoundedHeads


def _waiting_since(connection: Any) -> object:
    """What a connection waits for a head after: its last request, None before any.

    :data:`_BUSY` when a request of it runs (or waits its turn) or it is closing.
    """
    if not isinstance(connection, PROTOCOL) or connection.transport.is_closing() \
            or getattr(connection, REFUSED, False):
        return _BUSY
    cycle = connection.cycle
    if cycle is not None and not cycle.response_complete:
        return _BUSY
    return cycle


class SlowHeads:
    """The sweep that closes connections whose request head did not arrive in time.

    ``on_close`` is told of each connection closed: ``"408"`` when it was answered,
    ``"closed"`` when nothing of a head had arrived. :meth:`start` begins the sweep over
    the server's connections; :meth:`stop` ends it.
    """

    def __init__(self, timeout_s: float, on_close: Callable[[str], None] | None = None) -> None:
        if not 0.0 < timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"header_timeout_s: must be a number of seconds > 0 and <= "
                             f"{MAX_TIMEOUT_S:g}: {timeout_s!r}")
        self.timeout_s = timeout_s
        self.tick = min(1.0, timeout_s / 4)
        self._on_close = on_close
        self._answer = json.dumps(describe(header_timeout_refusal(timeout_s))).encode()
        self._connections: Collection[Any] = ()
        self._seen: dict[Any, tuple[object, float]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def start(self, connections: Collection[Any]) -> None:
        """Sweep ``connections`` (uvicorn's live set of them) every tick from now on."""
        self._connections = connections
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.tick, self._sweep)

    def stop(self) -> None:
        """No more sweeps."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._seen = {}

    @property
    def connections(self) -> Collection[Any]:
        """The server's open connections (uvicorn's live set; empty before :meth:`start`)."""
        return self._connections

    def waiting(self) -> list[tuple[Any, object]]:
        """The connections waiting for a request head, the longest waiting first.

        Each with what it waits after (for :meth:`still_waits`). One that has had no
        request has waited since its opening; one that has, since the sweep first saw it
        waiting after its last answer (from now, if the sweep has not yet seen it).
        """
        now = time.monotonic()
        seen = self._seen
        found = []
        for connection in self._connections:
            after = _waiting_since(connection)
            if after is _BUSY:
                continue
            if after is None:
                since = getattr(connection, "opened_at", now)
            else:
                noted = seen.get(connection)
                since = noted[1] if noted is not None and noted[0] is after else now
            found.append((since, connection, after))
        found.sort(key=lambda entry: entry[0])
        return [(connection, after) for _, connection, after in found]

    @staticmethod
    def still_waits(connection: Any, after: object) -> bool:
        """Whether ``connection`` still waits for a head after the same answer (or none)."""
        return _waiting_since(connection) is after

    def _sweep(self) -> None:
        now = time.monotonic()
        seen: dict[Any, tuple[object, float]] = {}
        late = []
        for connection in self._connections:
            after = _waiting_since(connection)
            if after is _BUSY:
                continue
            noted = self._seen.get(connection)
            since = noted[1] if noted is not None and noted[0] is after else now
            if now - since >= self.timeout_s:
                late.append(connection)
            else:
                seen[connection] = (after, since)
        self._seen = seen
        self._timer = asyncio.get_running_loop().call_later(self.tick, self._sweep)
        for connection in late:
            self._close(connection)

    def _close(self, connection: Any) -> None:
        """Answer 408 if a head had begun, then close the connection.

        Nothing of another answer is on the wire: no request of the connection runs.
        """
        cycle = connection.cycle
        begun = connection.scope is not (None if cycle is None else cycle.scope)
        if begun:
            refuse(connection, b"HTTP/1.1 408 Request Timeout\r\n", self._answer)
        else:
            connection.transport.close()
        if self._on_close is not None:
            self._on_close("408" if begun else "closed")
