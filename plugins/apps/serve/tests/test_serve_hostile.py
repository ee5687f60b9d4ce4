"""Requests ``edge serve`` was not written for, through a real server and real sockets.

Two echo pipelines, each stage a real worker process: ``plain`` (tensors only) and
``prepared`` (a ``prepare`` that sleeps the uploaded file's first number of seconds,
:mod:`slow_prepare`). Each hostile request must be refused as the client's fault — 400,
or 504 for a deadline — in the server's JSON form, never a 500, a traceback in the log or
a redirect; and after each, nothing is held: no request waits or runs, the ledger holds
what it held before, no stage was called for a refused request, and the stage serves on.

A second server (``strict``) has a short ``--body-timeout`` and a ``--body-min-rate``, a
pipeline whose ``finish`` returns what strict JSON cannot carry for some inputs
(:mod:`scores_finish`: the server side's fault, a 500 logged once) and a slow one; it
takes raw sockets that send part of a body and wait, trickle a body, or half-close after
their request. Its log is checked by its own tests.

A third (``failing``) has two pipelines whose ``finish`` raises for some inputs
(:mod:`failing_finish`): a 500 naming the finish and the error, its traceback logged once
per pipeline.

A fourth (``heads``) has a short ``--header-timeout``: raw sockets that send nothing, part
of a request head, or a head a byte at a time, are cut; a head that arrives in time, and
kept-alive requests that follow each other in time, are served.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import Served, echo_pipeline, running

pytestmark = pytest.mark.slow

PREPARE_S = 1.0
"""How long ``prepared``'s prepare takes in the deadline test."""


BODY_TIMEOUT_S = 1.0
"""The ``strict`` server's ``--body-timeout``."""

BODY_MIN_RATE = 256
"""The ``strict`` server's ``--body-min-rate`` (bytes a second)."""

SLOW_S = 1.0
"""How long a call of the ``strict`` server's ``slow`` pipeline takes."""


def _env() -> dict[str, str]:
    """This folder on the server's ``PYTHONPATH`` (its ``prepare`` and ``finish``)."""
    return {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                           os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("hostile")
    pipelines = [echo_pipeline(folder, "plain"),
                 echo_pipeline(folder, "prepared", head='prepare = "slow_prepare:prepare"')]
    with running(pipelines, env=_env()) as served:
        yield served


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``scored`` (echo, then :mod:`scores_finish`) and ``slow`` (echo, ``SLOW_S`` a call)
    under ``--body-timeout BODY_TIMEOUT_S --body-min-rate BODY_MIN_RATE``."""
    folder = tmp_path_factory.mktemp("strict")
    pipelines = [echo_pipeline(folder, "scored", head='finish = "scores_finish:finish"'),
                 echo_pipeline(folder, "slow", delay_s=SLOW_S)]
    with running(pipelines, "--body-timeout", str(BODY_TIMEOUT_S), "--body-min-rate",
                 str(BODY_MIN_RATE), env=_env()) as served:
        yield served


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``first`` and ``second``: echo, then :mod:`failing_finish`."""
    folder = tmp_path_factory.mktemp("failing")
    pipelines = [echo_pipeline(folder, name, head='finish = "failing_finish:finish"')
                 for name in ("first", "second")]
    with running(pipelines, env=_env()) as served:
        yield served


def _tensor(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": str(array.dtype), "shape": list(array.shape),
            "data": base64.b64encode(array.tobytes()).decode()}


X = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}


def _error(reply: httpx.Response) -> dict[str, Any]:
    """The answer's edge fields and code, after checking OpenAI's error shape around them."""
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    error: dict[str, Any] = reply.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["edge"]["status"] == reply.status_code
    return {**error["edge"], "message": error["message"], "code": error["code"]}


def _charged(client: httpx.Client) -> dict[str, Any]:
    """What requests hold now: each pipeline's in-flight calls and waiting requests, the
    queue gauges, the ledger's reserved bytes, how many stage calls were ever timed, and
    the stages' states."""
    pipelines = client.get("/v1/pipelines").json()["pipelines"]
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    return {
        "held": {p["name"]: ([s["in_flight"] for s in p["stages"]], p["queue"]["waiting"])
                 for p in pipelines},
        "states": {p["name"]: [s["state"] for s in p["stages"]] for p in pipelines},
        "queued": {s.labels["pipeline"]: s.value for s in families["edge_queue_length"].samples},
        "reserved": {s.labels["pool"]: s.value
                     for s in families["edge_ledger_reserved_bytes"].samples},
        "stage_calls": sum(s.value for s in families["edge_stage_seconds"].samples
                           if s.name == "edge_stage_seconds_count"),
    }


def _outcomes(client: httpx.Client) -> dict[str, float]:
    """``edge_requests_total`` by outcome, every pipeline and route together."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "edge_requests_total":
                outcome = sample.labels["outcome"]
                found[outcome] = found.get(outcome, 0.0) + sample.value
    return found


def _idle(charged: dict[str, Any]) -> None:
    assert all(held == ([0], 0) for held in charged["held"].values()), charged
    assert all(states == ["ready"] for states in charged["states"].values()), charged
    assert set(charged["queued"].values()) == {0.0}, charged


def _no_traceback(server: Served) -> None:
    assert not any("Traceback" in line or "edge serve: error" in line
                   for line in server.stderr), "".join(server.stderr[-40:])


def test_json_the_parser_cannot_read_is_400_whatever_its_reason_and_nothing_is_charged(
        server: Served) -> None:
    """Not only a syntax error: an integer of more digits than Python converts, and arrays
    nested deeper than the parser recurses, are the body's fault (they were 500s)."""
    long_int = '{"delay_s": ' + "9" * 5000 + "}"  # as params: JSON text
    deep = "[" * 20_000 + "]" * 20_000
    cases = [(long_int, "4300"), (deep, "nested too deeply")]
    json_type = {"content-type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = _charged(client)
        _idle(before)
        counted = _outcomes(client)
        for params, shown in cases:
            body = '{"inputs": {}, "params": ' + params + "}"
            for path in ("/v1/pipelines/plain/run", "/v1/chat/completions"):
                reply = client.post(path, content=body.encode(), headers=json_type)
                assert reply.status_code == 400, (path, reply.text[:300])
                error = _error(reply)
                assert (error["field"], error["code"], error["kind"]) == (
                    "body", "invalid_json", "InvalidJSON"), error
                assert error["message"].startswith("body: not valid JSON: ")
                assert shown in error["message"], error["message"]
            # a form's params (JSON text) are read by the same parser
            reply = client.post("/v1/pipelines/prepared/run",
                                files={"file": ("x.txt", b"0 1 2")}, data={"params": params})
            assert reply.status_code == 400, reply.text[:300]
            assert _error(reply)["field"] == "params"
            assert _error(reply)["kind"] == "InvalidJSON"
        after = _charged(client)
        assert after == before
        outcomes = _outcomes(client)
        assert outcomes.get("error", 0.0) == counted.get("error", 0.0)
        assert outcomes["bad_request"] - counted.get("bad_request", 0.0) == 6.0
        assert client.post("/v1/pipelines/plain/run", json=X).status_code == 200
    _no_traceback(server)


def test_a_deadline_too_large_for_a_float_is_400_naming_it(server: Served) -> None:
    """JSON integers have no bound: one beyond a float's range is refused, not a 500."""
    body = b'{"inputs": {}, "deadline_s": 1' + b"0" * 400 + b"}"
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = _charged(client)
        reply = client.post("/v1/pipelines/plain/run", content=body,
                            headers={"content-type": "application/json"})
        assert reply.status_code == 400, reply.text[:300]
        error = _error(reply)
        assert (error["field"], error["kind"]) == ("deadline_s", "InvalidValue")
        assert error["message"].startswith("deadline_s: must be a number in (0.0, 3600.0]: 1000")
        assert _charged(client) == before
    _no_traceback(server)


def test_an_empty_tensor_whose_other_dimensions_numpy_cannot_hold_is_400_naming_its_shape(
        server: Served) -> None:
    """``[0, 2**63]`` has no bytes to send, yet no array has that shape (it was a 500)."""
    empty = {"dtype": "float32", "data": ""}
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = _charged(client)
        for shape in ([0, 2**63], [0, 2**62], [2**40, 0, 2**40]):
            reply = client.post("/v1/pipelines/plain/run",
                                json={"inputs": {"x": {**empty, "shape": shape}}})
            assert reply.status_code == 400, (shape, reply.text[:300])
            error = _error(reply)
            assert (error["field"], error["kind"]) == ("inputs['x'].shape", "TensorInvalid")
            assert "prod(non-zero dims) * itemsize must be <= 9223372036854775807" \
                in error["message"], error["message"]
        assert _charged(client) == before
        # an empty tensor NumPy can hold goes through
        reply = client.post("/v1/pipelines/plain/run",
                            json={"inputs": {"x": {**empty, "shape": [0, 2**20]}}})
        assert reply.status_code == 200, reply.text[:300]
        assert reply.json()["outputs"]["x"]["shape"] == [0, 2**20]
    _no_traceback(server)


def test_a_bool_tensor_with_a_byte_other_than_0_or_1_is_400_before_any_stage(
        server: Served) -> None:
    """The wire carries a bool as a byte 0 or 1; the worker refused any other (a 500)."""
    def bools(raw: bytes) -> dict[str, Any]:
        return {"inputs": {"x": {"dtype": "bool", "shape": [len(raw)],
                                 "data": base64.b64encode(raw).decode()}}}

    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = _charged(client)
        reply = client.post("/v1/pipelines/plain/run", json=bools(bytes([0, 1, 2, 255])))
        assert reply.status_code == 400, reply.text[:300]
        error = _error(reply)
        assert (error["field"], error["kind"]) == ("inputs['x'].data", "TensorInvalid")
        assert error["message"] == ("inputs['x'].data: a bool tensor's bytes must each be 0 "
                                    "or 1 (the largest is shown): 255")
        assert _charged(client) == before  # no stage was called
        reply = client.post("/v1/pipelines/plain/run", json=bools(bytes([0, 1, 1])))
        assert reply.status_code == 200, reply.text[:300]
        out = reply.json()["outputs"]["x"]
        assert out["dtype"] == "bool" and base64.b64decode(out["data"]) == bytes([0, 1, 1])
    _no_traceback(server)


def test_the_time_prepare_takes_counts_against_the_deadline(server: Served) -> None:
    """A deadline that passes while ``prepare`` runs is 504 and nothing is submitted; the
    request was submitted with the whole deadline again and answered 200 late."""
    def upload(client: httpx.Client, deadline_s: float | None) -> httpx.Response:
        data = {} if deadline_s is None else {"deadline_s": str(deadline_s)}
        return client.post("/v1/pipelines/prepared/run", data=data,
                           files={"file": ("x.txt", f"{PREPARE_S} 1 2 3".encode())})

    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = _charged(client)
        started = time.monotonic()
        reply = upload(client, PREPARE_S / 2)
        took = time.monotonic() - started
        assert reply.status_code == 504, (took, reply.text[:300])
        error = _error(reply)
        assert (error["field"], error["code"]) == ("deadline_s", "deadline_exceeded")
        assert "while prepare read the upload" in error["message"], error["message"]
        # answered once prepare returned, not by the server's backstop 2 s after the deadline
        assert PREPARE_S <= took < PREPARE_S / 2 + 2.0, took
        assert reply.headers["x-should-retry"] == "false"
        assert _charged(client) == before  # the stage was never called
        reply = upload(client, PREPARE_S + 5.0)
        assert reply.status_code == 200, reply.text[:300]
        assert reply.json()["outputs"]["x"]["shape"] == [3]
    _no_traceback(server)


def test_a_route_s_path_with_a_trailing_slash_is_404_json_not_a_redirect(
        server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        counted = _outcomes(client)
        for method, path in (("POST", "/v1/pipelines/plain/run/"), ("GET", "/health/"),
                             ("GET", "/v1/pipelines/"), ("POST", "/v1/chat/completions/")):
            reply = client.request(method, path, json=X, headers={"Host": "elsewhere.example"})
            assert reply.status_code == 404, (path, reply.status_code, reply.headers)
            assert "location" not in reply.headers
            error = _error(reply)
            assert (error["field"], error["code"]) == ("path", "not_found")
            assert error["message"] == f"path: no such route: {path}"
        assert _outcomes(client)["not_found"] - counted.get("not_found", 0.0) == 4.0


def test_a_tensor_name_the_wire_cannot_carry_is_400_naming_it_before_the_request_waits(
        server: Served) -> None:
    """It was refused by the runtime once the request's turn came (after waiting behind
    the running one), naming the wire's ``tensor.name``, not the request's field."""
    x = X["inputs"]["x"]
    with httpx.Client(base_url=server.url, timeout=30) as client, \
            ThreadPoolExecutor(1) as pool:
        before = _charged(client)
        held = pool.submit(client.post, "/v1/pipelines/plain/run",
                           json={**X, "params": {"delay_s": 1.5}})  # holds the only slot
        deadline = time.monotonic() + 10.0
        while client.get("/v1/pipelines/plain").json()["stages"][0]["in_flight"] == 0:
            assert time.monotonic() < deadline, "the held request never ran"
            time.sleep(0.02)
        for name, reason in (("", "must not be empty"),
                             ("a" * 129, "must be <= 128 characters"),
                             ("x\n", "must contain printable characters only"),
                             ("\ud800", "must contain printable characters only")):
            started = time.monotonic()
            reply = client.post("/v1/pipelines/plain/run",  # escaped: a lone surrogate too
                                content=json.dumps({"inputs": {name: x}}),
                                headers={"content-type": "application/json"})
            took = time.monotonic() - started
            assert reply.status_code == 400, (name, reply.text[:300])
            error = _error(reply)
            assert (error["field"], error["kind"]) == (f"inputs[{name!r}]", "TensorInvalid")
            assert error["message"].startswith(f"inputs[{name!r}]: a tensor's name {reason}")
            assert took < 1.0, took  # refused at once, not after the held request
            shown = client.get("/v1/pipelines/plain").json()
            assert (shown["queue"]["waiting"], shown["stages"][0]["in_flight"]) == (0, 1)
        assert held.result().status_code == 200
        after = _charged(client)
        assert after["stage_calls"] == before["stage_calls"] + 1  # the held request's alone
        assert {**after, "stage_calls": 0} == {**before, "stage_calls": 0}
    _no_traceback(server)


def _scores(*values: float) -> dict[str, Any]:
    return {"inputs": {"x": _tensor(np.array(values, dtype=np.float32))}}


def test_a_finish_answer_strict_json_cannot_carry_is_500_naming_its_path_logged_once(
        strict: Served) -> None:
    """NaN or an infinity from ``finish`` (the model's own code), or a NumPy scalar, was a
    500 ``internal error: ValueError`` saying only "Out of range float values are not
    JSON compliant" (a ``TypeError`` for the scalar, with a traceback in the log): now the
    answer names the finish and the path to the value, the log says it once, and the
    request holds nothing after it."""
    cases = [((1.0, float("nan")), "answer.scores[1]", "a number JSON cannot carry", "NaN"),
             ((float("inf"), 1.0), "answer.scores[0]", "a number JSON cannot carry",
              "Infinity"),
             ((-float("inf"),), "answer.scores[0]", "a number JSON cannot carry", "-Infinity"),
             ((7.0, 1.0), "answer.scores[0]", "a value of a type JSON cannot carry",
              "numpy.float32")]
    with httpx.Client(base_url=strict.url, timeout=30) as client:
        before = _charged(client)
        _idle(before)
        counted = _outcomes(client)
        for values, field, what, shown in cases:
            reply = client.post("/v1/pipelines/scored/run", json=_scores(*values))
            assert reply.status_code == 500, (values, reply.text[:300])
            assert reply.headers["x-should-retry"] == "false"
            assert reply.json()["error"]["param"] is None
            assert reply.json()["error"]["type"] == "server_error"
            error = _error(reply)
            assert (error["field"], error["kind"], error["code"]) == (
                field, "FinishAnswerInvalid", "finish_answer_invalid"), error
            assert error["message"] == (f"{field}: pipelines[scored].finish "
                                        f"(scores_finish:finish) returned {what}: {shown}")
        after = _charged(client)
        assert {**after, "stage_calls": 0} == {**before, "stage_calls": 0}
        assert _outcomes(client)["error"] - counted.get("error", 0.0) == len(cases)
        reply = client.post("/v1/pipelines/scored/run", json=_scores(1.0, 2.5))
        assert reply.status_code == 200, reply.text[:300]
        assert reply.json()["answer"] == {"size": 2, "scores": [2.0, 5.0]}
    logged = [line for line in strict.stderr if "edge serve: error" in line]
    assert logged == ["edge serve: error: answer.scores[1]: pipelines[scored].finish "
                      "(scores_finish:finish) returned a number JSON cannot carry: NaN "
                      "(answered 500; logged once per pipeline)\n"], logged
    assert not any("Traceback" in line for line in strict.stderr), "".join(strict.stderr)


def test_a_finish_that_raises_is_500_naming_it_and_its_error_traceback_logged_once(
        failing: Served) -> None:
    """A ``finish`` (the model's own code) that raised was a 500 ``internal error`` not
    naming it, a full traceback in uvicorn's log for every such request (a ``ValueError``
    from it none at all): now the answer names the pipeline's finish and the error's type
    and message, its traceback is logged for the first failure of each pipeline only, the
    result is acknowledged (nothing held) and the pipeline serves on."""
    cases = [(2.0, "RuntimeError", "the labels file is gone"),
             (3.0, "ValueError", "scores and labels differ in length: 4 and 3"),
             (5.0, "KeyError", "'x'"),
             (2.0, "RuntimeError", "the labels file is gone")]
    with httpx.Client(base_url=failing.url, timeout=30) as client:
        before = _charged(client)
        _idle(before)
        counted = _outcomes(client)
        for pipeline in ("first", "second"):
            for first, kind, text in cases:
                reply = client.post(f"/v1/pipelines/{pipeline}/run", json=_scores(first, 1.0))
                assert reply.status_code == 500, (pipeline, first, reply.text[:300])
                assert reply.headers["x-should-retry"] == "false"
                assert reply.json()["error"]["param"] is None
                assert reply.json()["error"]["type"] == "server_error"
                error = _error(reply)
                assert (error["field"], error["kind"], error["code"], error["reason"]) == (
                    f"pipelines[{pipeline}].finish", "FinishFailed", "finish_failed",
                    f"failing_finish:finish raised {kind}"), error
                assert error["message"] == (f"pipelines[{pipeline}].finish: "
                                            f"failing_finish:finish raised {kind}: {text}")
        after = _charged(client)
        assert {**after, "stage_calls": 0} == {**before, "stage_calls": 0}
        assert _outcomes(client)["error"] - counted.get("error", 0.0) == 2 * len(cases)
        for pipeline in ("first", "second"):
            reply = client.post(f"/v1/pipelines/{pipeline}/run", json=_scores(1.0, 2.5))
            assert reply.status_code == 200, reply.text[:300]
            assert reply.json()["answer"] == {"size": 2}
    logged = [line for line in failing.stderr if "edge serve: error" in line]
    assert logged == [f"edge serve: error: pipelines[{pipeline}].finish: failing_finish:finish "
                      "raised RuntimeError: the labels file is gone (answered 500; logged once "
                      "per pipeline, with its traceback):\n"
                      for pipeline in ("first", "second")], logged
    text = "".join(failing.stderr)
    assert text.count("Traceback") == 2, text
    assert text.count('raise RuntimeError("the labels file is gone")') == 2, text
    assert "Exception in ASGI application" not in text, text


def _address(served: Served) -> tuple[str, int]:
    parts = urlsplit(served.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _response(raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    """A raw HTTP response's status, headers and JSON body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


def _request_head(path: str, content_type: str, length: int | None) -> bytes:
    framing = (f"Content-Length: {length}" if length is not None
               else "Transfer-Encoding: chunked")
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
            f"{framing}\r\n\r\n").encode()


def test_a_body_that_stops_short_on_an_open_connection_is_408_after_the_body_timeout(
        strict: Served) -> None:
    """uvicorn has no body-read timeout: a body shorter than its Content-Length, on a
    connection the client left open, held its request for ever. Now a JSON body, a
    multipart upload and a chunked body that stall are answered 408 once no more came
    for ``--body-timeout`` seconds, the connection is closed, and nothing was charged
    (the body is read before the request waits for admission); counted as stalled in
    ``edge_body_timeouts_total``."""
    body = json.dumps(X).encode()
    boundary = "edgeboundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"x.txt\"\r\n\r\n1 2 3\r\n--{boundary}--\r\n").encode()
    stalls = [
        (_request_head("/v1/pipelines/scored/run", "application/json", len(body))
         + body[:10], f"10 bytes received of the {len(body)} its Content-Length declares"),
        (_request_head("/v1/pipelines/scored/run",
                       f"multipart/form-data; boundary={boundary}", len(form)) + form[:30],
         f"30 bytes received of the {len(form)} its Content-Length declares"),
        (_request_head("/v1/pipelines/scored/run", "application/json", None)
         + b"a\r\n" + body[:10] + b"\r\n", "10 bytes received"),
    ]
    with httpx.Client(base_url=strict.url, timeout=30) as client:
        before = _charged(client)
        _idle(before)
        counted = _outcomes(client)
        cut = _body_timeouts(client)
        for sent, received in stalls:
            with socket.create_connection(_address(strict), timeout=30) as sock:
                sock.sendall(sent)
                started = time.monotonic()
                time.sleep(BODY_TIMEOUT_S / 2)
                assert _charged(client) == before  # waiting for its body, it holds nothing
                raw = _until_closed(sock)  # the server closes the connection
                took = time.monotonic() - started
            status, headers, answer = _response(raw)
            assert status == 408, raw[:300]
            assert headers["connection"] == "close"
            assert answer["error"]["code"] == "body_timeout"
            assert answer["error"]["edge"]["kind"] == "BodyTimeout"
            assert answer["error"]["edge"]["field"] == "body"
            assert answer["error"]["message"] == (
                f"body: no more of it arrived for {BODY_TIMEOUT_S:g} s (--body-timeout): a "
                "body shorter than its Content-Length, or a client that stopped sending: "
                f"{received}")
            assert BODY_TIMEOUT_S <= took < BODY_TIMEOUT_S + 2.0, took
        assert _charged(client) == before
        outcomes = _outcomes(client)
        assert outcomes["body_timeout"] - counted.get("body_timeout", 0.0) == len(stalls)
        now_cut = _body_timeouts(client)
        assert (now_cut["stalled"] - cut["stalled"], now_cut["slow"] - cut["slow"]) == (
            len(stalls), 0)
    assert not any("Traceback" in line for line in strict.stderr), "".join(strict.stderr)


def _body_timeouts(client: httpx.Client) -> dict[str, float]:
    """``edge_body_timeouts_total`` by reason."""
    return {sample.labels["reason"]: sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for sample in family.samples if sample.name == "edge_body_timeouts_total"}


TRICKLE_S = 0.05
"""How often a trickling client sends one more byte of its body: twenty times within the
``strict`` server's body timeout."""

AFTER_THE_END = 10
"""How many more bytes a trickling client sends once it read the end of the stream (half
a second's worth, well within the server's lingering)."""


def test_a_body_trickled_within_the_body_timeout_is_cut_at_the_minimum_rate(
        strict: Served) -> None:
    """``--body-timeout`` counts from each wait for more of a body: a client that sent a
    byte each TRICKLE_S held its request and its connection for as long as it went on (a
    slow-body attack). Now a body still incomplete ``--body-timeout`` seconds after its
    head, plus one second for each ``--body-min-rate`` bytes received, is answered 408
    (``BodyTooSlow``) — a JSON body, a multipart upload and a chunked body, each cut
    within a sweep's tick of that bound. The client, still sending, is not reset: the
    connection lingers, its bytes read and dropped, so it reads the whole answer and then
    the end of the stream, and may send on for a while (closed at once, the server's
    kernel would answer its next bytes with a reset: a broken pipe). Nothing was
    charged; counted as ``slow``; the server serves on."""
    boundary = "edgeboundary"
    declared = 1 << 20
    starts = [  # each head, and the start of its body sent with it
        (_request_head("/v1/pipelines/scored/run", "application/json", declared), b"{"),
        (_request_head("/v1/pipelines/scored/run", f"multipart/form-data; boundary={boundary}",
                       declared),
         (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
          'filename="x.txt"\r\n\r\n').encode()),
        (_request_head("/v1/pipelines/scored/run", "application/json", None),
         f"{declared:x}\r\n{{".encode()),
    ]
    begun = [len(start) for _, start in starts[:2]] + [1]  # the chunk's framing uncounted
    heads = [head + start for head, start in starts]
    values = [f"of the {declared} its Content-Length declares in ",
              f"of the {declared} its Content-Length declares in ", "in "]
    with httpx.Client(base_url=strict.url, timeout=30) as client:
        before = _charged(client)
        _idle(before)
        counted = _outcomes(client)
        cut = _body_timeouts(client)
        socks = [socket.create_connection(_address(strict), timeout=30) for _ in heads]
        sent = [0] * len(socks)
        received = [b""] * len(socks)
        answered_after: dict[int, float] = {}
        sent_after_end = [0] * len(socks)
        try:
            for sock, head in zip(socks, heads, strict=True):
                sock.sendall(head)
                sock.setblocking(False)
            started = time.monotonic()
            while min(sent_after_end) < AFTER_THE_END:
                now = time.monotonic() - started
                assert now < BODY_TIMEOUT_S + 10.0, (answered_after, received)
                for index, sock in enumerate(socks):
                    if sent_after_end[index] >= AFTER_THE_END:
                        continue
                    if sent_after_end[index]:
                        sent_after_end[index] += 1
                    else:
                        try:
                            chunk = sock.recv(65536)
                        except BlockingIOError:
                            chunk = None
                        if chunk == b"":  # the end of the stream, after the answer
                            sent_after_end[index] = 1
                        elif chunk:
                            answered_after.setdefault(index, now)
                            received[index] += chunk
                    # on and on, also after the answer and its end: never reset
                    sock.send(b" ")
                    sent[index] += 1
                time.sleep(TRICKLE_S)
        finally:
            for sock in socks:
                sock.close()
        for index, raw in enumerate(received):
            status, headers, answer = _response(raw)
            assert status == 408, raw[:300]
            assert headers["connection"] == "close"
            error = answer["error"]
            assert (error["code"], error["edge"]["kind"], error["edge"]["field"]) == (
                "body_timeout", "BodyTooSlow", "body"), error
            prefix = (f"body: not complete within {BODY_TIMEOUT_S:g} s and one second more "
                      f"for each {BODY_MIN_RATE} bytes received (--body-timeout, "
                      "--body-min-rate): a client sending too slowly: ")
            assert error["message"].startswith(prefix), error["message"]
            value = error["message"][len(prefix):]
            count, _, rest = value.partition(" bytes received ")
            assert rest.startswith(values[index]), value
            bound = BODY_TIMEOUT_S + int(count) / BODY_MIN_RATE
            # more than the body timeout in all, each byte within it: only the rate cuts
            took = answered_after[index]
            assert bound <= took < bound + BODY_TIMEOUT_S / 4 + 1.0, (index, took, bound)
            assert begun[index] <= int(count) <= begun[index] + sent[index]
        assert _charged(client) == before
        outcomes = _outcomes(client)
        assert outcomes["body_timeout"] - counted.get("body_timeout", 0.0) == len(socks)
        now_cut = _body_timeouts(client)
        assert (now_cut["stalled"] - cut["stalled"], now_cut["slow"] - cut["slow"]) == (
            0, len(socks))
        assert client.get("/health").status_code == 200
        assert client.post("/v1/pipelines/scored/run", json=X).status_code == 200
    assert not any("Traceback" in line for line in strict.stderr), "".join(strict.stderr)


def test_a_body_at_a_slow_rate_above_the_minimum_and_a_large_body_are_read_whole(
        strict: Served) -> None:
    """A body that keeps coming at twice ``--body-min-rate``, in pieces each well within
    the body timeout and for several times the timeout in all, is read whole and
    answered; so is a body of megabytes sent at once (the rate bound is on time, never
    on size). (``slow``: plain echo outputs.)"""
    small = json.dumps({"inputs": {"x": _tensor(np.ones((16, 16), dtype=np.float32))}})
    body = small.encode()
    piece = 32
    pause = piece / (2 * BODY_MIN_RATE)  # twice the minimum rate
    with socket.create_connection(_address(strict), timeout=30) as sock:
        sock.sendall(_request_head("/v1/pipelines/slow/run", "application/json",
                                   len(body)))
        started = time.monotonic()
        for at in range(0, len(body), piece):
            time.sleep(pause)
            sock.sendall(body[at:at + piece])
        took = time.monotonic() - started
        status, _, answer = _one_response(sock)
    assert took > 2 * BODY_TIMEOUT_S, took
    assert status == 200, answer[:300]
    assert json.loads(answer)["outputs"]["x"]["shape"] == [16, 16]
    large = {"inputs": {"x": _tensor(np.ones((1024, 1024), dtype=np.float32))}}
    with httpx.Client(base_url=strict.url, timeout=60) as client:
        cut = _body_timeouts(client)
        reply = client.post("/v1/pipelines/slow/run", json=large)
        assert reply.status_code == 200, reply.text[:300]
        assert reply.json()["outputs"]["x"]["shape"] == [1024, 1024]
        assert _body_timeouts(client) == cut
    assert not any("Traceback" in line for line in strict.stderr), "".join(strict.stderr)


def test_a_client_that_half_closes_after_its_request_gets_no_answer_and_is_cancelled(
        strict: Served) -> None:
    """The limit docs/serve.md states (Safety): the end of a client's input is taken as
    the client gone — ``shutdown(SHUT_WR)`` sends the same FIN as closing the socket, and
    that FIN is how a client that hangs up cancels its request — so the request is
    cancelled as a disconnect's is and no answer comes; nothing is left held."""
    body = json.dumps(X).encode()
    with httpx.Client(base_url=strict.url, timeout=30) as client:
        before = _charged(client)
        _idle(before)
        counted = _outcomes(client)
        with socket.create_connection(_address(strict), timeout=30) as sock:
            sock.sendall(_request_head("/v1/pipelines/slow/run", "application/json",
                                       len(body)) + body)
            sock.shutdown(socket.SHUT_WR)
            started = time.monotonic()
            assert _until_closed(sock) == b""
            assert time.monotonic() - started < SLOW_S  # closed, not answered late
        deadline = time.monotonic() + 10.0
        while _charged(client)["held"] != before["held"]:  # the call left to finish
            assert time.monotonic() < deadline, _charged(client)
            time.sleep(0.05)
        assert _charged(client) == before
        assert _outcomes(client)["cancelled"] - counted.get("cancelled", 0.0) == 1.0
        assert client.post("/v1/pipelines/slow/run", json=X).status_code == 200


HEADER_TIMEOUT_S = 1.0
"""The ``heads`` server's ``--header-timeout``."""

HEADER_TICK_S = HEADER_TIMEOUT_S / 4
"""How often the ``heads`` server sweeps its connections (a quarter of the timeout)."""


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``plain`` (echo) under ``--header-timeout HEADER_TIMEOUT_S``."""
    folder = tmp_path_factory.mktemp("heads")
    with running([echo_pipeline(folder, "plain")], "--header-timeout",
                 str(HEADER_TIMEOUT_S)) as served:
        yield served


def _unpooled(served: Served) -> httpx.Client:
    """A client that opens a connection for each request: none of its own idles on the
    ``heads`` server long enough to be closed under it."""
    return httpx.Client(base_url=served.url, timeout=30,
                        limits=httpx.Limits(max_keepalive_connections=0))


def _header_timeouts(client: httpx.Client) -> dict[str, float]:
    """``edge_header_timeouts_total`` by answer."""
    return {sample.labels["answer"]: sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for sample in family.samples if sample.name == "edge_header_timeouts_total"}


def _one_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response read off a kept-alive connection (its Content-Length's worth)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {raw!r}"
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {raw!r}"
        body += chunk
    assert len(body) == int(headers["content-length"]), body
    return int(status_line.split()[1]), headers, body


def test_a_head_not_complete_within_the_header_timeout_is_cut_whether_trickled_or_not(
        heads: Served) -> None:
    """uvicorn bounds no read of a request's head: a connection that sent nothing, or
    part of a head, or trickled its head a byte at a time without ending it (slowloris),
    was held for ever, and enough of them (one file descriptor each) left the server
    unable to accept any. Now each is closed ``--header-timeout`` seconds after it opened
    (a trickle that keeps coming earns no more time), by one sweep: with a 408 naming the
    timeout when part of a head arrived, silently when nothing did. None reached the app:
    nothing is charged or counted as a request, only as ``edge_header_timeouts_total``."""
    head = b"POST /v1/pipelines/plain/run HTTP/1.1\r\nHost: test\r\nX-Slow: "
    kinds = ["silent"] * 4 + ["partial"] * 4 + ["trickled"] * 4
    with _unpooled(heads) as client:
        before = _charged(client)
        _idle(before)
        counted = _outcomes(client)
        cut = _header_timeouts(client)
        socks = [socket.create_connection(_address(heads), timeout=30) for _ in kinds]
        opened = time.monotonic()
        try:
            for sock, kind in zip(socks, kinds, strict=True):
                if kind != "silent":
                    sock.sendall(head)
                sock.setblocking(False)
            received: dict[int, bytes] = {}
            closed_after: dict[int, float] = {}
            trickled = 0
            while len(closed_after) < len(socks):
                now = time.monotonic() - opened
                assert now < HEADER_TIMEOUT_S + 2 * HEADER_TICK_S + 2.0, closed_after
                for index, sock in enumerate(socks):
                    if index in closed_after:
                        continue
                    try:
                        chunk = sock.recv(65536)
                    except BlockingIOError:
                        if kinds[index] == "trickled":
                            sock.send(b"a")
                        continue
                    received[index] = received.get(index, b"") + chunk
                    if not chunk:
                        closed_after[index] = now
                trickled += 1
                time.sleep(0.05)
        finally:
            for sock in socks:
                sock.close()
        assert trickled * 0.05 > HEADER_TIMEOUT_S  # the trickle went on past the timeout
        for index, kind in enumerate(kinds):
            took = closed_after[index]
            assert HEADER_TIMEOUT_S <= took < HEADER_TIMEOUT_S + 2 * HEADER_TICK_S + 1.0, (
                kind, took)
            if kind == "silent":
                assert received[index] == b"", received[index][:300]
                continue
            status, headers, answer = _response(received[index])
            assert status == 408, received[index][:300]
            assert headers["connection"] == "close"
            assert headers["content-type"] == "application/json"
            assert answer["error"]["code"] == "header_timeout"
            assert answer["error"]["type"] == "invalid_request_error"
            assert (answer["error"]["edge"]["kind"], answer["error"]["edge"]["field"]) == (
                "HeaderTimeout", "head")
            assert answer["error"]["message"] == (
                f"head: the request line and headers were not complete within "
                f"{HEADER_TIMEOUT_S:g} s (--header-timeout)")
        assert _charged(client) == before
        outcomes = _outcomes(client)
        assert {k: v for k, v in outcomes.items() if k != "ok"} == {
            k: v for k, v in counted.items() if k != "ok"}
        now_cut = _header_timeouts(client)
        assert now_cut["408"] - cut["408"] == kinds.count("partial") + kinds.count("trickled")
        assert now_cut["closed"] - cut["closed"] == kinds.count("silent")
        assert client.post("/v1/pipelines/plain/run", json=X).status_code == 200
    assert not any("Traceback" in line for line in heads.stderr), "".join(heads.stderr)


def test_a_head_trickled_within_the_header_timeout_is_answered(heads: Served) -> None:
    """A head that comes in pieces but whole within the timeout is served as any other."""
    body = json.dumps(X).encode()
    head = _request_head("/v1/pipelines/plain/run", "application/json", len(body))
    pieces = [head[i:i + 8] for i in range(0, len(head), 8)]
    pause = 0.6 * HEADER_TIMEOUT_S / len(pieces)
    with socket.create_connection(_address(heads), timeout=30) as sock:
        started = time.monotonic()
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(pause)
        assert time.monotonic() - started < HEADER_TIMEOUT_S
        sock.sendall(body)
        status, _, answer = _one_response(sock)
    assert status == 200, answer[:300]
    assert json.loads(answer)["outputs"]["x"]["shape"] == [2, 2]


def test_keep_alive_requests_each_get_the_header_timeout_from_the_last_answer(
        heads: Served) -> None:
    """The timeout counts from the end of each answer, not from the connection's opening:
    a kept-alive connection whose requests follow each other within it is served for as
    long as they come (here more than twice the timeout). Idle after an answer for the
    timeout it is closed silently (uvicorn's own keep-alive timeout is longer); a head
    begun after an answer and left unfinished is answered 408."""
    request = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
    with _unpooled(heads) as client:
        before = _charged(client)
        cut = _header_timeouts(client)
        with socket.create_connection(_address(heads), timeout=30) as sock:
            started = time.monotonic()
            for _ in range(4):
                time.sleep(0.6 * HEADER_TIMEOUT_S)
                sock.sendall(request)
                status, headers, _ = _one_response(sock)
                assert status == 200 and headers.get("connection") != "close", headers
            assert time.monotonic() - started > 2 * HEADER_TIMEOUT_S
            answered = time.monotonic()
            assert _until_closed(sock) == b""  # idle: closed, nothing sent
            took = time.monotonic() - answered
            assert HEADER_TIMEOUT_S - HEADER_TICK_S <= took < HEADER_TIMEOUT_S + 1.5, took
        with socket.create_connection(_address(heads), timeout=30) as sock:
            sock.sendall(request)
            assert _one_response(sock)[0] == 200
            answered = time.monotonic()
            sock.sendall(request[:20])
            status, headers, answer = _response(_until_closed(sock))
            took = time.monotonic() - answered
        assert status == 408 and answer["error"]["code"] == "header_timeout", answer
        assert HEADER_TIMEOUT_S - HEADER_TICK_S <= took < HEADER_TIMEOUT_S + 1.5, took
        now_cut = _header_timeouts(client)
        assert (now_cut["408"] - cut["408"], now_cut["closed"] - cut["closed"]) == (1, 1)
        assert _charged(client) == before


def _too_large_count(client: httpx.Client) -> float:
    """``edge_header_too_large_total``."""
    return sum(sample.value
               for family in text_string_to_metric_families(client.get("/metrics").text)
               for sample in family.samples if sample.name == "edge_header_too_large_total")


@pytest.mark.parametrize("shape", ["one long header", "many headers"])
def test_a_head_over_the_size_bound_is_431_at_once_and_nothing_is_charged(
        server: Served, shape: str) -> None:
    """httptools takes a header of any length: one endless header line sent for six
    seconds grew the server by 80 MiB before the time bound cut it. A head past
    ``MAX_HEAD_BYTES`` is refused 431 as soon as it is read, well inside the server's
    ``--header-timeout`` (10 s), and its connection closed; no route sees it."""
    from edge_serve.heads import MAX_HEAD_BYTES

    start = b"POST /v1/pipelines/plain/run HTTP/1.1\r\nHost: test\r\n"
    if shape == "one long header":
        pieces = [start + b"X-Long: "] + [b"a" * 16384] * (2 * MAX_HEAD_BYTES // 16384)
    else:
        line = b"X-Many-%05d: " + b"b" * 100 + b"\r\n"
        pieces = [start] + [line % i for i in range(2 * MAX_HEAD_BYTES // len(line % 0))]
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = _charged(client)
        _idle(before)
        counted = _outcomes(client)
        refused = _too_large_count(client)
        with socket.create_connection(_address(server), timeout=30) as sock:
            started = time.monotonic()
            # as fast as it goes, never the end of the head, four times the bound: most of
            # it arrives after the refusal, which must not reset the connection before
            # the answer is read (the server reads and drops the rest for a while)
            sock.sendall(b"".join(pieces) + b"d" * (2 * MAX_HEAD_BYTES))
            raw = _until_closed(sock)
            took = time.monotonic() - started
        assert took < 5.0, took  # the size bound, not the 10 s header timeout
        status, headers, answer = _response(raw)
        assert status == 431, raw[:300]
        assert headers["connection"] == "close"
        assert answer["error"]["code"] == "header_too_large"
        assert answer["error"]["type"] == "invalid_request_error"
        assert (answer["error"]["edge"]["kind"], answer["error"]["edge"]["field"]) == (
            "HeaderTooLarge", "head")
        assert answer["error"]["message"] == (
            f"head: the request line and headers are over {MAX_HEAD_BYTES} bytes")
        assert _too_large_count(client) == refused + 1
        assert _charged(client) == before
        outcomes = _outcomes(client)  # none but the scrapes' own oks since
        assert {k: v for k, v in outcomes.items() if k != "ok"} == {
            k: v for k, v in counted.items() if k != "ok"}
        assert client.post("/v1/pipelines/plain/run", json=X).status_code == 200
    _no_traceback(server)


def test_a_head_under_the_bound_in_pieces_and_a_large_body_in_its_reads_are_served(
        server: Served) -> None:
    """Only a head's own bytes count: headers just under the bound, sent in pieces, and a
    body of many times the bound sent in the same reads as its head are answered."""
    from edge_serve.heads import MAX_HEAD_BYTES

    filler = [f"X-Fill-{i:04d}: {'c' * 200}\r\n".encode()  # 215 bytes each
              for i in range((MAX_HEAD_BYTES - 1024) // 215)]
    body = json.dumps({"inputs": {"x": _tensor(np.ones((512, 512), dtype=np.float32))}})
    assert len(body) > 8 * MAX_HEAD_BYTES
    with socket.create_connection(_address(server), timeout=30) as sock:
        head = (b"POST /v1/pipelines/plain/run HTTP/1.1\r\nHost: test\r\n"
                b"Content-Type: application/json\r\n" + b"".join(filler)
                + f"Content-Length: {len(body)}\r\n\r\n".encode())
        assert MAX_HEAD_BYTES - 2048 < len(head) <= MAX_HEAD_BYTES
        for at in range(0, len(head), 4096):
            sock.sendall(head[at:at + 4096])
            time.sleep(0.002)
        sock.sendall(body.encode())
        status, _, answer = _one_response(sock)
        assert status == 200, answer[:300]
        assert json.loads(answer)["outputs"]["x"]["shape"] == [512, 512]
        whole = (b"POST /v1/pipelines/plain/run HTTP/1.1\r\nHost: test\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body.encode())
        sock.sendall(whole)  # the head and the start of its body in one read
        status, _, answer = _one_response(sock)
        assert status == 200, answer[:300]
    _no_traceback(server)
