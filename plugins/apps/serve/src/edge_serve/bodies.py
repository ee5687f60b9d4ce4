"""Reading a request: its JSON body, its deadline, its pipeline; each refusal a 400/404.

The deadline comes from ``deadline_s`` in the body or the ``X-Edge-Deadline`` header (in
seconds); when both are given the smaller one holds. No route reads a query parameter:
one in the URL is refused (:func:`refuse_query`) rather than ignored.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import ClientDisconnect, Request

from edge_serve.outcomes import HttpRefusal

__all__ = ["DEADLINE_HEADER", "MAX_DEADLINE_S", "deadline_from", "deadline_of", "head_of",
           "json_body", "loads", "number", "params_of", "read_body", "refuse_query"]

DEADLINE_HEADER = "x-edge-deadline"

_decoder = json.JSONDecoder()
#: The parser ``json.loads`` uses (default options), called without its checks of a text.
_decode = _decoder.decode
#: Its scanner (an attribute its ``__init__`` sets), which ``_decode`` calls after its two
#: Python calls: one value from an index.
_scan: Callable[[str, int], tuple[Any, int]] = vars(_decoder)["scan_once"]
MAX_DEADLINE_S = 3600.0
"""The longest deadline a request may ask for, in seconds."""


def number(value: object, field: str, *, low: float, high: float) -> float:
    """A finite number in ``(low, high]``, else 400 naming the field.

    An integer too large for a float (JSON integers have no bound) is refused as well.
    """
    converted = math.nan
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        with contextlib.suppress(OverflowError):
            converted = float(value)
    if not math.isfinite(converted) or not low < converted <= high:
        raise HttpRefusal(400, field, f"must be a number in ({low}, {high}]", value,
                          kind="InvalidValue")
    return converted


def deadline_of(request: Request, body_value: object = None, *,
                form: bool = False) -> float | None:
    """The request's deadline in seconds, or None when it gives none.

    ``body_value`` is ``deadline_s`` from a JSON body (a number) or, with ``form``, a
    multipart form's field (text holding a number).
    """
    return deadline_from(request.headers.get(DEADLINE_HEADER), body_value, form=form)


def deadline_from(header: str | None, body_value: object = None, *,
                  form: bool = False) -> float | None:
    """:func:`deadline_of` for the ``X-Edge-Deadline`` header's value already read."""
    found: list[float] = []
    if header is not None:
        found.append(number(_decimal(header), "headers.x-edge-deadline", low=0.0,
                            high=MAX_DEADLINE_S))
    if body_value is not None:
        if form and isinstance(body_value, str):  # a multipart form field
            body_value = _decimal(body_value)
        found.append(number(body_value, "deadline_s", low=0.0, high=MAX_DEADLINE_S))
    return min(found) if found else None


def head_of(request: Request) -> tuple[str, str | None]:
    """The request's ``Content-Type`` ('' without one) and ``X-Edge-Deadline`` (None).

    The first of each, as ``request.headers.get`` reads them: the head made a dictionary
    in C, from its last header to its first (the first of a name is the one kept).
    """
    found = dict(reversed(tuple(request.scope["headers"])))
    content_type = found.get(b"content-type")
    deadline = found.get(b"x-edge-deadline")
    return ("" if content_type is None else content_type.decode("latin-1"),
            None if deadline is None else deadline.decode("latin-1"))


def _decimal(text: str) -> object:
    """``text`` as a float when it is a decimal number (``2.5``, ``1e1``), else ``text``.

    Python's ``float`` also reads ``1_0`` (10) and surrounding spaces: not a number here.
    """
    if "_" in text or text != text.strip():
        return text
    try:
        return float(text)
    except ValueError:
        return text


def refuse_query(request: Request) -> None:
    """Refuse (400, ``unsupported_parameter``) a query string: no route reads one.

    The first parameter is named as ``query.NAME`` with its value; a query string that
    holds no ``name=value`` pair (``?&``) is refused as ``query`` with its text.
    """
    raw = request.scope.get("query_string", b"")
    if not raw:  # every request pays this check: the query is parsed only when there is one
        return
    for name, value in request.query_params.multi_items():
        raise HttpRefusal(400, f"query.{name}", "not served (no route of this server reads a "
                          "query parameter)", value, kind="UnsupportedParameter",
                          code="unsupported_parameter")
    raise HttpRefusal(400, "query", "not served (no route of this server reads a query "
                      "string)", raw.decode("latin-1"), kind="UnsupportedParameter",
                      code="unsupported_parameter")


def loads(text: str | bytes, field: str, *, reason: str = "not valid JSON",
          shown: object = None, code: str = "invalid_json") -> Any:
    """``text`` parsed as JSON, else 400 naming ``field`` (``kind: "InvalidJSON"``).

    Every way the parser refuses a text is the client's fault, not only a syntax error:
    bytes that are not UTF-8, an integer of more digits than Python converts (4300), and
    arrays or objects nested deeper than the parser recurses (``RecursionError``). The
    value shown is ``shown``, else the parser's own reason.
    """
    try:
        # JSON text in UTF-8 that opens an object (a request body): decoded as json.loads
        # decodes bytes it finds UTF-8, without its search for the encoding
        if type(text) is bytes and text[:1] == b"{" and len(text) > 1 and text[1]:
            decoded = text.decode("utf-8", "surrogatepass")
            try:  # the object scanned from its first character, as _decode scans it
                value, end = _scan(decoded, 0)
            except StopIteration:  # no value there: _decode's error says so
                end = -1
            if end == len(decoded):
                return value
            return _decode(decoded)  # space after it, or more: _decode's answer or error
        return json.loads(text)
    except RecursionError:
        problem = "nested too deeply for the parser"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        problem = str(exc)
    raise HttpRefusal(400, field, reason, problem if shown is None else shown,
                      kind="InvalidJSON", code=code)


async def read_body(request: Request) -> bytes:
    """The request's whole body, read once from its ASGI ``receive``.

    What ``Request.body()`` reads, and ``ClientDisconnect`` where it would raise it (an
    ``http.disconnect`` before the body ended), without its stream generator and its
    closing: a body that came in one message (a small request's) is returned as it came.
    The body is not kept on ``request``: a route calls this once, and reads nothing more
    of the body after it.
    """
    receive = request.receive
    chunks: list[bytes] = []
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            body = message.get("body", b"")
            if not message.get("more_body", False):
                if not chunks:
                    return bytes(body)
                chunks.append(body)
                return b"".join(chunks)
            chunks.append(body)
        elif kind == "http.disconnect":
            raise ClientDisconnect()


async def json_body(request: Request, known: frozenset[str],
                    content_type: str | None = None) -> dict[str, Any]:
    """The body as a JSON object whose keys are all in ``known``.

    ``content_type``: the request's ``Content-Type`` where the caller has read it already.
    """
    if content_type is None:
        content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise HttpRefusal(400, "headers.content-type", "must be application/json (or "
                          "multipart/form-data with a file where the pipeline has prepare)",
                          content_type or None, kind="InvalidValue")
    body = loads(await read_body(request), "body")
    if not isinstance(body, dict):
        raise HttpRefusal(400, "body", "must be a JSON object", type(body).__name__,
                          kind="InvalidJSON", code="invalid_json")
    if not body.keys() <= known:
        unknown = sorted(body.keys() - known)
        raise HttpRefusal(400, unknown[0], f"not served (served: {', '.join(sorted(known))})",
                          body[unknown[0]], kind="UnsupportedParameter",
                          code="unsupported_parameter")
    return body


def params_of(value: object, field: str = "params") -> Mapping[str, Any] | None:
    """Request parameters for the final stage: an object, or a JSON object as text."""
    if value is None:
        return None
    if isinstance(value, str):
        value = loads(value, field, reason="not a JSON object", shown=value,
                      code="invalid_value")
    if not isinstance(value, dict):
        raise HttpRefusal(400, field, "must be an object", value, kind="InvalidValue")
    return value
