"""``EDGE_TRACE_HOOKS=1``: every hook call printed with plugin, argument summary, duration."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline

LINE = re.compile(r"^\[edge-trace\] (?P<hook>edge_\w+)@(?P<plugin>[\w,.-]+)\((?P<args>.*)\) "
                  r"(?P<ms>\d+\.\d{3}) ms(?P<status> ok| raised .*)$")


def traced(err: str) -> list[re.Match[str]]:
    found = [LINE.match(line) for line in err.splitlines() if line.startswith("[edge-trace]")]
    assert all(found), err
    return [m for m in found if m is not None]


def test_the_cli_traces_isolated_hook_calls_with_duration() -> None:
    done = subprocess.run([sys.executable, "-m", "edge_core.cli", "probe", "--json"],
                          env={"EDGE_TRACE_HOOKS": "1", "EDGE_PLUGINS": "echo",
                               "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=True)
    lines = traced(done.stderr)
    calls = {(m["hook"], m["plugin"], m["status"]) for m in lines}
    assert ("edge_backends", "echo", " ok") in calls
    assert ("edge_probe", "echo", " ok") in calls
    assert all(float(m["ms"]) >= 0 for m in lines)


def test_a_pipeline_run_traces_every_lifecycle_hook(capfd: pytest.CaptureFixture[str]) -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "echo", "EDGE_TRACE_HOOKS": "1"})
    config = load_pipeline({"name": "t", "stages": [
        {"id": "s", "backend": {"name": "echo-preemptible", "options": {"scale": 3.0}}}]})
    ledger = ResourceLedger([Pool(name="machine:ram", total=2**32)])
    import os

    os.environ["EDGE_TRACE_HOOKS"] = "1"  # owner hooks are bound with the process env
    try:
        with Pipeline.open(config, plugins, ledger) as pipeline:
            import numpy as np

            with pipeline.run({"x": np.ones(3, np.float32)}) as result:
                assert result.outputs["x"].tolist() == [3.0, 3.0, 3.0]
    finally:
        del os.environ["EDGE_TRACE_HOOKS"]
    lines = traced(capfd.readouterr().err)
    hooks = {m["hook"] for m in lines if m["plugin"] == "echo"}
    assert {"edge_probe", "edge_reserve", "edge_load", "edge_warmup_placement", "edge_call",
            "edge_retire"} <= hooks
    reserve = next(m for m in lines if m["hook"] == "edge_reserve")
    assert "StageContext(" in reserve["args"]


def test_a_raising_hook_is_traced_as_raised(capfd: pytest.CaptureFixture[str]) -> None:
    from edge_core import hookimpl

    class Broken:
        EDGE_CONTRACT = "1.0"

        @hookimpl
        def edge_probe(self) -> list[object]:
            raise RuntimeError("probe exploded")

    plugins = load_plugins(objects={"broken": Broken()},
                           env={"EDGE_PLUGINS": "", "EDGE_TRACE_HOOKS": "1"})
    (answer,) = plugins.call_each("edge_probe")
    assert answer.error == "RuntimeError: probe exploded"
    plugins.manager.hook.edge_backends()
    lines = traced(capfd.readouterr().err)
    assert any(m["hook"] == "edge_probe" and m["plugin"] == "broken"
               and m["status"] == " raised RuntimeError: probe exploded" for m in lines)
    assert any(m["hook"] == "edge_backends" and m["plugin"] == "-" for m in lines)
