"""The connection cap: at most N connections open, counted where they are accepted.

Every connection holds one of the process's file descriptors, and one that uploads a file
over 1 MiB a second one while its body arrives (Starlette spools it to a temporary file).
Without a cap, more connections than the open-file limit, opened within one header
timeout, filled the server: ``accept()`` failed with ``EMFILE``, asyncio logged it and
stopped accepting for a second at a time, and ``/health`` and real requests timed out
until the header timeout cut the connections. :class:`CappedListener`, the listening
socket, counts each connection it accepts (:class:`ConnectionCap`) until its socket is
closed, and at the cap it makes room or refuses, before asyncio builds anything for the
connection:

* room is made by closing the connection that has waited longest for a request head
  (:meth:`~edge_serve.heads.SlowHeads.waiting`: no request of it running; an idle
  kept-alive connection, one that never sent anything, or a slow head), so idle
  connections do not keep out a client about to send its request (it would have to be
  the longest waiting of all); an HTTP client takes the close of an idle kept-alive
  connection as it takes uvicorn's keep-alive timeout's, and opens another;
* when none waits for a head, room is made by cutting the request whose body has been
  behind longest (:meth:`~edge_serve.guards.StalledBodies.behind`: more than
  :data:`~edge_serve.guards.BEHIND_S` behind ``--body-min-rate`` counted from its head,
  or nothing received for as long): it is answered 408 and its connection lingers, as a
  body too slow's, and is aborted :data:`EVICTED_BODY_CLOSED_S` after at the latest. A
  head and a byte held a place for ``--body-timeout`` seconds before; now, at the cap,
  for :data:`~edge_serve.guards.BEHIND_S`. A request whose body is read (running its
  pipeline, or waiting for admission) is never cut, nor one whose body keeps to the rate;
* when every connection has a request running whose body is read or not behind (or is
  being closed), the new one is refused: accepted and closed at once. Not answered 503:
  an answer has to wait for the request to be read (one written first and followed by
  the close is lost to the reset a close with bytes unread sends, as
  :mod:`edge_serve.heads` notes), and holding the connection that long would spend the
  very file descriptor the cap protects.

A closed connection's descriptor is released on the loop's next turn, so while
:data:`EVICTING_AT_ONCE` evictions are still closing the listener accepts nothing more
(the kernel keeps the rest in the listen queue): the process holds at most the cap plus
that many connections. Before it refuses a connection, the listener also lets the loop
turn a few times (:data:`WAIT_TURNS`, counted again whenever a connection is set up or
closed): connections just accepted are set up in the next turns (then they can be closed
to make room), and those whose ends were read in the same turn (clients that all closed
at once) are closed there, freeing their places. The request path pays nothing: one
count per connection opened and closed (and a body's wait notes the ``receive`` it waits
in beside what it noted for the body's timeouts, no call).

:func:`connection_room` is how many connections an open-file limit holds:
:data:`FILES_PER_CONNECTION` each, after the files the server holds and those it keeps
spare.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import socket
import time
import weakref
from typing import TYPE_CHECKING, Any, Final

from edge_serve.lingering import LINGER_S

if TYPE_CHECKING:
    from edge_serve.guards import StalledBodies
    from edge_serve.heads import SlowHeads

__all__ = ["ADMIT", "EVICT", "EVICTED_BODY_CLOSED_S", "EVICTING_AT_ONCE",
           "FILES_PER_CONNECTION", "LISTING_SPACING_S", "REFUSE", "REFUSED_AT_ONCE",
           "SPARE_FILES", "WAIT", "WAIT_TURNS", "CappedListener", "ConnectionCap",
           "connection_room"]

FILES_PER_CONNECTION: Final = 2
"""File descriptors a connection may hold: its socket, and the temporary file an upload
over 1 MiB is spooled to while its body arrives."""

SPARE_FILES: Final = 64
"""File descriptors kept free beside the connections' (and beside one for each request
thread, which may write an upload for ``prepare``): for the server's own use while it
serves (a restarted stage's channels, a log file, evictions still closing)."""

EVICTING_AT_ONCE: Final = 16
"""Evicted connections whose descriptors may still be closing before the listener waits."""

ADMIT: Final = "admit"
"""A :meth:`ConnectionCap.verdict`: under the cap."""

EVICT: Final = "evict"
"""A :meth:`ConnectionCap.verdict`: at the cap, a connection to close (waiting for a head,
or reading a body that is behind)."""

WAIT: Final = "wait"
"""A :meth:`ConnectionCap.verdict`: accept nothing before the loop's next turn."""

REFUSE: Final = "refuse"
"""A :meth:`ConnectionCap.verdict`: accept the connection and close it at once."""

WAIT_TURNS: Final = 3
"""Turns of the event loop the listener waits in a row, at the cap with no connection to
close, in which no connection was set up or closed, before it refuses connections."""

EVICTED_BODY_CLOSED_S: Final = LINGER_S + 1.0
"""Seconds after which the connection of a body cut to make room is aborted, if its 408
and lingering (:data:`~edge_serve.lingering.LINGER_S`) have not closed it yet: an
eviction always ends in a closed descriptor."""

LISTING_SPACING_S: Final = 10e-6
"""Seconds kept between two listings of the connections, for each connection open: a
listing looks at every connection, so however often the cap is reached, listings take a
bounded share of the loop's time (32768 connections: one listing in 0.33 s at most)."""

REFUSED_AT_ONCE: Final = 64
"""Connections refused in one call of :meth:`CappedListener.accept` before it yields to
the event loop's other work (the rest wait in the listen queue)."""


def connection_room(files: int, in_use: int, spare: int) -> int:
    """How many connections ``files`` open files hold, ``in_use`` held, ``spare`` kept free.

    :data:`FILES_PER_CONNECTION` each; below 1 when none fits.
    """
    return (files - in_use - spare) // FILES_PER_CONNECTION


class ConnectionCap:
    """At most ``limit`` connections: their count, and what was refused and evicted.

    ``heads`` names the connections waiting for a request head, the longest waiting
    first; ``bodies``, when given, the requests reading a body that is behind, the
    longest behind first: the ones that may be closed to make room, those waiting for a
    head before any body (closing one of them costs no request). Used on the event
    loop's thread only.

    Attributes:
        limit: The most connections open at once (``--max-connections``).
        open: Connections accepted whose sockets are not closed yet (evicted ones still
            closing included).
        refused: Connections closed at once because every connection was busy.
        evicted: Connections closed to make room for a new one: idle ones (waiting for a
            head), and those whose body was behind (answered 408).
    """

    def __init__(self, limit: int, heads: SlowHeads,
                 bodies: StalledBodies | None = None) -> None:
        if limit < 1:
            raise ValueError(f"max_connections: must be at least 1: {limit!r}")
        self.limit = limit
        self.open = 0
        self.refused = 0
        self.evicted = 0
        self._heads = heads
        self._bodies = bodies
        self._evicting: set[int] = set()
        # (connection, what it waits after, False) weakly held, the longest waiting last,
        # after (request task, None, True) of the bodies behind, the longest behind last:
        # a list left over keeps no closed connection nor ended request alive
        self._candidates: list[tuple[weakref.ref[Any], weakref.ref[Any] | None, bool]] = []
        self._listed_at = -math.inf
        self._listed_found = True  # the last listing found a connection to close
        self._listed_size = 0  # how many connections were open at the last listing
        self._waited: tuple[int, int] | None = None  # (open, set up) at the last WAIT
        self._waits = 0  # turns waited since connections last opened or closed

    def verdict(self) -> str:
        """What to do with the next connection, before it is accepted.

        :data:`ADMIT` under the cap. At it: :data:`WAIT` while :data:`EVICTING_AT_ONCE`
        evicted connections are still closing; :data:`EVICT` when a connection waits for
        a head or reads a body that is behind (:meth:`admit` closes it); else
        :data:`WAIT` for the loop's next turn, at most :data:`WAIT_TURNS` turns in a row
        in which no connection was set up or closed (connections just accepted are set
        up two turns later, and those whose ends were read are closed in the next: both
        may make room); else :data:`REFUSE`. The listener, still readable, thus never
        spins.
        """
        if self.open - len(self._evicting) < self.limit:
            return ADMIT
        if len(self._evicting) >= EVICTING_AT_ONCE:
            return WAIT
        if self._victim() is not None:
            return EVICT
        state = (self.open, len(self._heads.connections))
        if self._waited != state:
            self._waited = state
            self._waits = 0
        if self._waits < WAIT_TURNS:
            self._waits += 1
            return WAIT
        return REFUSE

    def admit(self, verdict: str) -> None:
        """Count one more connection, accepted on ``verdict`` (:data:`ADMIT`, :data:`EVICT`).

        On :data:`EVICT` the connection that has waited longest for a head is closed, or
        when none waits, the request whose body has been behind longest is cut (408,
        lingering; aborted :data:`EVICTED_BODY_CLOSED_S` later if still open).
        """
        if verdict == EVICT:
            victim_ref, _, body = self._candidates.pop()
            victim: Any = victim_ref()  # alive: verdict() just found it
            if body:
                assert self._bodies is not None
                transport = self._bodies.evict(victim)
                asyncio.get_running_loop().call_later(EVICTED_BODY_CLOSED_S, transport.abort)
            else:
                transport = victim.transport
            self._evicting.add(transport.get_extra_info("socket").fileno())
            if not body:
                transport.abort()  # idle: nothing of an answer is lost
            self.evicted += 1
        self.open += 1

    def closed(self, fd: int) -> None:
        """The socket of an accepted connection, descriptor ``fd``, is being closed."""
        self.open -= 1
        self._evicting.discard(fd)

    def _victim(self) -> Any:
        """The connection to close for a new one, or the request to cut; None if none.

        The connection that has waited longest for a head, still waiting; else the
        request whose body has been behind longest, still behind. Left last on the
        candidates' list, for :meth:`admit`. When that list is used up the connections
        are listed again (:meth:`_may_list`).
        """
        heads = self._heads
        bodies = self._bodies
        now = time.monotonic()
        while True:
            while self._candidates:
                ref, after_ref, body = self._candidates[-1]
                found = ref()
                if found is not None:
                    if body:
                        if bodies is not None and bodies.still_behind(found, now):
                            return found
                    else:
                        after = None if after_ref is None else after_ref()
                        if (after_ref is None or after is not None) \
                                and heads.still_waits(found, after):
                            return found
                self._candidates.pop()
            if not self._may_list(now):
                return None
            self._listed_at = now
            self._listed_size = len(heads.connections)
            candidates: list[tuple[weakref.ref[Any], weakref.ref[Any] | None, bool]] = []
            if bodies is not None:
                candidates += [(weakref.ref(task), None, True)
                               for task in reversed(bodies.behind(now))]
            candidates += [(weakref.ref(connection), None if after is None
                            else weakref.ref(after), False)
                           for connection, after in reversed(heads.waiting())]
            self._candidates = candidates
            self._listed_found = bool(candidates)
            if not candidates:
                return None

    def _may_list(self, now: float) -> bool:
        """Whether the connections may be listed again now.

        A listing looks at every connection, so listings are kept :data:`LISTING_SPACING_S`
        a connection apart; after one that found none waiting (every connection busy),
        only once connections have opened or closed since, or a sweep tick has passed (a
        request may have ended meanwhile).
        """
        size = len(self._heads.connections)
        elapsed = now - self._listed_at
        if elapsed < size * LISTING_SPACING_S:
            return False
        return (self._listed_found or size != self._listed_size
                or elapsed >= self._heads.tick)


class _Accepted(socket.socket):
    """An accepted connection's socket, counted by its cap until it is closed."""

    __slots__ = ("cap",)

    cap: ConnectionCap | None

    def close(self) -> None:
        """Close the socket; its cap counts it closed (once)."""
        self._release()
        super().close()

    def _release(self) -> None:
        cap = getattr(self, "cap", None)
        if cap is not None:
            self.cap = None
            cap.closed(self.fileno())

    def __del__(self) -> None:  # never closed (the socket's finalizer closes it): counted
        self._release()
        super().__del__()  # type: ignore[misc]  # the socket finalizer: closes the fd


class CappedListener(socket.socket):
    """A listening socket whose :meth:`accept` keeps to a :class:`ConnectionCap`.

    asyncio's selector loop calls ``accept()`` while the socket is readable; this one
    asks the cap first (:meth:`ConnectionCap.verdict`): it lets the connection in
    (closing an idle one to make room at the cap), or refuses it by closing it at once,
    or raises ``BlockingIOError`` (as when nothing waits) to accept nothing before the
    loop's next turn. Until :attr:`cap` is set it accepts as any socket does.
    """

    __slots__ = ("cap",)

    cap: ConnectionCap | None

    def accept(self) -> tuple[socket.socket, Any]:
        """The next connection let in, with its address (refused ones closed meanwhile)."""
        cap = getattr(self, "cap", None)
        if cap is None:
            return super().accept()
        for _ in range(REFUSED_AT_ONCE):
            verdict = cap.verdict()
            if verdict == WAIT:
                raise BlockingIOError(errno.EAGAIN, "connections are still closing")
            fd, address = self._accept()  # type: ignore[attr-defined]  # _socket.socket's
            if verdict == REFUSE:
                os.close(fd)
                cap.refused += 1
                continue
            sock = _Accepted(self.family, self.type, self.proto, fileno=fd)
            cap.admit(verdict)
            sock.cap = cap
            if socket.getdefaulttimeout() is None and self.gettimeout():
                sock.setblocking(True)
            return sock, address
        raise BlockingIOError(errno.EAGAIN, f"refused {REFUSED_AT_ONCE} connections at once")
