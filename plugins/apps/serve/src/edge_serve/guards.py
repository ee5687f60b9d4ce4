"""The server's guards, as ASGI middleware: the bearer token and the body's limits.

* :class:`BearerAuth` asks every request for ``Authorization: Bearer <key>`` (compared in
  constant time) except ``GET /health`` and the static page at ``/`` (which holds no data
  and sends the key the user types with each of its own calls): 401 otherwise.
* :class:`BodyLimit` answers 413 when ``Content-Length`` exceeds the limit (a body within
  its declared length is read as it is: the server reads no more than it declares), and
  stops a body sent without one (chunked) as soon as it passes the limit, before the
  route has read it all; either 413 closes the connection after lingering
  (:mod:`edge_serve.lingering`: what the client still sends is dropped for a bounded
  time and byte count, where a kept-alive connection read it until the header timeout
  cut it). It also bounds how long a body may take, in two ways
  (:class:`StalledBodies`), each answered 408 with the connection closed after lingering
  (:mod:`edge_serve.lingering`); uvicorn has no such timeout of its own:

  - a stall: a route waiting for more of a body that does not come for ``timeout_s``
    (a body shorter than its ``Content-Length`` on a connection its client leaves open,
    or a client that stopped sending);
  - a body too slow: one still incomplete ``timeout_s`` after the request's head, plus
    one second for each ``min_rate`` bytes received — a minimum data rate after a grace
    period, as Apache's ``mod_reqtimeout`` has (``body=20,MinRate=500``). Without it a
    client that sent a byte just within each ``timeout_s`` held its request and its
    connection for as long as it liked (a slow-body attack, "R-U-Dead-Yet"); with it, to
    hold a connection for ``T`` seconds past the grace period costs ``min_rate * T``
    bytes sent, and at most ``--max-body-bytes`` in all. A deadline scaled by the
    declared ``Content-Length`` was not chosen: a client declaring the largest body and
    sending next to nothing would hold its connection for that whole deadline for free.

  And at the connection cap (:mod:`edge_serve.connections`), when no connection waits for
  a head, a body :data:`BEHIND_S` behind the rate counted from its head (or that has
  received nothing for as long) is cut at once to make room for a new connection
  (``"evicted"``, answered as a body too slow): within its first ``timeout_s`` a head
  and a byte no longer hold a place that a new client needs.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from edge_serve.lingering import linger_after_answer
from edge_serve.outcomes import HttpRefusal

__all__ = ["BEHIND_S", "DEFAULT_BODY_MIN_RATE", "DEFAULT_BODY_TIMEOUT_S", "EVICTED",
           "MAX_BODY_MIN_RATE", "MAX_TIMEOUT_S", "BearerAuth", "BodyLimit", "BodyTimeout",
           "BodyTooLarge", "StalledBodies", "send_refusal"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Paths served without the bearer token.
OPEN_PATHS = frozenset({"/health", "/"})

DEFAULT_BODY_TIMEOUT_S = 30.0
"""How long, in seconds, a route waits for more of a request's body before answering 408
(``edge serve --body-timeout``'s default): counted from each wait for more of it, so a
large body that keeps arriving is never cut, while one that stops is not held for ever."""

DEFAULT_BODY_MIN_RATE = 500
"""The slowest a request's body may arrive, in bytes a second, once its first
``--body-timeout`` seconds have passed (``edge serve --body-min-rate``'s default): a body
has the body timeout, and one second more for each this many bytes received. Apache's
``mod_reqtimeout`` default (``MinRate=500``): 4 kbit/s, under a single GSM/GPRS time
slot's uplink (about 9 kbit/s), so no working link is cut, whatever the body's size; a
client at this rate sends the default 32 MiB ``--max-body-bytes`` in about 19 hours."""

MAX_BODY_MIN_RATE = 2**30
"""The highest ``--body-min-rate``, in bytes a second (1 GiB/s): a typo of a few digits
is refused by name instead of cutting every upload."""

BEHIND_S = 2.0
"""How long, in seconds, a body may be behind ``--body-min-rate`` (counted from its
head), or receive nothing, before its connection may be closed to make room at the
connection cap (:meth:`StalledBodies.behind`)."""

EVICTED = "evicted"
"""The :class:`BodyTimeout` reason of a body whose connection was closed to make room at
the connection cap (:meth:`StalledBodies.evict`)."""

MAX_TIMEOUT_S = 3600.0
"""The longest ``--body-timeout`` and ``--header-timeout``, in seconds (an hour): a typo of
a few digits is refused by name instead of leaving slow clients unbounded in effect."""


async def send_refusal(send: Send, refusal: HttpRefusal) -> None:
    """Send a refusal as a complete JSON response."""
    body = refusal.body()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in refusal.headers.items()]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """Require ``Authorization: Bearer <api_key>`` on every route but the open ones."""

    def __init__(self, app: App, api_key: str) -> None:
        if not api_key:
            raise ValueError("api_key: must not be empty: ''")
        self.app = app
        self._expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an authorised (or open) request on; answer 401 otherwise."""
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = given.strip().partition(b" ")
        # the scheme's name is case-insensitive (RFC 9110 11.1); the token is compared whole
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(),
                                                                  self._expected):
            reason = "missing" if not given else "does not match"
            await send_refusal(send, HttpRefusal(
                401, "headers.authorization", f"a bearer token is required and {reason}",
                kind="Unauthorized", headers={"WWW-Authenticate": "Bearer"}))
            return
        await self.app(scope, receive, send)


class BodyTooLarge(Exception):
    """Raised inside ``receive`` when a body passes the limit."""


class BodyTimeout(Exception):
    """Raised inside ``receive`` when a body took too long.

    ``reason``: ``"stalled"`` when no more of it arrived for the body timeout, ``"slow"``
    when it arrived slower than the minimum rate allows.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StalledBodies:
    """The requests waiting for more of their body, and the one timer that ends the late.

    :meth:`wait` runs a route's ``receive`` while noting its task, when it began to wait,
    its body's deadline (``until``: the request's own, moved on by each read) and the
    ``receive`` itself; a sweep every :attr:`tick` seconds (armed only while some request
    waits) cancels each task that has waited ``timeout_s`` or longer (stalled) or is past
    its deadline (slow), and its :meth:`wait` raises :class:`BodyTimeout` in place of the
    cancellation; a wait that begins past its deadline raises it at once. A request is
    thus answered at most :attr:`tick` after either bound passed. One timer for the whole
    server rather than one per ``receive``: a request whose body is there when the route
    reads it (most) pays a dictionary entry and a comparison, not a timer.

    ``min_rate`` (bytes a second, at least 1) is the rate :class:`BodyLimit` moves a
    deadline on by: :attr:`per_byte` seconds for each byte received.

    The same notes tell the connection cap (:mod:`edge_serve.connections`) which
    connections reading a body it may close for a new one when none waits for a head:
    :meth:`behind` lists the waits :data:`BEHIND_S` behind, and :meth:`evict` ends one
    as the sweep ends a late one (reason ``"evicted"``). Nothing is added to a wait for
    it (the ``receive`` noted is what finds its connection, and only then).
    """

    def __init__(self, timeout_s: float, min_rate: int = DEFAULT_BODY_MIN_RATE) -> None:
        if not 0.0 < timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"body_timeout_s: must be a number of seconds > 0 and <= "
                             f"{MAX_TIMEOUT_S:g}: {timeout_s!r}")
        if isinstance(min_rate, bool) or not isinstance(min_rate, int) \
                or not 1 <= min_rate <= MAX_BODY_MIN_RATE:
            raise ValueError(f"body_min_rate: must be a whole number of bytes a second from 1 "
                             f"to {MAX_BODY_MIN_RATE}: {min_rate!r}")
        self.timeout_s = timeout_s
        self.min_rate = min_rate
        self.per_byte = 1.0 / min_rate
        self.tick = min(1.0, timeout_s / 4)
        # task -> (when its wait began, its body's deadline, the receive it waits in)
        self._waiting: dict[asyncio.Task[Any], tuple[float, float, Receive]] = {}
        self._expired: dict[asyncio.Task[Any], str] = {}
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        """How many requests wait for more of their body now."""
        return len(self._waiting)

    async def wait(self, receive: Receive, until: float) -> Message:
        """``receive()``, or :class:`BodyTimeout` once it is late (or evicted).

        Late: it waited ``timeout_s`` (``"stalled"``), or ``time.monotonic()`` passed
        ``until`` (``"slow"``), before the wait or during it. Evicted (``"evicted"``):
        :meth:`evict` ended it.
        """
        task = asyncio.current_task()
        assert task is not None
        now = time.monotonic()
        if now >= until:
            raise BodyTimeout("slow")
        cancelling = task.cancelling()
        self._waiting[task] = (now, until, receive)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.tick, self._sweep)
        try:
            return await receive()
        except asyncio.CancelledError:
            reason = self._expired.pop(task, None)
            # ours alone: not the server stopping
            if reason is not None and task.uncancel() <= cancelling:
                raise BodyTimeout(reason) from None
            raise
        finally:
            del self._waiting[task]

    def behind(self, now: float) -> list[asyncio.Task[Any]]:
        """The requests whose body is behind at ``now``, the longest behind first.

        Behind: the wait has received nothing for :data:`BEHIND_S` seconds, or the body is
        more than :data:`BEHIND_S` seconds behind ``min_rate`` counted from the request's
        head (fewer than ``min_rate * (now - head - BEHIND_S)`` bytes received). Longest
        behind: the earliest of the two moments it began to be so. Only requests whose
        connection :meth:`evict` can find (a uvicorn request's), none already being cut.
        Looks at every waiting request: for the cap, which lists no more often than its
        own bound allows.
        """
        found = []
        for task, entry in self._waiting.items():
            since = self._behind_since(entry)
            if since + BEHIND_S <= now and task not in self._expired \
                    and _transport_of(entry[2]) is not None:
                found.append((since, task))
        found.sort(key=lambda item: item[0])
        return [task for _, task in found]

    def still_behind(self, task: asyncio.Task[Any], now: float) -> bool:
        """Whether ``task`` still waits for its body and is behind at ``now`` (not cut)."""
        entry = self._waiting.get(task)
        return entry is not None and task not in self._expired \
            and self._behind_since(entry) + BEHIND_S <= now

    def evict(self, task: asyncio.Task[Any]) -> Any:
        """End ``task``'s wait as a late one's: :class:`BodyTimeout` ``"evicted"``.

        ``task`` is one :meth:`still_behind` just found. Its request is answered 408 and
        its connection lingers, as a body too slow's; what is returned is the transport
        of that connection, for the cap to count until it is closed.
        """
        self._expired[task] = EVICTED
        task.cancel()
        return _transport_of(self._waiting[task][2])

    def _behind_since(self, entry: tuple[float, float, Receive]) -> float:
        """Since when a wait has been behind (less :data:`BEHIND_S`).

        The earlier of its beginning and the moment its body's bytes stopped covering the
        time since the head at ``min_rate``.
        """
        since, until, _ = entry
        return min(since, until - self.timeout_s)  # until: head + timeout_s + bytes/rate

    def _sweep(self) -> None:
        self._timer = None
        now = time.monotonic()
        stalled_since = now - self.timeout_s
        for task, (since, until, _) in self._waiting.items():
            if task in self._expired:
                continue
            if since <= stalled_since:
                self._expired[task] = "stalled"
            elif until <= now:
                self._expired[task] = "slow"
            else:
                continue
            task.cancel()
        if self._waiting:
            self._timer = asyncio.get_running_loop().call_later(self.tick, self._sweep)


def _transport_of(receive: Receive) -> Any:
    """The transport of the connection ``receive`` reads from; None if not found.

    uvicorn's ``receive`` is a method of its request cycle, which holds the transport.
    """
    return getattr(getattr(receive, "__self__", None), "transport", None)


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413, and those that take too long 408.

    ``timeout_s``: how long a route may wait for more of a body; ``min_rate``: how slowly
    a body may arrive after its first ``timeout_s`` seconds, in bytes a second (a body has
    ``timeout_s`` from the request's head, and one second more for each ``min_rate`` bytes
    received); see :class:`StalledBodies`. ``stalls``, when given, is the
    :class:`StalledBodies` to keep the waits in (one the connection cap reads too; it
    then holds the timeout and the rate). ``on_timeout`` is told of each body cut, by its
    reason (``"stalled"``, ``"slow"`` or ``"evicted"``).

    Both refusals end the connection (``Connection: close``), after lingering
    (:mod:`edge_serve.lingering`): the client may still be sending the body, and what it
    sends after the answer is read and dropped for a bounded time and byte count only.
    """

    def __init__(self, app: App, max_bytes: int,
                 timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
                 min_rate: int = DEFAULT_BODY_MIN_RATE,
                 on_timeout: Callable[[str], None] | None = None,
                 stalls: StalledBodies | None = None) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes: must be at least 1: {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes
        self.stalls = StalledBodies(timeout_s, min_rate) if stalls is None else stalls
        self.on_timeout = on_timeout

    def _refusal(self, size: int | str) -> HttpRefusal:
        return HttpRefusal(413, "body", f"larger than the server's limit of {self.max_bytes} "
                           "bytes (--max-body-bytes)", size, kind="BodyTooLarge",
                           headers={"Connection": "close"})

    def _late(self, reason: str, seen: int, declared: int | None,
              took_s: float) -> HttpRefusal:
        of = "" if declared is None else f" of the {declared} its Content-Length declares"
        stalls = self.stalls
        if reason == EVICTED:
            return HttpRefusal(408, "body", f"more than {BEHIND_S:g} s behind "
                               f"{stalls.min_rate} bytes a second counted from the head, or "
                               f"nothing received for {BEHIND_S:g} s, while the server held "
                               "its most connections (--body-min-rate, --max-connections): "
                               "closed to make room for another",
                               f"{seen} bytes received{of} in {took_s:.1f} s",
                               kind="BodyTooSlow", code="body_timeout",
                               headers={"Connection": "close"})
        if reason == "slow":
            return HttpRefusal(408, "body", f"not complete within {stalls.timeout_s:g} s and "
                               f"one second more for each {stalls.min_rate} bytes received "
                               "(--body-timeout, --body-min-rate): a client sending too "
                               f"slowly", f"{seen} bytes received{of} in {took_s:.1f} s",
                               kind="BodyTooSlow", code="body_timeout",
                               headers={"Connection": "close"})
        return HttpRefusal(408, "body", f"no more of it arrived for {stalls.timeout_s:g} "
                           "s (--body-timeout): a body shorter than its Content-Length, or a "
                           "client that stopped sending", f"{seen} bytes received{of}",
                           kind="BodyTimeout", code="body_timeout",
                           headers={"Connection": "close"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with a guarded ``receive``: 413 past the limit, 408 when late."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # the first (a dictionary made from the last header to the first keeps the first)
        declared: bytes | None = dict(reversed(tuple(scope["headers"]))).get(b"content-length")
        size: int | None = None
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                # uvicorn's parser refuses such a request itself; another ASGI server may not
                await send_refusal(send, HttpRefusal(400, "headers.content-length",
                                                     "not an integer",
                                                     declared.decode("latin-1"),
                                                     kind="InvalidValue"))
                return
            if size > self.max_bytes:
                linger_after_answer(receive)  # the client may be sending the body already
                await send_refusal(send, self._refusal(size))
                return
            # The server reads exactly the declared length (HTTP/1.1 framing; a request
            # that declares a length and is chunked too is refused by the server's parser)
        limit = self.max_bytes if size is None else None  # chunked: counted as it comes
        stalls = self.stalls
        per_byte = stalls.per_byte
        seen = 0
        complete = False
        started = False
        began = 0.0  # when the route first waited for the body (the head's end)
        until = 0.0  # the body's deadline: began + timeout_s + per_byte * seen

        async def limited_receive() -> Message:
            nonlocal seen, complete, began, until
            if complete:  # only the disconnect is left to tell: no timeout
                return await receive()
            if not until:
                began = time.monotonic()
                until = began + stalls.timeout_s
            message = await stalls.wait(receive, until)
            if message["type"] == "http.request":
                received = len(message.get("body", b""))
                seen += received
                until += received * per_byte
                complete = not message.get("more_body", False)
                if limit is not None and seen > limit:
                    raise BodyTooLarge
            else:
                complete = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                # the client is still sending: what it sends after the answer is dropped
                # while the connection lingers (bounded), not read until a header timeout
                linger_after_answer(receive)
                await send_refusal(send, self._refusal(f"more than {self.max_bytes}"))
        except BodyTimeout as late:
            if self.on_timeout is not None:
                self.on_timeout(late.reason)
            # An answer already begun cannot carry the 408: returned without completing
            # it, the server closes the connection (no route answers before its body).
            if not started:
                # the client may still be sending: its connection lingers after the
                # answer, so that the close does not reset it before the 408 is read
                linger_after_answer(receive)
                await send_refusal(send, self._late(late.reason, seen, size,
                                                    time.monotonic() - began))
