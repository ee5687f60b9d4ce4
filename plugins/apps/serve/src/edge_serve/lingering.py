"""A refused connection's close: its answer read by the client before the connection goes.

Closing a socket with bytes unread makes the kernel answer with a reset instead of an end
of stream, and a reset may throw away an answer the client has not read yet — a client
still sending the rest of an oversized head, the rest of a body sent too slowly or the
rest of one over the size limit, would see its connection reset and never the 431, 408
or 413 that says why. So a refused connection lingers, as common servers close one
(Apache's lingering close): its answer is followed by the end of the server's side of the
stream (``write_eof``), what still arrives is read and dropped unparsed (the protocol's
:data:`REFUSED` flag, which :mod:`edge_serve.heads`' protocol honours, calling
:func:`drop`), and the connection is closed :data:`LINGER_S` later, once more than
:data:`LINGER_BYTES` were dropped, or when the client closes first, whichever comes
first: a client that keeps sending holds the connection, and the server's reading, for a
bounded time and byte count only.

* :func:`refuse` writes a whole answer on a connection no request of which runs (a head
  refused by the server itself), then lingers.
* :func:`linger_after_answer` makes the connection of a running request linger once the
  route's answer is written (a body refused 408), where uvicorn would close it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

__all__ = ["DROPPED", "LINGER_BYTES", "LINGER_S", "REFUSED", "drop", "linger",
           "linger_after_answer", "refuse"]

LINGER_S: Final = 2.0
"""How long a refused connection is kept half-open after its answer, what the client still
sends read and dropped, before it is closed."""

LINGER_BYTES: Final = 16 * 1024 * 1024
"""The most bytes a lingering connection reads and drops: past them it is closed at once
(a client still sending then sees a reset; one that reads its answer as it arrives has
read it long before)."""

DROPPED: Final = "dropped"
"""The protocol's attribute counting the bytes dropped while its connection lingers."""

REFUSED: Final = "refused"
"""The protocol's attribute set once its connection lingers: what still arrives is dropped
(and the connection is not taken for one waiting for a request)."""


def linger(connection: Any) -> None:
    """End the server's side of ``connection`` now and close it :data:`LINGER_S` later.

    Whatever was written before is sent first. Reading goes on (resumed if uvicorn had
    paused it), and what arrives is dropped (:func:`drop`): the client is never stuck
    sending into a full window, and the close finds nothing unread for the lingering's
    length.
    """
    setattr(connection, REFUSED, True)
    transport = connection.transport
    if not transport.can_write_eof():
        transport.close()
        return
    transport.write_eof()
    flow = getattr(connection, "flow", None)
    if flow is not None:
        flow.resume_reading()
    asyncio.get_running_loop().call_later(LINGER_S, transport.close)


def drop(connection: Any, size: int) -> None:
    """``size`` bytes that arrived on the lingering ``connection``, dropped unread.

    Counted in its :data:`DROPPED` attribute; once more than :data:`LINGER_BYTES` were
    dropped the connection is closed now (its answer, written before, still goes first).
    """
    dropped = getattr(connection, DROPPED, 0) + size
    setattr(connection, DROPPED, dropped)
    if dropped > LINGER_BYTES:
        connection.transport.close()


def refuse(connection: Any, status_line: bytes, body: bytes) -> None:
    """Write a whole JSON error answer on ``connection``, then :func:`linger`.

    For a connection no request of which runs: nothing else is on the wire.
    """
    head = [status_line]
    head += [name + b": " + value + b"\r\n"
             for name, value in connection.server_state.default_headers]
    head += [b"content-type: application/json\r\n",
             b"content-length: " + str(len(body)).encode() + b"\r\n",
             b"connection: close\r\n\r\n", body]
    connection.transport.write(b"".join(head))
    linger(connection)


class _LingeringTransport:
    """The transport a request's answer is written on, whose close lingers instead."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._transport = connection.transport
        self._closed = False

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._closed or bool(self._transport.is_closing())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if not self._transport.is_closing():
                linger(self._connection)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def linger_after_answer(receive: Callable[..., Any]) -> bool:
    """Whether the connection of ``receive``'s request will linger after its answer.

    Where uvicorn would close it at once (an answer with ``Connection: close``), it
    lingers instead. ``receive`` must be uvicorn's own (the httptools protocol's request
    cycle, the middleware outside passing it on unchanged) on a connection whose protocol
    drops what arrives while it lingers; otherwise nothing changes (False) and the
    connection closes as before.

    Called on a refusal's path only (nothing is added to a request that is answered).
    """
    cycle = getattr(receive, "__self__", None)
    if not isinstance(cycle, RequestResponseCycle) or cycle.response_complete:
        return False
    connection: Any = cycle.transport.get_protocol()
    if not hasattr(connection, REFUSED) or connection.transport is not cycle.transport:
        return False
    cycle.transport = _LingeringTransport(connection)  # type: ignore[assignment]
    return True
