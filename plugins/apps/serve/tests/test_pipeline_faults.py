"""Errors of a pipeline's own code while a request runs, answered as the server's fault.

In-process: the ASGI application over real pipelines (real worker processes), driven
through httpx's ASGI transport. A stage's input transform that raises — a ``ConfigError``
from a ``Fanout`` it built wrong — is the pipeline's failure (500 ``transform_failed``),
never the client's (400); a transform's typed refusal of the request's own input, and a
malformed tensor refused before any stage, stay 400. After each, nothing is held and the
pipeline serves on; every test fails if it leaks a process, a segment or a descriptor.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_serve.app import ServerState, build_app
from edge_serve.served import ServedPipeline, private_upload_dir

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def _body(x: np.ndarray) -> dict[str, Any]:
    return {"inputs": {"x": {"dtype": str(x.dtype), "shape": list(x.shape),
                             "data": base64.b64encode(x.tobytes()).decode()}}}


GOOD = _body(np.ones((2, 2), np.float32))
NEGATIVE = _body(-np.ones((2, 2), np.float32))


def _two_stages(name: str, transform: str) -> dict[str, Any]:
    return {"name": name, "stages": [
        {"id": "a", "backend": {"name": "echo"}},
        {"id": "b", "backend": {"name": "echo"}, "input_transform": transform}]}


@pytest.fixture
def ledger() -> ResourceLedger:
    return ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])


@pytest.fixture
def pipelines(ledger: ResourceLedger) -> Iterator[dict[str, Pipeline]]:
    """``fanout``: echo, then echo behind a transform that builds a ``Fanout`` wrong;
    ``checked``: echo, then echo behind a transform that refuses a negative request input
    with ``InvalidValue`` naming ``inputs['x']``."""
    plugins = load_plugins(env={"EDGE_PLUGINS": "echo"})
    opened: dict[str, Pipeline] = {}
    try:
        for name, transform in (("fanout", "edge_echo.transforms:bad_fanout"),
                                ("checked", "edge_echo.transforms:refuse_negative_input")):
            opened[name] = Pipeline.open(load_pipeline(_two_stages(name, transform)),
                                         plugins, ledger, retire_deadline_s=3.0)
        yield opened
    finally:
        for pipeline in opened.values():
            pipeline.close()
        assert ledger.snapshot()["reservations"] == []


def _held(pipelines: dict[str, Pipeline]) -> dict[str, Any]:
    """What requests hold now: admission, each stage's outstanding calls and slots, and
    the workers (generation and state) serving."""
    return {name: (p.admission.used, [(s.outstanding, s.slots.used, s.generation,
                                       s.state.value) for s in p.stages])
            for name, p in pipelines.items()}


def test_a_transform_that_raises_config_error_is_500_naming_it_not_400(
        pipelines: dict[str, Pipeline], ledger: ResourceLedger,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The request was well formed; the pipeline's transform built a ``Fanout`` wrong and
    ``Fanout`` raised ``ConfigError``. It was answered 400 ``refused`` (``param``
    ``request``: the client told to mend a request that had nothing wrong): now 500
    ``transform_failed`` naming the stage's transform and the error's type and message,
    its traceback logged once. A transform's typed refusal of the request's own input and
    a malformed tensor stay 400; nothing is held afterwards and the pipelines serve on."""
    held = ledger.holdings()
    workers = _held(pipelines)
    with ThreadPoolExecutor(4) as executor:
        served = {name: ServedPipeline(p, executor, private_upload_dir())
                  for name, p in pipelines.items()}
        app = build_app(ServerState(served, ledger, max_body_bytes=1 << 20))

        async def scenario() -> dict[str, list[httpx.Response]]:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
                fanout = [await client.post("/v1/pipelines/fanout/run", json=GOOD)
                          for _ in range(2)]
                checked = [await client.post("/v1/pipelines/checked/run", json=body)
                           for body in (NEGATIVE, GOOD)]
                malformed = {"inputs": {"x": {**GOOD["inputs"]["x"], "shape": [3, 2]}}}
                cut = [await client.post(f"/v1/pipelines/{name}/run", json=malformed)
                       for name in ("fanout", "checked")]
                return {"fanout": fanout, "checked": checked, "malformed": cut}

        replies = asyncio.run(scenario())
    message = ("pipelines[fanout].stages[b].input_transform: transform "
               "edge_echo.transforms:bad_fanout raised ConfigError: Fanout.items[0]: must be "
               "a mapping of inputs: 'ndarray'")
    for reply in replies["fanout"]:
        assert reply.status_code == 500, reply.text
        assert reply.headers["x-should-retry"] == "false"
        error = reply.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "server_error", "transform_failed", None)
        assert error["message"] == message
        assert error["edge"] == {
            "status": 500, "kind": "TransformFailed",
            "field": "pipelines[fanout].stages[b].input_transform",
            "reason": "transform edge_echo.transforms:bad_fanout raised ConfigError"}
    refused, answered = replies["checked"]
    assert refused.status_code == 400, refused.text  # the request's own fault, still
    error = refused.json()["error"]
    assert (error["code"], error["edge"]["kind"], error["edge"]["field"]) == (
        "invalid_value", "InvalidValue", "inputs['x']")
    assert "must not be negative" in error["message"]
    assert answered.status_code == 200, answered.text
    for reply in replies["malformed"]:  # refused before any stage, as it was
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["edge"]["field"] == "inputs['x'].data"
    logged = capsys.readouterr().err
    assert logged.count("edge serve: error: ") == 1, logged  # once for two failures
    assert f"edge serve: error: {message} (answered 500; logged once per transform, " \
        "with its traceback):\nTraceback" in logged
    assert "return Fanout(items=[previous[\"x\"]])" in logged
    assert ledger.holdings() == held
    assert _held(pipelines) == workers  # nothing held, the same workers serve on
