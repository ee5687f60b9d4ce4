"""``edge serve`` as a real process over the echo backend: tensors, refusals, guards.

The echo stage runs in a real worker process (``y = x * 2`` after ``delay_s``); each
refusal is provoked through real HTTP and must come back as JSON naming the field, never
a traceback.
"""

from __future__ import annotations

import base64
import json
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

DELAY_S = 0.6
API_KEY = "s3cret-test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("echo-pipelines")
    restarting = 'restart = "on-failure"\nrestart_backoff_s = 2.0'
    pipelines = [echo_pipeline(folder, "slow", delay_s=DELAY_S, stage=restarting),
                 echo_pipeline(folder, "fast", admission=2)]
    # slow queues nothing: a request finding its one slot taken is refused at once
    with running(pipelines, "--api-key", API_KEY, "--max-body-bytes", "65536",
                 "--queue-length", "slow=0") as served:
        yield served


def _client(server: Served, *, key: str | None = API_KEY) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=60.0)


def _tensor(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": str(array.dtype), "shape": list(array.shape),
            "data": base64.b64encode(array.tobytes()).decode()}


def _error(reply: httpx.Response) -> dict[str, Any]:
    """The answer's edge fields, after checking OpenAI's error shape around them."""
    assert reply.headers["content-type"].startswith("application/json")
    assert "Traceback" not in reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    edge: dict[str, Any] = error["edge"]
    assert edge["status"] == reply.status_code
    return {**edge, "message": error["message"], "code": error["code"]}


def test_named_tensors_go_through_the_worker_and_come_back(server: Served) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with _client(server) as client:
        reply = client.post("/v1/pipelines/fast/run", json={"inputs": {"x": _tensor(x)}})
    assert reply.status_code == 200, reply.text
    out = reply.json()["outputs"]["x"]
    assert out["dtype"] == "float32" and out["shape"] == [3, 4]
    y = np.frombuffer(base64.b64decode(out["data"]), dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(y, x * 2)
    assert set(reply.json()["latency_ms"]) == {"echo"}


def test_bad_input_is_400_naming_the_field(server: Served) -> None:
    x = _tensor(np.zeros((2, 2), dtype=np.float32))
    cases = [
        ({"inputs": {"x": {**x, "dtype": "float"}}}, "inputs['x'].dtype"),
        ({"inputs": {"x": {**x, "shape": [2, -1]}}}, "inputs['x'].shape"),
        ({"inputs": {"x": {**x, "data": x["data"][:-4]}}}, "inputs['x'].data"),
        ({"inputs": {"x": {**x, "data": "!" * len(x["data"])}}}, "inputs['x'].data"),
        ({"inputs": {"x": x}, "deadline_s": -1}, "deadline_s"),
        ({"inputs": {"x": x}, "deadline_s": "soon"}, "deadline_s"),
        ({"inputs": {"x": x}, "colour": "red"}, "colour"),
        ({"inputs": {"x": x}, "params": [1]}, "params"),
    ]
    with _client(server) as client:
        for body, field in cases:
            reply = client.post("/v1/pipelines/fast/run", json=body)
            assert reply.status_code == 400, (body, reply.text)
            assert _error(reply)["field"] == field
        reply = client.post("/v1/pipelines/fast/run", content=b"{not json",
                            headers={"content-type": "application/json"})
        assert reply.status_code == 400 and _error(reply)["field"] == "body"
        for text in ("nan", "1_0", "abc"):  # float() would read "1_0" as 10
            reply = client.post("/v1/pipelines/fast/run", json={"inputs": {"x": x}},
                                headers={"X-Edge-Deadline": text})
            assert reply.status_code == 400, text
            assert _error(reply)["field"] == "headers.x-edge-deadline"
        reply = client.post("/v1/pipelines/fast/run", files={"file": ("a.png", b"png")},
                            data={"deadline_s": "2_5"})
        assert reply.status_code == 400 and _error(reply)["field"] == "deadline_s"
        reply = client.post("/v1/pipelines/fast/run", files={"file": ("a.png", b"png")})
        assert reply.status_code == 400 and _error(reply)["field"] == "file"
        reply = client.post("/v1/pipelines/nowhere/run", json={"inputs": {}})
        assert reply.status_code == 404 and _error(reply)["field"] == "name"


def test_a_body_over_the_limit_is_413_declared_or_chunked(server: Served) -> None:
    big = _tensor(np.zeros(40_000, dtype=np.float32))  # ~213 KB of JSON, limit 64 KiB
    with _client(server) as client:
        reply = client.post("/v1/pipelines/fast/run", json={"inputs": {"x": big}})
        assert reply.status_code == 413
        assert _error(reply)["field"] == "body"

        def chunks() -> Iterator[bytes]:
            for _ in range(20):
                yield b" " * 8192

        reply = client.post("/v1/pipelines/fast/run", content=chunks(),
                            headers={"content-type": "application/json"})
        assert reply.status_code == 413
        assert "limit of 65536 bytes" in _error(reply)["reason"]


def test_a_body_longer_than_its_declared_length_never_reaches_the_route(
        server: Served) -> None:
    """A declared length within the limit is trusted (the guard passes the body through).

    That holds because the server reads no more than it declares: a request that
    declares a small length and sends a chunked body over the limit besides is refused
    by the HTTP parser itself, and the server keeps serving.
    """
    url = urlsplit(server.url)
    chunked = b"".join(b"2000\r\n" + b" " * 0x2000 + b"\r\n" for _ in range(10)) + b"0\r\n\r\n"
    for headers in (b"Content-Length: 10\r\nTransfer-Encoding: chunked\r\n",
                    b"Transfer-Encoding: chunked\r\nContent-Length: 10\r\n"):
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/pipelines/fast/run HTTP/1.1\r\nHost: " + url.netloc.encode()
                         + b"\r\nAuthorization: Bearer " + API_KEY.encode()
                         + b"\r\nContent-Type: application/json\r\n" + headers + b"\r\n"
                         + chunked)
            head = sock.recv(4096)
        # the parser's own refusal, not the route's JSON (nor the guard's 413)
        assert head.startswith(b"HTTP/1.1 400 "), head[:80]
        assert b"application/json" not in head.lower(), head[:200]
    with _client(server) as client:
        reply = client.post("/v1/pipelines/fast/run",
                            json={"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}})
        assert reply.status_code == 200


def _address(served: Served) -> tuple[str, int]:
    parts = urlsplit(served.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _chunked_head() -> bytes:
    """The head of a chunked JSON request to ``fast``, with the bearer token."""
    return (b"POST /v1/pipelines/fast/run HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer "
            + API_KEY.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")


CHUNK = b"2000\r\n" + b" " * 0x2000 + b"\r\n"
"""One chunk of a chunked body: 8 KiB of spaces."""


def _whole_answer(raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]] | None:
    """A raw HTTP response's status, headers and JSON body once all of it is in ``raw``."""
    head, found, body = raw.partition(b"\r\n\r\n")
    if not found:
        return None
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    if len(body) < int(headers["content-length"]):
        return None
    assert len(body) == int(headers["content-length"]), raw[:300]
    return int(status_line.split()[1]), headers, json.loads(body)


def _check_413(answer: tuple[int, dict[str, str], dict[str, Any]] | None) -> None:
    assert answer is not None
    status, headers, body = answer
    assert status == 413, answer
    assert headers["connection"] == "close"
    assert body["error"]["edge"]["kind"] == "BodyTooLarge"
    assert body["error"]["message"] == ("body: larger than the server's limit of 65536 bytes "
                                        "(--max-body-bytes): more than 65536")


def test_a_client_streaming_on_after_its_413_is_closed_within_the_lingering_bound(
        server: Served) -> None:
    """After a 413 for a chunked body over the limit the connection was kept alive, so
    the server read and dropped what the client still sent until the header timeout cut
    it (about 10 s). Now the 413 says ``Connection: close``, the server's side ends
    after it, and a client that keeps sending a chunk every 20 ms has its connection
    closed within the lingering's time bound — having read the 413 whole, no reset
    before it. Nothing was charged, and the pipeline serves on."""
    from edge_serve.lingering import LINGER_S

    with _client(server) as client:
        before = _charged(client)
        with socket.create_connection(_address(server), timeout=30) as sock:
            sock.sendall(_chunked_head())
            sock.setblocking(False)
            raw = b""
            answered: float | None = None
            ended: float | None = None
            closed: float | None = None
            started = time.monotonic()
            while time.monotonic() - started < LINGER_S + 10.0:
                try:
                    sock.sendall(CHUNK)
                except BlockingIOError:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    closed = time.monotonic()
                    break
                try:
                    while part := sock.recv(65536):
                        raw += part
                    ended = ended or time.monotonic()  # the end of the server's side
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    closed = time.monotonic()
                    break
                if answered is None and _whole_answer(raw) is not None:
                    answered = time.monotonic()
                time.sleep(0.02)
        _check_413(_whole_answer(raw))
        assert answered is not None and ended is not None and closed is not None
        assert ended - answered < 0.5, (answered, ended)  # its side ends with the answer
        # closed by the lingering's time bound, not the 10 s header timeout
        assert LINGER_S - 0.5 <= closed - answered < LINGER_S + 1.5, closed - answered
        assert _charged(client) == before
        assert client.post("/v1/pipelines/fast/run", json={
            "inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}).status_code == 200


def _kernel_buffers() -> int:
    """The most bytes the kernel's socket buffers may hold between a client and the
    server on one TCP connection: a send buffer and a receive buffer at their largest."""
    most = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        most += int(Path("/proc/sys/net/ipv4", name).read_text().split()[2])
    return most


def test_a_client_flooding_on_after_its_413_is_closed_within_the_lingering_byte_bound(
        server: Served) -> None:
    """A client that sends as fast as it can after its 413 is closed once the server has
    dropped ``LINGER_BYTES`` of it, long before the lingering's time bound: what it
    managed to send is at most the limit, that bound and what the kernel's buffers hold.
    It read its 413 whole meanwhile (it reads as it sends)."""
    import threading

    from edge_serve.lingering import LINGER_BYTES

    chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
    with _client(server) as client:
        before = _charged(client)
        with socket.create_connection(_address(server), timeout=30) as sock:
            sock.sendall(_chunked_head())
            sent = 0
            failed: list[OSError] = []
            started = time.monotonic()

            def flood() -> None:
                nonlocal sent
                try:
                    while time.monotonic() - started < 30.0:
                        sock.sendall(chunk)
                        sent += len(chunk)
                except OSError as exc:  # the server closed: a broken pipe, or a reset
                    failed.append(exc)

            sender = threading.Thread(target=flood)
            sender.start()
            raw = b""
            try:
                while part := sock.recv(65536):
                    raw += part
            except ConnectionResetError:
                pass
            sender.join()
        _check_413(_whole_answer(raw))
        assert failed, "the flood was never cut"
        assert sent <= 65536 + LINGER_BYTES + _kernel_buffers(), sent
        assert _charged(client) == before


def test_admission_full_is_429_with_retry_after(server: Served) -> None:
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    with _client(server) as client, ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: client.post("/v1/pipelines/slow/run", json=x),
                                range(4)))
    codes = sorted(r.status_code for r in replies)
    assert codes.count(200) >= 1 and codes.count(429) >= 1, codes
    assert set(codes) <= {200, 429}
    for reply in replies:
        if reply.status_code == 429:
            assert int(reply.headers["retry-after"]) >= 1
            assert "admission" in _error(reply)["message"]


def _wait_ready(client: httpx.Client, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, client.get("/health").text
        time.sleep(0.1)


def test_a_passed_deadline_is_504_and_the_worker_finishes_its_call(server: Served) -> None:
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    with _client(server) as client:
        _wait_ready(client)
        reply = client.post("/v1/pipelines/slow/run", json={**x, "deadline_s": 0.2})
        assert reply.status_code == 504
        assert _error(reply)["field"] == "deadline_s"
        # The echo stage cannot cancel in place: its call (0.6 s) is left to finish, the
        # worker kept. The deadline fenced the request and retired nothing: the stage
        # stays ready, its slot (and the admission slot) the call's until it ends.
        health = client.get("/health")
        assert health.status_code == 200, health.text
        assert health.json()["pipelines"]["slow"]["stages"]["echo"] == "ready"
        deadline = time.monotonic() + 30.0
        while client.get("/v1/pipelines/slow").json()["stages"][0]["in_flight"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        reply = client.post("/v1/pipelines/slow/run", json=x, headers={"X-Edge-Deadline": "30"})
        assert reply.status_code == 200, reply.text
        text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    restarts = {s.labels["pipeline"]: s.value for s in families["edge_worker_restarts"].samples
                if s.name == "edge_worker_restarts_total"}
    assert restarts == {"slow": 0.0, "fast": 0.0}
    deadlines = [s.value for s in families["edge_requests"].samples
                 if s.name == "edge_requests_total" and s.labels["pipeline"] == "slow"
                 and s.labels["outcome"] == "deadline"]
    assert deadlines and deadlines[0] >= 1.0


def test_a_worker_that_dies_under_a_request_is_503_worker_lost_then_serves_again(
    server: Served,
) -> None:
    # The tensor route sends from the event loop, which reads the worker's channel itself:
    # the end of that channel is the request's own answer, and the loop serves on.
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    with _client(server) as client:
        _wait_ready(client)
        reply = client.post("/v1/pipelines/slow/run", json={**x, "params": {"crash": True}})
        assert reply.status_code == 503, reply.text
        assert _error(reply)["code"] == "worker_lost"
        fast = client.post("/v1/pipelines/fast/run", json=x)  # the other pipeline serves on
        assert fast.status_code == 200, fast.text
        _wait_ready(client)  # restart = "on-failure"
        reply = client.post("/v1/pipelines/slow/run", json=x, headers={"X-Edge-Deadline": "30"})
        assert reply.status_code == 200, reply.text
        listed = client.get("/v1/pipelines/slow").json()
    assert listed["stages"][0]["in_flight"] == 0 and listed["queue"]["waiting"] == 0


def test_an_event_too_large_for_the_worker_channel_is_500_naming_it_and_the_stage_serves_on(
        server: Served) -> None:
    # 15000 streamed chunks make the echo's DONE carry about 94 KB of text in its data:
    # its header would be over the channel's 64 KiB, so the worker fails the request with
    # EventTooLarge instead of sending it. Before, the answer named the field "params",
    # as if the request's parameters were at fault, with code internal_error.
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    with _client(server) as client:
        _wait_ready(client)
        reply = client.post("/v1/pipelines/fast/run",
                            json={**x, "params": {"stream_chunks": 15000}})
        assert reply.status_code == 500, reply.text
        assert reply.headers["x-should-retry"] == "false"
        error = _error(reply)
        assert (error["kind"], error["field"], error["code"]) == (
            "EventTooLarge", "event.data", "event_too_large")
        assert reply.json()["error"]["param"] is None
        assert error["message"].startswith("event.data: the done event's header would be ")
        assert "over the channel's max_header_bytes 65536" in error["message"]
        assert "data['text']: put large values in output tensors" in error["message"]
        fast = client.post("/v1/pipelines/fast/run", json=x)  # the channel and stage stay
        assert fast.status_code == 200, fast.text


def test_every_route_but_health_and_the_page_wants_the_bearer_token(server: Served) -> None:
    with _client(server, key=None) as anonymous, _client(server, key="wrong") as wrong:
        assert anonymous.get("/health").status_code == 200
        assert anonymous.get("/").status_code == 200
        for path in ("/v1/pipelines", "/metrics", "/v1/models"):
            reply = anonymous.get(path)
            assert reply.status_code == 401, path
            assert reply.headers["www-authenticate"] == "Bearer"
            assert _error(reply)["field"] == "headers.authorization"
            assert wrong.get(path).status_code == 401
        assert anonymous.post("/v1/pipelines/fast/run", json={}).status_code == 401
    with _client(server) as client:
        listed = client.get("/v1/pipelines").json()["pipelines"]
    assert [p["name"] for p in listed] == ["slow", "fast"]
    stage = listed[0]["stages"][0]
    assert {k: stage[k] for k in ("id", "backend", "kind")} == {
        "id": "echo", "backend": "echo", "kind": ["graph"]}
    assert stage["state"] in ("ready", "failed", "restarting") and stage["generation"] >= 1
    assert listed[0]["plan"]["stages"][0]["reservation"]["demands"]["machine:ram"] > 0


def test_health_and_metrics_describe_the_server(server: Served) -> None:
    with _client(server) as client:
        _wait_ready(client)
        health = client.get("/health").json()
        text = client.get("/metrics").text
    one = {"number": 1, "decision": "only", "switches": [], "background": None}
    memory = {name: health["pipelines"][name].pop("memory") for name in ("slow", "fast")}
    assert health == {"status": "ok", "memory_over_demand": [], "plugin_errors": [],
                      "pipelines": {
        "slow": {"state": "ready", "stages": {"echo": "ready"}, "bundle_changed": {},
                 "placement": one},
        "fast": {"state": "ready", "stages": {"echo": "ready"}, "bundle_changed": {},
                 "placement": one}}}
    for found in memory.values():  # each stage's peak so far against its demand
        ram = found["stages"]["echo"]["pools"]["machine:ram"]
        assert ram["verdict"] == "within" and 0 < ram["peak_bytes"] <= ram["demand_bytes"]
        assert found["over_demand"] == []
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"edge_requests", "edge_request_seconds", "edge_stage_seconds",
            "edge_admission_refusals", "edge_ledger_reserved_bytes",
            "edge_ledger_capacity_bytes", "edge_worker_restarts", "edge_stage_up"} <= set(families)
    reserved = {s.labels["pool"]: s.value for s in families["edge_ledger_reserved_bytes"].samples}
    assert reserved["machine:ram"] > 0
    up = {(s.labels["pipeline"], s.labels["state"]) for s in families["edge_stage_up"].samples}
    assert up == {("slow", "ready"), ("fast", "ready")}


def _requests_counted(client: httpx.Client) -> dict[tuple[str, str, str], float]:
    """``edge_requests_total`` by (pipeline, route, outcome), as ``/metrics`` shows it now."""
    text = client.get("/metrics").text
    return {(s.labels["pipeline"], s.labels["route"], s.labels["outcome"]): s.value
            for family in text_string_to_metric_families(text) if family.name == "edge_requests"
            for s in family.samples if s.name == "edge_requests_total"}


def test_a_request_refused_before_routing_is_counted_under_the_route_its_path_matches(
        server: Served) -> None:
    run = "/v1/pipelines/{name}/run"
    big = {"inputs": {"x": _tensor(np.zeros(40_000, dtype=np.float32))}}  # over 64 KiB
    with _client(server) as client, _client(server, key=None) as anonymous:
        before = _requests_counted(client)
        # refused by the guards, before Starlette routes them
        assert client.post("/v1/pipelines/fast/run", json=big).status_code == 413
        assert anonymous.post("/v1/pipelines/fast/run", json={}).status_code == 401
        assert client.post("/v1/nowhere/run", json=big).status_code == 413
        assert anonymous.post("/v1/nowhere/run", json={}).status_code == 401
        assert client.get("/v1/nowhere/run").status_code == 404
        after = _requests_counted(client)
    refused = {"too_large", "unauthorized", "not_found"}
    grew = {key: value - before.get(key, 0.0) for key, value in after.items()
            if key[2] in refused and value != before.get(key, 0.0)}
    assert grew == {("fast", run, "too_large"): 1.0, ("fast", run, "unauthorized"): 1.0,
                    ("", "other", "too_large"): 1.0, ("", "other", "unauthorized"): 1.0,
                    ("", "other", "not_found"): 1.0}


def test_header_names_that_http_makes_case_insensitive_are_read_so(server: Served) -> None:
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        # the auth scheme's name and the media type are case-insensitive (RFC 9110)
        reply = client.post("/v1/pipelines/fast/run", content=json.dumps(x),
                            headers={"Authorization": f"bearer {API_KEY}",
                                     "Content-Type": "Application/JSON; charset=utf-8"})
        assert reply.status_code == 200, reply.text
        # the token itself is not
        wrong = client.post("/v1/pipelines/fast/run", json=x,
                            headers={"Authorization": f"Bearer {API_KEY.upper()}"})
        assert wrong.status_code == 401


def test_a_deadline_in_a_json_body_is_a_number_not_text(server: Served) -> None:
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    with _client(server) as client:
        reply = client.post("/v1/pipelines/fast/run", json={**x, "deadline_s": "1"})
        assert reply.status_code == 400
        assert _error(reply)["field"] == "deadline_s"


def test_a_method_a_route_does_not_serve_is_405_naming_those_it_does(server: Served) -> None:
    with _client(server) as client:
        reply = client.get("/v1/pipelines/fast/run")
        assert reply.status_code == 405
        assert reply.headers["allow"] == "POST"
        error = _error(reply)
        assert error["code"] == "method_not_allowed" and "GET" in error["message"]
        reply = client.delete("/health")
        assert reply.status_code == 405 and "GET" in reply.headers["allow"]


def test_a_405_is_counted_method_not_allowed_under_the_route_its_path_matches(
        server: Served) -> None:
    with _client(server) as client:
        before = _requests_counted(client)
        assert client.get("/v1/pipelines/fast/run").status_code == 405
        assert client.delete("/v1/pipelines/fast/run").status_code == 405
        assert client.post("/v1/pipelines").status_code == 405
        assert client.delete("/health").status_code == 405
        after = _requests_counted(client)
    grew = {key: value - before.get(key, 0.0) for key, value in after.items()
            if value != before.get(key, 0.0) and key[1] != "/metrics"}
    assert grew == {("fast", "/v1/pipelines/{name}/run", "method_not_allowed"): 2.0,
                    ("", "/v1/pipelines", "method_not_allowed"): 1.0,
                    ("", "/health", "method_not_allowed"): 1.0}


def _charged(client: httpx.Client) -> dict[str, Any]:
    """What requests hold now: each pipeline's in-flight calls and waiting requests, the
    ledger's reserved bytes, and how many stage calls were ever timed (a request that
    reached a stage adds one)."""
    held = {p["name"]: ([s["in_flight"] for s in p["stages"]], p["queue"]["waiting"])
            for p in client.get("/v1/pipelines").json()["pipelines"]}
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    reserved = {s.labels["pool"]: s.value
                for s in families["edge_ledger_reserved_bytes"].samples}
    stage_calls = sum(s.value for s in families["edge_stage_seconds"].samples
                      if s.name == "edge_stage_seconds_count")
    return {"held": held, "reserved": reserved, "stage_calls": stage_calls}


def test_a_param_the_final_stage_does_not_read_is_400_naming_it_and_nothing_is_charged(
        server: Served) -> None:
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    # every parameter the echo backend declares (BackendInfo.params) is accepted
    read = {"delay_s": 0.0, "crash": False, "fail_call": False, "allocate_mb": 0,
            "pad_output_bytes": 0,
            "stream_chunks": 0, "chunk_rate_hz": 0.0, "tokens_per_chunk": 1,
            "stall_after": None, "stall_s": 0.0}
    with _client(server) as client:
        _wait_ready(client)
        assert client.post("/v1/pipelines/fast/run",
                           json={**x, "params": read}).status_code == 200
        before = _charged(client)
        counted = _requests_counted(client)
        reply = client.post("/v1/pipelines/fast/run",
                            json={**x, "params": {"delay_s": 0.0, "max_tokns": 5}})
        assert reply.status_code == 400, reply.text
        error = _error(reply)
        assert error["field"] == "params.max_tokns" and error["code"] == "unsupported_parameter"
        assert error["kind"] == "UnsupportedParameter"
        assert error["message"].startswith("params.max_tokns: not a parameter of this "
                                           "pipeline (its final stage echo, on echo, reads: "
                                           "allocate_mb, chunk_rate_hz, crash, delay_s")
        assert error["message"].endswith("): 5")
        # the form's params (JSON text) are held to the same names
        reply = client.post("/v1/pipelines/fast/run", files={"file": ("a.png", b"png")},
                            data={"params": json.dumps({"Delay_s": 1})})
        assert reply.status_code == 400, reply.text
        assert _error(reply)["field"] == "params.Delay_s"
        assert _error(reply)["message"].endswith(": 1")
        assert _charged(client) == before
        after = _requests_counted(client)
    run = ("fast", "/v1/pipelines/{name}/run", "bad_request")
    assert after[run] - counted.get(run, 0.0) == 2.0


def test_a_query_parameter_is_400_naming_it_on_every_route_and_nothing_is_charged(
        server: Served) -> None:
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    with _client(server) as client:
        _wait_ready(client)
        before = _charged(client)
        reply = client.post("/v1/pipelines/fast/run?timeout=3", json=x)
        assert reply.status_code == 400, reply.text
        error = _error(reply)
        assert (error["field"], error["code"]) == ("query.timeout", "unsupported_parameter")
        assert error["message"] == ("query.timeout: not served (no route of this server "
                                    "reads a query parameter): 3")
        for path in ("/v1/pipelines?verbose=1", "/v1/pipelines/fast?verbose=1",
                     "/metrics?name[]=edge_requests_total", "/health?verbose=",
                     "/v1/models?limit=2", "/?key=abc"):
            reply = client.get(path)
            assert reply.status_code == 400, (path, reply.text)
            name = path.split("?")[1].split("=")[0]
            assert _error(reply)["field"] == f"query.{name}", path
        reply = client.post("/v1/completions?stream=true", json={"model": "fast"})
        assert reply.status_code == 400 and _error(reply)["field"] == "query.stream"
        reply = client.get("/health?&")  # a query string without a name=value pair
        assert reply.status_code == 400
        assert (_error(reply)["field"], _error(reply)["message"]) == (
            "query", "query: not served (no route of this server reads a query string): &")
        # a path no route serves is still 404, a method the route does not serve 405
        assert client.get("/nowhere?timeout=3").status_code == 404
        assert client.get("/v1/pipelines/fast/run?timeout=3").status_code == 405
        assert _charged(client) == before
        # without the query string the same request is served
        assert client.post("/v1/pipelines/fast/run", json=x).status_code == 200


def _form(boundary: str, *, end: str) -> bytes:
    """A multipart body with one file part, then ``end`` (the closing boundary, or less)."""
    return (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n").encode() \
        + bytes(range(256)) * 4 + end.encode()


def test_a_multipart_body_cut_short_is_400_naming_its_missing_boundary_and_logs_nothing(
        server: Served) -> None:
    boundary = "edgeboundary"
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    whole = _form(boundary, end=f"\r\n--{boundary}--\r\n")
    cut = {  # each ends before the closing boundary '--edgeboundary--'
        "mid-part": _form(boundary, end=""),
        "mid-delimiter": _form(boundary, end=f"\r\n--{boundary}-"),
        "a new part begun": _form(boundary, end=f"\r\n--{boundary}\r\n"),
        "mid-headers": f"--{boundary}\r\nContent-Disposition: form-da".encode(),
        "empty": b"",
    }
    with _client(server) as client:
        _wait_ready(client)
        before = _charged(client)
        logged = len(server.stderr)
        for name, body in cut.items():
            reply = client.post("/v1/pipelines/fast/run", content=body, headers=headers)
            assert reply.status_code == 400, (name, reply.text)
            error = _error(reply)
            assert (error["field"], error["kind"]) == ("body", "TruncatedMultipart"), name
            assert error["message"] == (
                "body: the multipart body ended before its closing boundary "
                f"'--{boundary}--' (a truncated upload): {len(body)} bytes received"), name
        # a body the parser cannot read says why, and the parser's warning stays out of
        # the server's log
        reply = client.post("/v1/pipelines/fast/run", content=b"junk\r\n" + whole,
                            headers=headers)
        assert reply.status_code == 400, reply.text
        error = _error(reply)
        assert (error["field"], error["kind"]) == ("body", "InvalidMultipart")
        assert error["message"] == ("body: not a valid multipart form: Expected boundary "
                                    "character 45, got 106 at index 2")
        # the whole body is read to its end: the refusal is about the pipeline, not the form
        reply = client.post("/v1/pipelines/fast/run", content=whole, headers=headers)
        assert reply.status_code == 400 and _error(reply)["field"] == "file"
        assert "names no 'prepare'" in _error(reply)["message"]
        assert _charged(client) == before
    time.sleep(0.5)  # the server's stderr is read by a thread of the fixture's
    assert server.stderr[logged:] == []


def test_a_file_to_a_pipeline_without_prepare_is_400_unsupported_before_it_waits(
        server: Served) -> None:
    x = {"inputs": {"x": _tensor(np.ones((2, 2), dtype=np.float32))}}
    with _client(server) as client, ThreadPoolExecutor(1) as pool:
        _wait_ready(client)
        assert client.get("/v1/pipelines/slow").json()["accepts"] == ["tensors"]
        # slow's one admission slot held, and it queues nothing (--queue-length slow=0):
        # a request that waited for admission would be 429, not this pipeline's 400
        busy = pool.submit(client.post, "/v1/pipelines/slow/run",
                           json={**x, "params": {"delay_s": 2.0}})
        deadline = time.monotonic() + 30.0
        while not client.get("/v1/pipelines/slow").json()["stages"][0]["in_flight"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        counted = _requests_counted(client)
        reply = client.post("/v1/pipelines/slow/run", files={"file": ("a.png", b"png")},
                            data={"deadline_s": "5"})
        assert busy.result().status_code == 200
        after = _requests_counted(client)
    assert reply.status_code == 400, reply.text
    body = reply.json()["error"]
    assert body == {
        "message": "file: pipelines[slow] names no 'prepare' function to read a file with: "
                   "send tensors as JSON",
        "type": "invalid_request_error", "param": "file", "code": "unsupported_parameter",
        "edge": {"status": 400, "kind": "UnsupportedParameter", "field": "file",
                 "reason": "pipelines[slow] names no 'prepare' function to read a file "
                           "with: send tensors as JSON"}}
    run = ("slow", "/v1/pipelines/{name}/run", "bad_request")
    assert after[run] - counted.get(run, 0.0) == 1.0
    assert after.get(("slow", "/v1/pipelines/{name}/run", "refused"), 0.0) == \
        counted.get(("slow", "/v1/pipelines/{name}/run", "refused"), 0.0)
