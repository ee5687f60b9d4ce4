"""The server's guards, as ASGI middleware: the bearer token and the body size limit.

* :class:`BearerAuth` asks every request for ``Authorization: Bearer <key>`` (compared in
  constant time) except ``GET /health`` and the static page at ``/`` (which holds no data
  and sends the key the user types with each of its own calls): 401 otherwise.
* :class:`BodyLimit` answers 413 when ``Content-Length`` exceeds the limit (a body within
  its declared length passes untouched: the server reads no more than it declares), and
  stops a body sent without one (chunked) as soon as it passes the limit, before the
  route has read it all.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from edge_serve.outcomes import HttpRefusal

__all__ = ["BearerAuth", "BodyLimit", "BodyTooLarge", "send_refusal"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Paths served without the bearer token.
OPEN_PATHS = frozenset({"/health", "/"})


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


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413."""

    def __init__(self, app: App, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes: must be at least 1: {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes

    def _refusal(self, size: int | str) -> HttpRefusal:
        return HttpRefusal(413, "body", f"larger than the server's limit of {self.max_bytes} "
                           "bytes (--max-body-bytes)", size, kind="BodyTooLarge")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with a counting ``receive``; answer 413 past the limit."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
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
            await self.app(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
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
