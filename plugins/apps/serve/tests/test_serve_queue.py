"""The admission queue through a real ``edge serve``: wait in order, refuse only when full.

Three echo pipelines at admission 1, each stage a real worker process taking ``DELAY_S`` a
call: ``wide`` with the default length (its wait raised to 60 s for a loaded machine),
``short`` with ``--queue-length short=2`` and the default wait, ``brief`` with
``--queue-wait brief=0.5``. Four clients at once on ``wide`` are all answered; a burst on
``short`` beyond its slot and its two places gets 429 with ``Retry-After``; a deadline that
passes while waiting is 504 and leaves the stage serving, and so is a request without one
that waits past its queue's wait limit; a client that disconnects while waiting leaves
the queue; each pipeline shows its own queue's length and wait (the defaults: 64 and 30 s). After
each, nothing waits and nothing is in flight; after SIGTERM no process, segment or
reservation is left (:func:`serving.running` checks them).
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import EDGE, Served, echo_pipeline, running

pytestmark = pytest.mark.slow

DELAY_S = 0.8
BRIEF_WAIT_S = 0.5  # ``brief``'s queue wait (--queue-wait brief=0.5)
X = np.ones((2, 2), dtype=np.float32)
BODY = {"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                         "data": base64.b64encode(X.tobytes()).decode()}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("queue")
    pipelines = [echo_pipeline(folder, "wide", delay_s=DELAY_S),
                 echo_pipeline(folder, "short", delay_s=DELAY_S),
                 echo_pipeline(folder, "brief", delay_s=DELAY_S)]
    with running(pipelines, "--queue-length", "short=2", "--queue-wait", "wide=60",
                 "--queue-wait", f"brief={BRIEF_WAIT_S}") as served:
        yield served


def _families(client: httpx.Client) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}


def _sample(families: dict[str, Any], family: str, name: str, **labels: str) -> float:
    return sum(s.value for s in families[family].samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _wait(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _settled(client: httpx.Client, name: str) -> None:
    """Nothing of ``name`` waits or runs any more."""
    def idle() -> bool:
        shown = client.get(f"/v1/pipelines/{name}").json()
        return shown["queue"]["waiting"] == 0 and shown["stages"][0]["in_flight"] == 0
    _wait(idle, f"{name}: requests still waiting or in flight")


def _send(server: Served, name: str, body: dict[str, Any]) -> socket.socket:
    """Send a request on a raw socket and return the socket, unread."""
    url = urlsplit(server.url)
    data = json.dumps(body).encode()
    head = (f"POST /v1/pipelines/{name}/run HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    sock = socket.create_connection((url.hostname, url.port), timeout=60)
    sock.sendall(head.encode() + data)
    return sock


def test_four_clients_at_admission_1_are_all_answered_in_turn(server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client, ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: client.post("/v1/pipelines/wide/run", json=BODY),
                                range(4)))
        assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
        for reply in replies:
            assert reply.json()["outputs"]["x"]["shape"] == [2, 2]
        _settled(client, "wide")
        families = _families(client)
    # one of them entered at once; the others waited their turn, none was refused
    assert _sample(families, "edge_queue_wait_seconds", "edge_queue_wait_seconds_count",
                   pipeline="wide") >= 4
    assert _sample(families, "edge_queue_wait_seconds", "edge_queue_wait_seconds_sum",
                   pipeline="wide") > DELAY_S
    assert _sample(families, "edge_queue_refusals", "edge_queue_refusals_total",
                   pipeline="wide") == 0
    assert _sample(families, "edge_queue_limit", "edge_queue_limit", pipeline="wide") == 64


def test_a_full_queue_is_429_with_retry_after(server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client, ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: client.post("/v1/pipelines/short/run", json=BODY),
                                range(6)))
        codes = sorted(r.status_code for r in replies)
        # one runs, two wait, the rest find the queue full (fewer when the machine is so
        # loaded that the burst arrives spread over more than a call)
        assert set(codes) <= {200, 429} and codes.count(200) >= 3, codes
        assert codes.count(429) >= 1, codes
        for reply in replies:
            if reply.status_code == 429:
                assert int(reply.headers["retry-after"]) >= 1
                error = reply.json()["error"]
                assert error["edge"]["field"] == "admission"
                assert error["edge"]["kind"] == "QueueFull"
                assert "--queue-length" in error["message"]
        _settled(client, "short")
        families = _families(client)
    assert _sample(families, "edge_queue_refusals", "edge_queue_refusals_total",
                   pipeline="short", reason="full") == codes.count(429)
    assert _sample(families, "edge_admission_refusals", "edge_admission_refusals_total",
                   pipeline="short") == codes.count(429)
    assert _sample(families, "edge_queue_limit", "edge_queue_limit", pipeline="short") == 2


def test_a_deadline_passing_while_waiting_is_504_and_the_stage_keeps_serving(
        server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        sock = _send(server, "wide", {**BODY, "params": {"delay_s": 3.0}})
        try:
            _wait(lambda: client.get("/v1/pipelines/wide").json()["stages"][0]["in_flight"]
                  == 1, "the slow request never reached the stage")
            reply = client.post("/v1/pipelines/wide/run", json={**BODY, "deadline_s": 0.5})
            assert reply.status_code == 504, reply.text
            error = reply.json()["error"]["edge"]
            assert error["field"] == "deadline_s" and "waited for admission" in error["reason"]
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # the first one is served
        finally:
            sock.close()
        _settled(client, "wide")
        # it never reached the stage: the worker was not retired, the stage stays ready
        shown = client.get("/v1/pipelines/wide").json()["stages"][0]
        assert shown["state"] == "ready" and shown["generation"] == 1
        assert client.post("/v1/pipelines/wide/run", json=BODY).status_code == 200
        families = _families(client)
    assert _sample(families, "edge_queue_refusals", "edge_queue_refusals_total",
                   pipeline="wide", reason="deadline") == 1


def test_waiting_past_the_queues_wait_limit_is_504_and_the_stage_keeps_serving(
        server: Served) -> None:
    """A request without ``deadline_s`` waits at most its queue's ``--queue-wait``."""
    with httpx.Client(base_url=server.url, timeout=120) as client:
        before = _families(client)
        sock = _send(server, "brief", {**BODY, "params": {"delay_s": 3.0}})
        try:
            _wait(lambda: client.get("/v1/pipelines/brief").json()["stages"][0]["in_flight"]
                  == 1, "the slow request never reached the stage")
            started = time.monotonic()
            reply = client.post("/v1/pipelines/brief/run", json=BODY)
            waited = time.monotonic() - started
            assert reply.status_code == 504, reply.text
            error = reply.json()["error"]
            assert error["edge"]["field"] == "queue.wait_s", error
            assert error["edge"]["kind"] == "DeadlineExceeded", error
            assert "--queue-wait" in error["message"], error
            assert error["message"].endswith(f": {BRIEF_WAIT_S}"), error  # the limit, named
            assert waited >= BRIEF_WAIT_S  # refused once the limit passed, not before
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # the first one is served
        finally:
            sock.close()
        _settled(client, "brief")
        shown = client.get("/v1/pipelines/brief").json()["stages"][0]
        assert shown["state"] == "ready" and shown["generation"] == 1
        assert client.post("/v1/pipelines/brief/run", json=BODY).status_code == 200
        after = _families(client)
    assert (_sample(after, "edge_queue_refusals", "edge_queue_refusals_total",
                    pipeline="brief", reason="deadline")
            - _sample(before, "edge_queue_refusals", "edge_queue_refusals_total",
                      pipeline="brief", reason="deadline")) == 1


def test_each_pipeline_shows_its_queue_with_the_defaults_where_not_set(
        server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        queues = {name: client.get(f"/v1/pipelines/{name}").json()["queue"]
                  for name in ("wide", "short", "brief")}
        families = _families(client)
    assert {name: (q["length"], q["wait_s"]) for name, q in queues.items()} == {
        "wide": (64, 60.0), "short": (2, 30.0), "brief": (64, BRIEF_WAIT_S)}
    for name, queue in queues.items():
        assert _sample(families, "edge_queue_limit", "edge_queue_limit",
                       pipeline=name) == queue["length"]


def test_a_client_disconnecting_while_queued_leaves_the_queue(server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        before = _families(client)
        running_sock = _send(server, "wide", {**BODY, "params": {"delay_s": 3.0}})
        try:
            _wait(lambda: client.get("/v1/pipelines/wide").json()["stages"][0]["in_flight"]
                  == 1, "the slow request never reached the stage")
            queued = _send(server, "wide", BODY)
            _wait(lambda: client.get("/v1/pipelines/wide").json()["queue"]["waiting"] == 1,
                  "the second request never queued")
            text = client.get("/metrics").text
            assert 'edge_queue_length{pipeline="wide"} 1.0' in text
            queued.close()  # gone while waiting
            _wait(lambda: client.get("/v1/pipelines/wide").json()["queue"]["waiting"] == 0,
                  "the disconnected request stayed in the queue")
        finally:
            running_sock.close()
        _settled(client, "wide")
        assert client.post("/v1/pipelines/wide/run", json=BODY).status_code == 200
        after = _families(client)
    assert (_sample(after, "edge_queue_refusals", "edge_queue_refusals_total",
                    pipeline="wide", reason="disconnected")
            - _sample(before, "edge_queue_refusals", "edge_queue_refusals_total",
                      pipeline="wide", reason="disconnected")) == 1


def test_queue_options_name_their_flag_and_value(tmp_path: Any) -> None:
    path = echo_pipeline(tmp_path, "one")
    for args, shown in ((["--queue-length", "nope=3"], "no pipeline named 'nope'"),
                        (["--queue-length", "-1"], "--queue-length: queue length: must be"),
                        (["--queue-wait", "one=0"], "--queue-wait: queue wait: must be"),
                        (["--queue-wait", "x"], "--queue-wait: not a number: x")):
        done = subprocess.run([EDGE, "serve", str(path), "--port", "0", *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (args, done.stderr)
        assert shown in done.stderr, (args, done.stderr)
