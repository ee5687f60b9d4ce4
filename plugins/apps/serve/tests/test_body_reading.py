"""A request's body and head as the tensor route reads them: as json.loads and Starlette do.

The route reads its body straight from the ASGI ``receive`` (:func:`edge_serve.bodies.
read_body`), parses a UTF-8 JSON object body with the decoder's scanner, without
``json.loads``' search for its encoding, and reads ``Content-Type`` and ``X-Edge-Deadline``
in one pass over the head (:func:`edge_serve.bodies.loads`,
:func:`edge_serve.bodies.head_of`): what it reads, and what it refuses, stays what the
general readers give.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.requests import ClientDisconnect, Request

from edge_serve.bodies import head_of, loads, read_body
from edge_serve.outcomes import HttpRefusal


@pytest.mark.parametrize("text", [
    b'{"a": [1, 2.5, "\xc3\xa9"]}',  # UTF-8, the usual body
    '{"a": "\U0001f600"}'.encode("utf-16"),  # UTF-16 with its mark
    '{"a": 1}'.encode("utf-16-le"),  # UTF-16 without: found by its zero bytes
    b'\xef\xbb\xbf{"a": 1}',  # UTF-8 with its mark
    b'{"a": "\xed\xa0\x80"}',  # a lone surrogate in UTF-8: json.loads takes it
    b'{"a": 1}\n',  # space after the object (curl's body from a file): scanned, then decoded
    b'{"a": {"b": [true, null]}} \t\r\n',
])
def test_a_body_parses_as_json_loads_parses_it(text: bytes) -> None:
    assert loads(text, "body") == json.loads(text)


@pytest.mark.parametrize("text", [b'{"a": "\xff"}', b'{"a": ', b"{\x00}", b"{",
                                  b'{"a": 1} x', b"{} {}"])
def test_a_body_json_loads_refuses_is_400_naming_the_field(text: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(HttpRefusal) as refused:
        loads(text, "body")
    assert refused.value.status == 400 and refused.value.field == "body"


def test_the_head_gives_the_first_content_type_and_deadline_as_starlette_reads_them() -> None:
    from starlette.requests import Request

    headers = [(b"x-edge-deadline", b"2.5"), (b"content-type", b"application/json"),
               (b"content-type", b"text/plain"), (b"x-edge-deadline", b"9")]
    request = Request({"type": "http", "headers": headers})
    assert head_of(request) == (request.headers.get("content-type", ""),
                                request.headers.get("x-edge-deadline")) == \
        ("application/json", "2.5")
    assert head_of(Request({"type": "http", "headers": []})) == ("", None)


def test_refusals_read_as_json_loads_words_them() -> None:
    for text in (b'{"a": 1} x', b"{} {}", b'{"a": ', b'{"a": 1,}'):
        with pytest.raises(ValueError) as general:
            json.loads(text)
        with pytest.raises(HttpRefusal) as refused:
            loads(text, "body")
        assert refused.value.value == str(general.value), text
    with pytest.raises(HttpRefusal) as refused:  # json.loads: RecursionError
        loads(b'{"a":' + b"[" * 100_000, "body")
    assert (refused.value.status, refused.value.value) == (400, "nested too deeply for the parser")


def _messages(*messages: dict[str, Any]) -> Any:
    """An ASGI ``receive`` that hands out ``messages`` in order."""
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return receive


def _read(reader: Any, *messages: dict[str, Any]) -> Any:
    request = Request({"type": "http", "headers": []}, _messages(*messages))
    return asyncio.run(reader(request))


async def _starlette_body(request: Request) -> bytes:
    return await request.body()


@pytest.mark.parametrize("messages", [
    [{"type": "http.request", "body": b'{"a": 1}', "more_body": False}],
    [{"type": "http.request", "body": b'{"a": 1}'}],  # more_body left out: the last
    [{"type": "http.request"}],  # no body at all
    [{"type": "http.request", "body": b'{"a"', "more_body": True},
     {"type": "http.request", "body": b"", "more_body": True},
     {"type": "http.request", "body": b": 1}", "more_body": False}],
    [{"type": "http.request", "body": b'{"a": 1}', "more_body": True},
     {"type": "http.request", "body": b"", "more_body": False}],
])
def test_a_body_reads_as_starlette_reads_it(messages: list[dict[str, Any]]) -> None:
    assert _read(read_body, *messages) == _read(_starlette_body, *messages)


@pytest.mark.parametrize("messages", [
    [{"type": "http.disconnect"}],
    [{"type": "http.request", "body": b'{"a"', "more_body": True}, {"type": "http.disconnect"}],
])
def test_a_client_gone_before_its_body_ended_is_client_disconnect_as_starlette_raises_it(
        messages: list[dict[str, Any]]) -> None:
    for reader in (read_body, _starlette_body):
        with pytest.raises(ClientDisconnect):
            _read(reader, *messages)
