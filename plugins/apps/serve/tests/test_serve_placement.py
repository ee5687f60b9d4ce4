"""``edge serve`` says which backend served each request, and shows a first-ready switch.

A real server process over the synthetic ``faster-slow-to-open`` pipeline
(:mod:`edge_echo.synthetic`): it serves on the candidate that opens at once, measures
the one that loads in seconds in the background, and switches. Every answer carries its
placement receipt; ``/health`` and ``/metrics`` show the switch.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import running

from edge_echo.synthetic import SCALE, pipeline, workload_inputs, write_workload

pytestmark = pytest.mark.slow


def _tensor(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": str(array.dtype), "shape": list(array.shape),
            "data": base64.b64encode(array.tobytes()).decode()}


def _decode(tensor: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(tensor["data"])
    return np.frombuffer(raw, dtype=tensor["dtype"]).reshape(tensor["shape"])


def test_answers_carry_their_placement_and_the_switch_is_in_health_and_metrics(
        tmp_path: Path) -> None:
    document = pipeline("faster-slow-to-open", load_delay_s=2.0,
                        workload=[str(write_workload(tmp_path))],
                        measurement={"min_samples": 3, "max_samples": 6})
    file = tmp_path / "first-ready.json"
    file.write_text(json.dumps(document))
    x = workload_inputs()["x"]
    with running([file]) as served, httpx.Client(base_url=served.url, timeout=60.0) as client:
        def run() -> dict[str, Any]:
            reply = client.post("/v1/pipelines/faster-slow-to-open/run",
                                json={"inputs": {"x": _tensor(x)}})
            assert reply.status_code == 200, reply.text
            body: dict[str, Any] = reply.json()
            np.testing.assert_array_equal(_decode(body["outputs"]["x"]),
                                          x * np.float32(SCALE))
            return body

        first = run()["placement"]
        assert [s["stage"] for s in first] == ["a", "b"]
        assert first[1]["backend"] == "echo" and first[1]["provider"] == "numpy"
        assert "generation" in first[1] and "decision" in first[1]
        end = time.monotonic() + 90.0
        while True:  # until the background work has switched stage b
            health = client.get("/health").json()["pipelines"]["faster-slow-to-open"]
            if health["placement"]["switches"] or time.monotonic() > end:
                break
            time.sleep(0.2)
        (switch,) = health["placement"]["switches"]
        assert (switch["stage"], switch["to"]) == ("b", "echo[1]")
        after = run()["placement"]
        assert after[1]["candidate"] == 1 and after[1]["decision"] == "measured"
        assert after[1]["placement"] == 2
        families = {f.name: f for f in text_string_to_metric_families(
            client.get("/metrics").text)}
        switched = [s for s in families["edge_placement_switches"].samples
                    if s.name.endswith("_total")]
        assert [(s.labels["stage"], s.value) for s in switched] == [("b", 1.0)]
        (number,) = families["edge_placement_number"].samples
        assert number.value == 2.0
    assert served.returncode == 0
