"""The backend passes edge-core's conformance kit: every check, none skipped.

The same checks run with ``pytest --edge-backend example-numpy`` (one test per check) or
``edge conformance example-numpy`` (a report, exit code 0 when nothing failed).
"""

from __future__ import annotations

import numpy as np

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.checks import CHECKS
from edge_core.testing.results import Status
from edge_core.testing.runner import run_backend


def test_the_backend_passes_every_conformance_check() -> None:
    report = run_backend(load_plugins(), "example-numpy")
    assert report.available, report.reason
    not_passed = [f"{r.check}: {r.status.value}: {r.detail}" for r in report.results
                  if r.status is not Status.PASSED]
    assert not not_passed, "\n".join(not_passed)
    assert len(report.results) == len(CHECKS)


def test_the_backend_declares_every_request_parameter_its_stage_reads(tmp_path: object) -> None:
    from pathlib import Path

    from edge_example_backend import plugin

    info, _ = load_plugins().backends["example-numpy"]  # as edge-core read it
    assert info.params == frozenset({"spin_s"})
    # the kit's slow request names only declared parameters: a front end passes it on
    stage = plugin.edge_conformance_stage("example-numpy", Path(str(tmp_path)))
    assert info.params is not None and set(stage["slow_params"]) <= info.params


def test_a_pipeline_serves_tanh_times_the_bundle_scale(tmp_path: object) -> None:
    from pathlib import Path

    from edge_core.artifacts import create_manifest

    bundle = Path(str(tmp_path)) / "bundle"
    bundle.mkdir()
    np.savez(bundle / "params.npz", scale=np.float32(2.0))
    create_manifest(bundle, graph="params.npz")
    config = load_pipeline({"name": "tanh", "stages": [
        {"id": "s", "backend": {"name": "example-numpy"}, "manifest": str(bundle)}]})
    ledger = ResourceLedger([Pool(name="machine:ram", total=2**32)])
    x = np.array([[0.0, 1.0]], dtype=np.float32)
    with Pipeline.open(config, load_plugins(), ledger) as pipeline, pipeline.run({"x": x}) as out:
        np.testing.assert_allclose(out.outputs["y"], np.tanh(x) * 2, rtol=1e-6)
    assert ledger.is_empty()
