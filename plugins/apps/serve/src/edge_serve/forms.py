"""A file upload's multipart form, read strictly: its framing checked, its parser quiet.

Starlette's multipart parser (python-multipart underneath) keeps whatever parts it
completed when a body ends early: a body cut short before its closing boundary
(``--BOUNDARY--``) used to come back as a form without its ``file`` field, or — cut just
after a part's delimiter — as a whole form. :func:`read_form` notes whether the
parser reached the closing boundary (its ``on_end`` callback) and refuses the body with a
400 that says so (``TruncatedMultipart``) when it did not. A body the parser cannot read
at all is a 400 naming the parser's own reason (``InvalidMultipart``).

python-multipart logs each malformed body it meets on its own logger, at warning level;
with no logging configured that reaches the server's stderr, once for every bad request
a client sends. The client's fault is answered in its 400, not logged:
:func:`quiet_parser_log` drops those warnings (errors still pass).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from edge_serve.outcomes import HttpRefusal

__all__ = ["PARSER_LOGGER", "quiet_parser_log", "read_form"]

PARSER_LOGGER = "python_multipart"
"""The logger python-multipart reports malformed bodies on (its modules' parent)."""


def quiet_parser_log() -> None:
    """Drop python-multipart's warnings about malformed bodies; its errors still pass.

    A malformed body is a client's fault, answered with a 400 that names the problem.
    """
    logging.getLogger(PARSER_LOGGER).setLevel(logging.ERROR)


class _Framed(MultiPartParser):
    """Starlette's multipart parser, noting whether the body reached its closing boundary."""

    closed = False

    def on_end(self) -> None:
        """The parser met the closing boundary (``--BOUNDARY--``)."""
        self.closed = True


async def read_form(request: Request, *, max_files: int, max_fields: int) -> FormData:
    """The request's multipart form, parsed as its body arrives; the caller closes it.

    Raises:
        HttpRefusal: 400 naming ``body``: the body ended before its closing boundary
            (``TruncatedMultipart``: the bytes received are the value), or the parser
            refused it (``InvalidMultipart``: a missing boundary, a malformed part, more
            files or fields than allowed; the parser's reason is the value).
    """
    received = 0

    async def counted() -> AsyncGenerator[bytes, None]:
        nonlocal received
        async for chunk in request.stream():
            received += len(chunk)
            yield chunk

    parser = _Framed(request.headers, counted(), max_files=max_files, max_fields=max_fields)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        cause = exc.__cause__
        reason = str(cause) if isinstance(cause, FormParserError) else exc.message
        raise HttpRefusal(400, "body", "not a valid multipart form", reason,
                          kind="InvalidMultipart") from None
    if not parser.closed:
        await form.close()
        _, options = parse_options_header(request.headers.get("content-type", ""))
        boundary = options.get(b"boundary", b"").decode("latin-1")
        raise HttpRefusal(400, "body", "the multipart body ended before its closing boundary "
                          f"'--{boundary}--' (a truncated upload)",
                          f"{received} bytes received", kind="TruncatedMultipart")
    return form
