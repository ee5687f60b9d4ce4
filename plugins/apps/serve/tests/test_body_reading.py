"""A request's body and head as the tensor route reads them: as json.loads and Starlette do.

The route parses a UTF-8 JSON object body without ``json.loads``' search for its
encoding, and reads ``Content-Type`` and ``X-Edge-Deadline`` in one pass over the head
(:func:`edge_serve.bodies.loads`, :func:`edge_serve.bodies.head_of`): what it reads, and
what it refuses, stays what the general readers give.
"""

from __future__ import annotations

import json

import pytest

from edge_serve.bodies import head_of, loads
from edge_serve.outcomes import HttpRefusal


@pytest.mark.parametrize("text", [
    b'{"a": [1, 2.5, "\xc3\xa9"]}',  # UTF-8, the usual body
    '{"a": "\U0001f600"}'.encode("utf-16"),  # UTF-16 with its mark
    '{"a": 1}'.encode("utf-16-le"),  # UTF-16 without: found by its zero bytes
    b'\xef\xbb\xbf{"a": 1}',  # UTF-8 with its mark
    b'{"a": "\xed\xa0\x80"}',  # a lone surrogate in UTF-8: json.loads takes it
])
def test_a_body_parses_as_json_loads_parses_it(text: bytes) -> None:
    assert loads(text, "body") == json.loads(text)


@pytest.mark.parametrize("text", [b'{"a": "\xff"}', b'{"a": ', b"{\x00}", b"{"])
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
