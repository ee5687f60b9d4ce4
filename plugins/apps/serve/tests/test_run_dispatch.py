"""The run route taken before Starlette's router answers every request as the router did.

``POST /v1/pipelines/NAME/run`` goes straight to the run route's own stack
(:class:`~edge_serve.app.EdgeApp`); every other request goes through Starlette's middleware
and router. Each request here is sent twice to the same application over a real echo
pipeline (a real worker process): through the application as the server calls it, and
through Starlette's own ``__call__`` (its ``ServerErrorMiddleware``, the middleware, its
``ExceptionMiddleware`` and router: the path every request took before). Both must give
the same status, headers, body, raised error and count on ``/metrics``, for every way a
request to that path is answered or refused: served, another method on it, a slash more,
an unknown pipeline, a name with a slash, a query, no bearer token, a body over the limit
(declared or chunked), a body that stalls, a client gone before its body, a wrong content
type, and an error no handler takes (a 500, raised on for the server to log). The
requests that may take the direct path must not enter Starlette's router; the others must.
One difference is not a client's: an error raised while the answer is being sent (its
start gone out) is raised on as it is, where Starlette's ``ExceptionMiddleware`` raised its
own ``RuntimeError`` for a type it has a handler for and ``ServerErrorMiddleware`` logged a
500 it could not send (review 39b); the client gets the same either way.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np
import pytest
from starlette.applications import Starlette

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_serve.app import EdgeApp, ServerState, build_app
from edge_serve.served import ServedPipeline, private_upload_dir

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

KEY = "sesame"
LIMIT = 4096
X = np.arange(4, dtype=np.float32).reshape(2, 2)
BODY = json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                                    "data": base64.b64encode(X.tobytes()).decode()}}}).encode()
JSON = [(b"content-type", b"application/json")]
AUTH = [(b"authorization", f"Bearer {KEY}".encode())]


@dataclass
class Case:
    """One request: what is sent, and how it is answered (the same on both paths)."""

    method: str = "POST"
    path: str = "/v1/pipelines/echo/run"
    query: bytes = b""
    headers: Sequence[tuple[bytes, bytes]] = ()
    chunks: Sequence[bytes] = (BODY,)  # the body's messages; () : none come (a stall)
    declare: bool = True  # a Content-Length header
    disconnect: bool = False  # http.disconnect in place of the body
    auth: bool = True  # the bearer token
    direct: bool = True  # may take the direct path
    routed: bool = True  # reaches the router through Starlette's stack (not refused before)
    status: int = 200
    kind: str | None = None  # the error's edge.kind
    raises: type[BaseException] | None = None


CASES = {
    "served": Case(headers=JSON),
    "another method": Case(method="GET", direct=False, status=405, kind="BadMethod"),
    "a slash more": Case(path="/v1/pipelines/echo/run/", headers=JSON, direct=False,
                         status=404, kind="NotFound"),
    "unknown pipeline": Case(path="/v1/pipelines/nope/run", headers=JSON, status=404,
                             kind="NotFound"),
    "a name with a slash": Case(path="/v1/pipelines/echo/x/run", headers=JSON, direct=False,
                                status=404, kind="NotFound"),
    "no name": Case(path="/v1/pipelines//run", headers=JSON, direct=False, status=404,
                    kind="NotFound"),
    "no bearer token": Case(headers=JSON, auth=False, routed=False, status=401,
                            kind="Unauthorized"),
    "a query": Case(query=b"x=1", headers=JSON, status=400, kind="UnsupportedParameter"),
    "wrong content type": Case(headers=[(b"content-type", b"text/plain")], status=400,
                               kind="InvalidValue"),
    "declared over the limit": Case(headers=JSON, chunks=(b"{" + b" " * LIMIT + b"}",),
                                    routed=False, status=413, kind="BodyTooLarge"),
    "chunked over the limit": Case(headers=JSON, declare=False,
                                   chunks=(b"{" + b" " * (LIMIT // 2),) * 3, status=413,
                                   kind="BodyTooLarge"),
    "a body that stalls": Case(headers=JSON, chunks=(), status=408, kind="BodyTimeout"),
    "gone before its body": Case(headers=JSON, disconnect=True, status=499,
                                 kind="ClientDisconnected"),
    "an error no handler takes": Case(headers=JSON, status=500, kind="RuntimeError",
                                      raises=RuntimeError),
}


@dataclass
class Reply:
    """What the application sent, what it raised, what it counted, whether it routed."""

    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    raised: type[BaseException] | None = None
    counted: dict[tuple[str, ...], float] = field(default_factory=dict)
    routed: bool = False


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])
    config = load_pipeline({"name": "echo", "admission": 2,
                            "stages": [{"id": "echo", "backend": {"name": "echo"}}]})
    opened = Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger,
                           retire_deadline_s=3.0)
    try:
        yield opened
    finally:
        opened.close()
        assert ledger.snapshot()["reservations"] == []


def _counts(state: ServerState) -> dict[tuple[str, ...], float]:
    (family,) = state.metrics.requests.collect()
    return {(s.labels["pipeline"], s.labels["route"], s.labels["outcome"]): s.value
            for s in family.samples if s.name == "edge_requests_total"}


def _send(app: Any, state: ServerState, case: Case, loop: asyncio.AbstractEventLoop) -> Reply:
    """``case`` through ``app`` (an ASGI callable) on ``loop``, as uvicorn hands it over.

    One loop for both paths, as the server has one (the body guard's timer is the loop's).
    """
    reply = Reply()
    body = b"".join(case.chunks)
    headers = [(b"host", b"edge"), *case.headers, *(AUTH if case.auth else [])]
    if case.declare:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 40000), "scheme": "http", "method": case.method,
             "root_path": "", "path": case.path, "raw_path": case.path.encode(),
             "query_string": case.query, "headers": headers}
    before = _counts(state)

    async def scenario() -> None:
        never: asyncio.Future[None] = loop.create_future()
        messages = [{"type": "http.request", "body": chunk,
                     "more_body": number < len(case.chunks) - 1}
                    for number, chunk in enumerate(case.chunks)]
        if case.disconnect:
            messages = [{"type": "http.disconnect"}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await never  # no more comes (a stall), and the client stays
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                reply.status = message["status"]
                reply.headers = dict(message.get("headers", []))
            elif message["type"] == "http.response.body":
                reply.body += message.get("body", b"")

        try:
            await app(scope, receive, send)
        except Exception as exc:
            reply.raised = type(exc)
        finally:
            never.cancel()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.endswith("starlette/routing.py") \
                and frame.f_code.co_name == "app":
            reply.routed = True

    sys.setprofile(profile)
    try:
        loop.run_until_complete(scenario())
    finally:
        sys.setprofile(None)
    after = _counts(state)
    reply.counted = {labels: n - before.get(labels, 0.0) for labels, n in after.items()
                     if n != before.get(labels, 0.0)}
    return reply


@pytest.mark.parametrize("name", list(CASES))
def test_a_request_to_the_run_path_is_answered_as_starlettes_router_answered_it(
    name: str, pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = CASES[name]
    with ThreadPoolExecutor(4) as executor:
        served = ServedPipeline(pipeline, executor, private_upload_dir())
        if case.raises is not None:  # a fault no handler takes, inside the route
            def broken() -> None:
                raise RuntimeError("a fault inside the route")

            monkeypatch.setattr(served, "require_ready", broken)
        state = ServerState({"echo": served}, pipeline.ledger, max_body_bytes=LIMIT,
                            body_timeout_s=0.05)
        app = build_app(state, api_key=KEY)
        assert isinstance(app, EdgeApp)
        loop = asyncio.new_event_loop()
        try:
            direct = _send(app, state, case, loop)
            routed = _send(lambda *sent: Starlette.__call__(app, *sent), state, case, loop)
        finally:
            loop.close()
    assert direct.routed is (case.routed and not case.direct)  # the direct path: none
    assert routed.routed is case.routed
    assert direct.status == routed.status == case.status, (direct, routed)
    assert direct.raised is routed.raised is case.raises
    for reply in (direct, routed):
        assert reply.headers[b"content-length"] == str(len(reply.body)).encode()
    # (an answer's length varies with the latencies it shows)
    assert {**direct.headers, b"content-length": b""} == {**routed.headers,
                                                          b"content-length": b""}
    assert direct.counted == routed.counted
    assert sum(direct.counted.values()) == 1
    if case.status == 200:
        for reply in (direct, routed):
            data = json.loads(reply.body)["outputs"]["x"]["data"]
            assert np.frombuffer(base64.b64decode(data), np.float32).tolist() == \
                (X * 2).ravel().tolist()
        ((pipeline_name, route, outcome),) = direct.counted
        assert (pipeline_name, route, outcome) == ("echo", "/v1/pipelines/{name}/run", "ok")
    else:
        assert direct.body == routed.body
        assert json.loads(direct.body)["error"]["edge"]["kind"] == case.kind

