"""ONNX Runtime's own provider fallback, on the QNN HTP simulator: never silent.

ONNX Runtime's Python ``InferenceSession`` falls back to the CPU provider by itself: a run
that fails with ``EP_FAIL`` is rerun on the CPU, and so is every later call (the session
is re-created on the CPU), and a session whose creation fails on the requested providers
is created on the CPU instead. The faults are INJECTED at the compiled-session boundary by
a test-only worker entry (``injected_workers/ep_failure_injected.py``) around the real
edge_ort handler and real QNN sessions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.placement import PlacementRefusal
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline, RequestFailed

from .conftest import cpu_run, example_input

QNN = "QNNExecutionProvider"
CPU = "CPUExecutionProvider"
INJECTED = Path(__file__).parent / "injected_workers"


def open_injected(plugins: PluginSet, ledger: ResourceLedger, bundle: Path, cache: Path,
                  inject: str, report: Path) -> Pipeline:
    """A qnn stage whose worker is the test-only entry with fault ``inject``."""
    route: dict[str, Any] = {
        "name": "ep-failure-injected", "interpreter": sys.executable,
        "entry": "ep_failure_injected:create", "python_path": [str(INJECTED)],
        "env": {"EDGE_TEST_INJECT": inject, "EDGE_TEST_REPORT": str(report)},
    }
    config = load_pipeline({"name": "p", "stages": [{
        "id": "s", "manifest": str(bundle),
        "backend": {"name": "qnn", "options": {"context_cache_dir": str(cache)},
                    "route": route},
    }]})
    return Pipeline.open(config, plugins, ledger)


def test_an_ep_failure_in_a_run_fails_the_request_and_the_session_stays_on_qnn(
    plugins: PluginSet, ledger: ResourceLedger, static_bundle: Path, tmp_path: Path
) -> None:
    """INJECTED: the compiled QNN session's first run raises ``EPFail``. Before, ONNX
    Runtime's wrapper printed a line, re-created the session on the CPU and answered
    from there: the request succeeded, and every later call ran on the CPU while the
    stage's placement still said QNN. Now the request fails with ``ProviderRunFailed``
    naming the provider and the runtime's error, the session keeps its QNN compiled
    session, the next call runs on it, and nothing is charged or left behind."""
    report = tmp_path / "report.json"
    with open_injected(plugins, ledger, static_bundle, tmp_path / "cache",
                       "run-epfail-once", report) as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        assert plan["placement"]["target"] == QNN
        assert plan["placement"]["fraction_on_target"] == 1.0
        held = ledger.holdings()
        x = example_input(300)
        with pytest.raises(RequestFailed) as info, pipeline.run({"x": x}):
            pass
        error = info.value
        assert error.error_type == "ProviderRunFailed", str(error)
        assert QNN in error.error_message
        assert "injected EP failure (test)" in error.error_message
        assert error.request_fault is None  # a server error, not the request's fault
        after_failure = json.loads(report.read_text())
        assert after_failure["injected_failed"] is True
        assert after_failure["providers"][0] == QNN  # not switched to the CPU
        assert after_failure["injected_still_in_place"] is True
        assert ledger.holdings() == held

        with pipeline.run({"x": x}) as result:
            np.testing.assert_allclose(result.outputs["y"], cpu_run(static_bundle, x),
                                       atol=1e-4, rtol=1e-4)
        after_next = json.loads(report.read_text())
        assert after_next["providers"][0] == QNN
        assert after_next["injected_still_in_place"] is True
        assert after_next["delegated_runs"] == 1  # it ran on the QNN compiled session
        assert pipeline.execution_plan()["stages"][0]["placement"]["target"] == QNN
        assert ledger.holdings() == held


def test_a_session_created_on_the_cpu_after_a_failed_creation_is_refused_at_warm_up(
    plugins: PluginSet, ledger: ResourceLedger, static_bundle: Path, tmp_path: Path
) -> None:
    """INJECTED: creating the session on the QNN provider raises ``RuntimeError``; ONNX
    Runtime's wrapper then creates it on the CPU provider alone. The warm-up's placement
    check sees every node on the CPU and refuses the stage (no stage opens, nothing is
    charged, no worker or segment is left)."""
    with pytest.raises(PlacementRefusal) as info:
        open_injected(plugins, ledger, static_bundle, tmp_path / "cache", "create-fails",
                      tmp_path / "report.json")
    message = str(info.value)
    assert "CPUExecutionProvider ran 2 node(s)" in message, message
    assert "conv0" in message and "relu0" in message
    placement = info.value.report
    assert placement.providers[CPU].nodes == 2
    assert QNN not in placement.providers
