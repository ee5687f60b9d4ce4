"""The server's guards, as ASGI middleware: the bearer token and the body's limits.

* :class:`BearerAuth` asks every request for ``Authorization: Bearer <key>`` (compared in
  constant time) except ``GET /health`` and the static page at ``/`` (which holds no data
  and sends the key the user types with each of its own calls): 401 otherwise.
* :class:`BodyLimit` answers 413 when ``Content-Length`` exceeds the limit (a body within
  its declared length is read as it is: the server reads no more than it declares), and
  stops a body sent without one (chunked) as soon as it passes the limit, before the
  route has read it all. It also bounds how long a body may stall: a route waiting for
  more of a body that does not come for ``timeout_s`` (a body shorter than its
  ``Content-Length`` on a connection its client leaves open, or a client that stopped
  sending) is answered 408 and the connection closed (:class:`StalledBodies`); uvicorn
  has no such timeout of its own.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from edge_serve.outcomes import HttpRefusal

__all__ = ["DEFAULT_BODY_TIMEOUT_S", "MAX_TIMEOUT_S", "BearerAuth", "BodyLimit", "BodyTimeout",
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
    """Raised inside ``receive`` when no more of a body arrived for the timeout."""


class StalledBodies:
    """The requests waiting for more of their body, and the one timer that ends the stalled.

    :meth:`wait` runs a route's ``receive`` while noting its task and when it began to
    wait; a sweep every :attr:`tick` seconds (armed only while some request waits)
    cancels each task that has waited ``timeout_s`` or longer, and its :meth:`wait`
    raises :class:`BodyTimeout` in place of the cancellation. A request is thus answered
    between ``timeout_s`` and ``timeout_s + tick`` after the last of its body arrived.
    One timer for the whole server rather than one per ``receive``: a request whose body
    is there when the route reads it (most) pays a dictionary entry, not a timer.
    """

    def __init__(self, timeout_s: float) -> None:
        if not 0.0 < timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"body_timeout_s: must be a number of seconds > 0 and <= "
                             f"{MAX_TIMEOUT_S:g}: {timeout_s!r}")
        self.timeout_s = timeout_s
        self.tick = min(1.0, timeout_s / 4)
        self._waiting: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        """How many requests wait for more of their body now."""
        return len(self._waiting)

    async def wait(self, receive: Receive) -> Message:
        """``receive()``, or :class:`BodyTimeout` once it waited ``timeout_s``."""
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        self._waiting[task] = time.monotonic()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.tick, self._sweep)
        try:
            return await receive()
        except asyncio.CancelledError:
            if task in self._expired:
                self._expired.discard(task)
                if task.uncancel() <= cancelling:  # ours alone: not the server stopping
                    raise BodyTimeout from None
            raise
        finally:
            del self._waiting[task]

    def _sweep(self) -> None:
        self._timer = None
        stalled_since = time.monotonic() - self.timeout_s
        for task, since in self._waiting.items():
            if since <= stalled_since and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        if self._waiting:
            self._timer = asyncio.get_running_loop().call_later(self.tick, self._sweep)


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413, and those that stall with 408.

    ``timeout_s``: how long a route may wait for more of a body (:class:`StalledBodies`).
    """

    def __init__(self, app: App, max_bytes: int,
                 timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes: must be at least 1: {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes
        self.stalls = StalledBodies(timeout_s)

    def _refusal(self, size: int | str) -> HttpRefusal:
        return HttpRefusal(413, "body", f"larger than the server's limit of {self.max_bytes} "
                           "bytes (--max-body-bytes)", size, kind="BodyTooLarge")

    def _stalled(self, seen: int, declared: int | None) -> HttpRefusal:
        of = "" if declared is None else f" of the {declared} its Content-Length declares"
        return HttpRefusal(408, "body", f"no more of it arrived for {self.stalls.timeout_s:g} "
                           "s (--body-timeout): a body shorter than its Content-Length, or a "
                           "client that stopped sending", f"{seen} bytes received{of}",
                           kind="BodyTimeout", code="body_timeout",
                           headers={"Connection": "close"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with a guarded ``receive``: 413 past the limit, 408 on a stall."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
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
                await send_refusal(send, self._refusal(size))
                return
            # The server reads exactly the declared length (HTTP/1.1 framing; a request
            # that declares a length and is chunked too is refused by the server's parser)
        limit = self.max_bytes if size is None else None  # chunked: counted as it comes
        stalls = self.stalls
        seen = 0
        complete = False
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, complete
            if complete:  # only the disconnect is left to tell: no timeout
                return await receive()
            message = await stalls.wait(receive)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
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
                await send_refusal(send, self._refusal(f"more than {self.max_bytes}"))
        except BodyTimeout:
            # An answer already begun cannot carry the 408: returned without completing
            # it, the server closes the connection (no route answers before its body).
            if not started:
                await send_refusal(send, self._stalled(seen, size))
