"""A backend that removes its staged copy once the worker loaded keeps no verified bytes:
its restart after the bundle was rewritten in place is refused with ``BundleChanged``
(edge-core's bundle pin, docs/artifacts.md), never served from the rewrite."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np

from edge_core.artifacts import create_manifest, verify_bundle
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline, StageState


def test_a_restart_on_a_rewritten_bundle_is_refused_naming_both_sha256s(
        tmp_path: Path) -> None:
    from edge_example_backend import plugin

    stage = plugin.edge_conformance_stage("example-numpy", tmp_path)
    bundle = Path(stage["stage"]["manifest"])
    opened = verify_bundle(bundle, stage=False).manifest_sha256
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])
    config = load_pipeline({"name": "x", "stages": [
        {**stage["stage"], "id": "s", "restart": "on-failure", "max_restarts": 1,
         "restart_backoff_s": 0.0}]})
    plugins = load_plugins(objects={"example": plugin}, env={"EDGE_PLUGINS": "example"})
    with Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0) as pipeline:
        np.savez(bundle / "params.npz", scale=np.float32(0.25))  # another model, in place
        create_manifest(bundle, component="example-tanh", graph="params.npz",
                        precision="fp32", overwrite=True)
        rewritten = verify_bundle(bundle, stage=False).manifest_sha256
        (runtime,) = pipeline.stages
        os.kill(int(str(runtime.loaded.describe()["pid"])), signal.SIGKILL)
        end = time.monotonic() + 60.0
        while time.monotonic() < end and (runtime.state is not StageState.FAILED
                                          or runtime.restarter.pending):
            time.sleep(0.05)
        assert runtime.state is StageState.FAILED and not runtime.restarter.pending
        error = runtime.health().to_dict()["error"]
        assert error["type"] == "BundleChanged"
        assert opened in error["message"] and rewritten in error["message"]
        assert ledger.snapshot()["reservations"] == []
    assert ledger.is_empty()
