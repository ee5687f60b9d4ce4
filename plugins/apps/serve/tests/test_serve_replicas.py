"""A replicated stage under ``edge serve``: one replica lost, the others serve on.

Two echo replicas in real worker processes (``restart = "never"``). Killing one worker
leaves the stage ``degraded``: requests are still answered by the other replica (the
runtime sends them there: docs/runtime.md, "When a replica fails"), ``/health`` says
which replica failed, and ``GET /v1/pipelines`` lists each replica's own state. Killing
the other too makes the stage ``unavailable``: requests are refused 503.
"""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from serving import Served, echo_pipeline, running

pytestmark = pytest.mark.slow

X = np.ones((2, 2), dtype=np.float32)
BODY = {"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                         "data": base64.b64encode(X.tobytes()).decode()}}}


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("replicas")
    with running([echo_pipeline(folder, "pair", admission=2, stage="replicas = 2")]) as served:
        yield served


def _listed(client: httpx.Client) -> list[dict[str, object]]:
    stages: list[dict[str, object]] = client.get("/v1/pipelines/pair").json()["stages"]
    return stages


def _kill_replica(client: httpx.Client, replica: int) -> None:
    plan = client.get("/v1/pipelines/pair").json()["plan"]
    (entry,) = [s for s in plan["stages"] if s["replica"] == replica]
    os.kill(int(entry["worker"]["pid"]), signal.SIGKILL)
    deadline = time.monotonic() + 30.0
    while next(s for s in _listed(client) if s["replica"] == replica)["replica_state"] \
            == "ready":
        assert time.monotonic() < deadline, "the killed replica never left ready"
        time.sleep(0.05)


def test_a_lost_replica_leaves_the_stage_degraded_and_serving(server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        listed = _listed(client)
        assert [(s["replica"], s["replica_state"]) for s in listed] == [(0, "ready"),
                                                                       (1, "ready")]
        _kill_replica(client, 1)
        assert {s["state"] for s in _listed(client)} == {"degraded"}
        assert [s["replica_state"] for s in _listed(client)] == ["ready", "failed"]
        for _ in range(3):  # the other replica answers every one
            reply = client.post("/v1/pipelines/pair/run", json=BODY)
            assert reply.status_code == 200, reply.text
        health = client.get("/health")
        assert health.status_code == 503  # not every stage is ready
        assert health.json()["pipelines"]["pair"]["stages"] == {"echo": "degraded"}
        _kill_replica(client, 0)
        reply = client.post("/v1/pipelines/pair/run", json=BODY)
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "stage_unavailable"
        assert client.get("/health").json()["pipelines"]["pair"]["stages"] == {
            "echo": "unavailable"}
