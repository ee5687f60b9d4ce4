"""A stage that stops serving answers 503, and /health and /metrics say so.

In-process: the ASGI application over a real echo pipeline (a real worker process), driven
through httpx's ASGI transport. A running non-preemptible call is cancelled, which
retires its worker: the stage needs a restart until :meth:`StageRuntime.restart` reloads
it under a new generation, counted as a worker restart.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_serve.app import ServerState, build_app
from edge_serve.served import ServedPipeline, private_upload_dir

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

X = np.ones((2, 2), dtype=np.float32)
BODY = {"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                         "data": base64.b64encode(X.tobytes()).decode()}}}


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])
    config = load_pipeline({"name": "echo", "stages": [
        {"id": "e", "backend": {"name": "echo", "options": {"delay_s": 1.0}}}]})
    opened = Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger,
                           retire_deadline_s=3.0)
    try:
        yield opened
    finally:
        opened.close()
        assert ledger.snapshot()["reservations"] == []


def _up(text: str) -> dict[str, str]:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels["stage"]: s.labels["state"] for s in families["edge_stage_up"].samples}


def _restarts(text: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return sum(s.value for s in families["edge_worker_restarts"].samples
               if s.name == "edge_worker_restarts_total")


def test_a_stage_that_needs_a_restart_is_503_until_restarted(pipeline: Pipeline) -> None:
    with ThreadPoolExecutor(4) as executor:
        served = ServedPipeline(pipeline, executor, private_upload_dir())
        app = build_app(ServerState({"echo": served}, pipeline.ledger, max_body_bytes=1 << 20))

        async def scenario() -> None:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
                running = asyncio.ensure_future(client.post("/v1/pipelines/echo/run", json=BODY))
                await asyncio.sleep(0.3)  # the call is in the worker by now
                outcomes = await asyncio.to_thread(pipeline.cancel)
                assert outcomes == {"e": "retire-required"}
                cancelled = await running
                assert cancelled.status_code == 503
                assert cancelled.headers["retry-after"] == "1"
                health = await client.get("/health")
                assert health.status_code == 503
                echo = health.json()["pipelines"]["echo"]
                assert {k: echo[k] for k in ("state", "stages", "placement")} == {
                    "state": "degraded", "stages": {"e": "needs-restart"},
                    "placement": {"number": 1, "decision": "only", "switches": [],
                                  "background": None}}
                assert echo["memory"]["stages"]["e"]["over_demand"] is False  # its last peak
                refused = await client.post("/v1/pipelines/echo/run", json=BODY)
                assert refused.status_code == 503
                error = refused.json()["error"]
                assert error["edge"]["field"] == "pipelines[echo].stages[e].state"
                assert error["code"] == "stage_unavailable" and error["param"] is None
                assert "needs-restart" in error["message"]
                assert _up((await client.get("/metrics")).text) == {"e": "needs-restart"}
                listed = (await client.get("/v1/pipelines")).json()["pipelines"][0]
                assert listed["state"] == "degraded"

                await asyncio.to_thread(pipeline.stage("e").restart)
                assert (await client.get("/health")).status_code == 200
                answered = await client.post("/v1/pipelines/echo/run", json=BODY)
                assert answered.status_code == 200, answered.text
                text = (await client.get("/metrics")).text
                assert _up(text) == {"e": "ready"} and _restarts(text) == 1.0

        asyncio.run(scenario())


def test_a_stage_over_its_demand_still_serves_and_health_names_it() -> None:
    """Issue 32: a request makes the stage's peak outgrow its declared demand; /health stays
    200 (it still serves) and says so per pipeline and in ``memory_over_demand``."""
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])
    config = load_pipeline({"name": "echo", "stages": [
        {"id": "e", "backend": {"name": "echo"},
         "resources": {"demands": {"machine:ram": "96 MiB"}}}]})
    pipeline = Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger)
    try:
        with ThreadPoolExecutor(2) as executor:
            served = ServedPipeline(pipeline, executor, private_upload_dir())
            app = build_app(ServerState({"echo": served}, ledger, max_body_bytes=1 << 20))

            async def scenario() -> None:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport,
                                             base_url="http://edge") as client:
                    before = (await client.get("/health")).json()
                    assert before["memory_over_demand"] == []
                    small = await client.post("/v1/pipelines/echo/run", json=BODY)
                    assert small.status_code == 200, small.text
                    large = await client.post("/v1/pipelines/echo/run",
                                              json={**BODY, "params": {"allocate_mb": 128}})
                    assert large.status_code == 200, large.text
                    health = await client.get("/health")
                    assert health.status_code == 200  # over its demand, still serving
                    body = health.json()
                    assert body["status"] == "ok" and body["memory_over_demand"] == ["echo/e"]
                    echo = body["pipelines"]["echo"]
                    assert echo["state"] == "ready" and echo["memory"]["over_demand"] == ["e"]
                    ram = echo["memory"]["stages"]["e"]["pools"]["machine:ram"]
                    assert ram["verdict"] == "over" and ram["demand_bytes"] == 96 * 2**20
                    assert ram["peak_bytes"] > 96 * 2**20 and ram["peak_over_demand"] > 1.0
                    plan = (await client.get("/v1/pipelines/echo")).json()["plan"]
                    assert plan["memory_over_demand"] == ["e"]
                    again = await client.post("/v1/pipelines/echo/run", json=BODY)
                    assert again.status_code == 200, again.text

            asyncio.run(scenario())
    finally:
        pipeline.close()
    assert ledger.snapshot()["reservations"] == []


def test_a_restart_refused_for_a_rewritten_bundle_is_503_naming_why(
        tmp_path: Path) -> None:
    """An ort-cpu stage verified in place, its bundle rewritten (consistently: a fresh
    verification passes), its worker SIGKILLed: the restart is refused with BundleChanged,
    and the 503 says so, naming the manifest and both sha256s."""
    from edge_core.artifacts import create_manifest, verify_bundle
    from edge_ort.bundles import EXAMPLE_X, write_add_relu_bundle

    bundle = write_add_relu_bundle(tmp_path / "b")
    opened = verify_bundle(bundle, stage=False).manifest_sha256
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])
    config = load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu", "options": {"stage_bundle": False}},
         "manifest": str(bundle), "restart": "on-failure", "max_restarts": 1,
         "restart_backoff_s": 0.0}]})
    pipeline = Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}), ledger,
                             retire_deadline_s=3.0)
    try:
        x = EXAMPLE_X + 1  # another example: another manifest, the same graph
        np.savez(bundle / "example_inputs.npz", x=x)
        np.savez(bundle / "expected.npz", y=np.maximum(x + x, 0))
        create_manifest(bundle, component="add-relu", example_inputs="example_inputs.npz",
                        expected_outputs="expected.npz", precision="fp32",
                        exporter="onnx.helper", overwrite=True)
        rewritten = verify_bundle(bundle, stage=False).manifest_sha256
        (runtime,) = pipeline.stages
        os.kill(int(str(runtime.loaded.describe()["pid"])), signal.SIGKILL)
        end = time.monotonic() + 60.0
        while time.monotonic() < end and (runtime.state.value != "failed"
                                          or runtime.restarter.pending):
            time.sleep(0.05)
        assert runtime.state.value == "failed" and not runtime.restarter.pending
        with ThreadPoolExecutor(2) as executor:
            served = ServedPipeline(pipeline, executor, private_upload_dir())
            app = build_app(ServerState({"p": served}, ledger, max_body_bytes=1 << 20))
            body = {"inputs": {"x": {"dtype": "float32", "shape": [2, 3],
                                     "data": base64.b64encode(EXAMPLE_X.tobytes()).decode()}}}

            async def scenario() -> httpx.Response:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport,
                                             base_url="http://edge") as client:
                    return await client.post("/v1/pipelines/p/run", json=body)

            refused = asyncio.run(scenario())
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "stage_unavailable"
        assert "BundleChanged" in error["message"]
        assert str(bundle / "edge-manifest.json") in error["message"]
        assert opened in error["message"] and rewritten in error["message"]
    finally:
        pipeline.close()
    assert ledger.snapshot()["reservations"] == []
