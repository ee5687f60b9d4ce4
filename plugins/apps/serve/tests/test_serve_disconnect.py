"""A graph request whose client disconnects is cancelled alone, through a real ``edge serve``.

Two echo pipelines at admission 1, each stage a real worker process: ``held``
(``echo-preemptible``: cancelled in place) and ``blocking`` (plain ``echo``: a running call
cannot be stopped in place). A client sends a slow request (``params.delay_s``), the
server is seen holding the pipeline's only admission slot (another request is refused
429), and the client closes its socket. The request is then counted ``cancelled``. On the
preemptible stage the slot is free at once; on the non-preemptible one the call is left
to finish in its worker — the worker is not retired (same pid and generation, the stage
stays ``ready``) — and the slot is free once that call ends. After SIGTERM nothing is
left (:func:`serving.running` checks processes, segments and the ledger).
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import Served, echo_pipeline, running

pytestmark = pytest.mark.slow

X = np.ones((2, 2), dtype=np.float32)
BODY = {"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                         "data": base64.b64encode(X.tobytes()).decode()}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("disconnect")
    pipelines = [echo_pipeline(folder, "held", backend="echo-preemptible"),
                 echo_pipeline(folder, "blocking")]  # no restart policy: none is needed
    with running(pipelines, "--queue-length", "0") as served:  # full: refused at once
        yield served


def _send_slow(server: Served, name: str, delay_s: float) -> socket.socket:
    """Send a request taking ``delay_s`` on a raw socket and return it, unread."""
    url = urlsplit(server.url)
    body = json.dumps({**BODY, "params": {"delay_s": delay_s}}).encode()
    head = (f"POST /v1/pipelines/{name}/run HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    sock = socket.create_connection((url.hostname, url.port), timeout=30)
    sock.sendall(head.encode() + body)
    return sock


def _outcomes(client: httpx.Client, name: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if (sample.name == "edge_requests_total" and sample.labels["pipeline"] == name
                    and sample.labels["route"] == "/v1/pipelines/{name}/run"):
                found[sample.labels["outcome"]] = sample.value
    return found


def _wait(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _disconnect_while_held(client: httpx.Client, server: Served, name: str,
                           delay_s: float = 30.0) -> None:
    """Hold the pipeline's one slot with a slow request, check it is held, hang up."""
    sock = _send_slow(server, name, delay_s)
    try:
        # seen in flight without taking the slot (a probe request could take it first)
        _wait(lambda: client.get(f"/v1/pipelines/{name}").json()["stages"][0]["in_flight"] == 1,
              "the slow request never reached the stage")
        # admission 1 and no deadline: a second request is refused while the first runs
        assert client.post(f"/v1/pipelines/{name}/run", json=BODY).status_code == 429
    finally:
        sock.close()
    _wait(lambda: _outcomes(client, name).get("cancelled", 0.0) >= 1.0,
          f"the disconnect was not counted as cancelled: {_outcomes(client, name)}")


def test_a_disconnected_client_cancels_its_request_in_place_and_frees_admission(
        server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        before = client.get("/v1/pipelines/held").json()["stages"][0]["generation"]
        _disconnect_while_held(client, server, "held")
        # The slot is free now, 30 s before the slow request would have ended: a request
        # without a deadline (refused at once when the slot is taken) is served.
        reply = client.post("/v1/pipelines/held/run", json=BODY)
        assert reply.status_code == 200, reply.text
        y = np.frombuffer(base64.b64decode(reply.json()["outputs"]["x"]["data"]), np.float32)
        np.testing.assert_array_equal(y, X.ravel() * 2)
        # Cancelled in place: the same worker generation serves on, nothing else failed.
        stage = client.get("/v1/pipelines/held").json()["stages"][0]
        assert stage["state"] == "ready" and stage["generation"] == before
        outcomes = _outcomes(client, "held")
    assert outcomes.get("cancelled") == 1.0 and outcomes.get("error", 0.0) == 0.0, outcomes


def _worker(client: httpx.Client, name: str) -> tuple[str, int, int]:
    """The pipeline's stage: its state, worker generation and worker pid."""
    shown = client.get(f"/v1/pipelines/{name}").json()
    stage = shown["stages"][0]
    return stage["state"], stage["generation"], shown["plan"]["stages"][0]["worker"]["pid"]


def test_a_disconnect_on_a_non_preemptible_stage_leaves_the_call_to_finish_and_keeps_the_worker(
        server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        before = _worker(client, "blocking")
        assert before[0] == "ready"
        # The call sleeps 4 s in the worker and cannot be stopped there; the disconnect
        # fences the request (counted cancelled) without retiring anything.
        _disconnect_while_held(client, server, "blocking", delay_s=4.0)
        assert _worker(client, "blocking") == before  # same worker, generation, ready
        assert client.get("/health").status_code == 200
        # The admission slot comes back when the worker has finished the call (its result
        # discarded): a request without a deadline, refused 429 until then, is served.
        _wait(lambda: client.post("/v1/pipelines/blocking/run", json=BODY).status_code == 200,
              "the admission slot never came back")
        reply = client.post("/v1/pipelines/blocking/run", json=BODY)
        assert reply.status_code == 200, reply.text
        y = np.frombuffer(base64.b64decode(reply.json()["outputs"]["x"]["data"]), np.float32)
        np.testing.assert_array_equal(y, X.ravel() * 2)
        assert _worker(client, "blocking") == before
        outcomes = _outcomes(client, "blocking")
    assert outcomes.get("cancelled") == 1.0 and outcomes.get("error", 0.0) == 0.0, outcomes


def _hang_up_mid_body(server: Served, name: str, content_type: str, body: bytes) -> None:
    """Declare ``body``'s length, send half of it and close the connection."""
    url = urlsplit(server.url)
    head = (f"POST /v1/pipelines/{name}/run HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(head.encode() + body[: len(body) // 2])
        time.sleep(0.2)


def test_a_client_gone_before_its_body_was_read_is_cancelled_not_a_server_error(
        server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        before = _outcomes(client, "blocking")
        _hang_up_mid_body(server, "blocking", "application/json", json.dumps(BODY).encode())
        _wait(lambda: _outcomes(client, "blocking").get("cancelled", 0.0)
              >= before.get("cancelled", 0.0) + 1.0,
              f"a JSON body cut short was not counted cancelled: {_outcomes(client, 'blocking')}")
        boundary = "edgeboundary"
        form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"page.png\"\r\nContent-Type: image/png\r\n\r\n").encode() \
            + bytes(4096) + f"\r\n--{boundary}--\r\n".encode()
        _hang_up_mid_body(server, "blocking", f"multipart/form-data; boundary={boundary}", form)
        _wait(lambda: _outcomes(client, "blocking").get("cancelled", 0.0)
              >= before.get("cancelled", 0.0) + 2.0,
              f"a form cut short was not counted cancelled: {_outcomes(client, 'blocking')}")
        after = _outcomes(client, "blocking")
        assert after.get("error", 0.0) == before.get("error", 0.0), after
        assert after.get("bad_request", 0.0) == before.get("bad_request", 0.0), after
        assert client.post("/v1/pipelines/blocking/run", json=BODY).status_code == 200
    log = "".join(server.stderr)
    assert "Traceback" not in log and "ClientDisconnect" not in log, log
