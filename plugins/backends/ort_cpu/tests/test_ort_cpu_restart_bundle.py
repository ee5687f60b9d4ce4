"""A restart loads the bundle its stage opened with, never one rewritten since.

Real ort-cpu workers over a bundle whose graph is ``y = k * x``. The bundle is rewritten
in place as an operator deploying a new model would: graph, expected outputs and manifest
together, consistently, so that a fresh verification passes (``k`` = 3 instead of 2).
Then a worker is SIGKILLed and restarted (``restart = "on-failure"``):

* staged (the default): the restarted replica loads the staged copy kept since the open
  (the bytes verified then, hashed again) and serves ``2 * x``, as its sibling does; the
  plan names the same manifest sha256; the copy is removed at close;
* verified in place (``stage_bundle = false``): there are no kept bytes, so the restart is
  refused with ``BundleChanged`` naming the manifest and both sha256s; the replica stays
  ``failed`` with that reason and nothing charged;
* an unchanged bundle restarts as before, from the kept copy (no second copy made);
* a stage with candidates restarts each candidate on its bundle as the stage opened with
  it: a candidate refused at open whose bundle was rewritten since is refused
  (``BundleChanged``), and the fallback serves the copy it opened on; a candidate the open
  never tried is refused too when its bundle was rewritten since the open;
* verified in place, the plan judges the evidence on the manifest the stage verified
  (its pin keeps it), the expected outputs hashed on disk against it: a rewrite since
  neither takes the label away nor lends it one;
* the pin follows the stage's load, not the thread: a plugin whose load verifies its
  bundle on a thread of its own (``ort-cpu-thread`` below: the real hooks, the load run
  on another thread) is pinned as well.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from edge_core import hookimpl
from edge_core.artifacts import create_manifest, verify_bundle
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.runtime import Pipeline, StageState
from edge_core.runtime.stage_runtime import StageRuntime
from edge_core.stage import StageContext
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.controller import OrtStage
from edge_ort.plugin_base import OrtPlugin

from .conftest import EXAMPLE_X

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def write_scale_bundle(directory: Path, k: float, *, expected: bool = True,
                       expected_k: float | None = None, x: np.ndarray = EXAMPLE_X) -> str:
    """Write (or rewrite in place) the bundle of ``y = k * x``; its manifest sha256.

    Without ``expected`` the manifest names no expected outputs (the file is left out);
    ``expected_k`` makes them ``expected_k * x`` instead (a bundle its gate refuses).
    ``x``: its example inputs; it also holds ``table.txt``, an asset naming ``k`` (a
    character table, say, that a transform reads from the bundle's folder).
    """
    directory.mkdir(exist_ok=True)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    scale = helper.make_tensor("k", TensorProto.FLOAT, [], [k])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"], name="mul0")],
                              "scale", [x_info], [y_info], initializer=[scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (directory / "model.onnx").write_bytes(model.SerializeToString())
    np.savez(directory / "example_inputs.npz", x=x)
    (directory / "table.txt").write_text(f"k = {k}\n", encoding="utf-8")
    if expected:
        np.savez(directory / "expected.npz",
                 y=(x * np.float32(k if expected_k is None else expected_k)
                    ).astype(np.float32))
    else:
        (directory / "expected.npz").unlink(missing_ok=True)
    create_manifest(directory, component="scale", example_inputs="example_inputs.npz",
                    expected_outputs="expected.npz" if expected else None, precision="fp32",
                    exporter="onnx.helper", overwrite=True)
    return verify_bundle(directory, stage=False).manifest_sha256  # a fresh one passes


def open_scale(plugins: PluginSet, ledger: ResourceLedger, bundle: Path,
               **stage: Any) -> Pipeline:
    backend = stage.pop("backend", "ort-cpu")
    config = load_pipeline({"name": "r", "stages": [
        {"id": "s", "backend": {"name": backend, "options": stage.pop("options", {})},
         "manifest": str(bundle), "restart": "on-failure", "restart_backoff_s": 0.0,
         **stage}]})
    return Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)


def kill(runtime: StageRuntime) -> int:
    """SIGKILL the replica's worker; returns its pid."""
    victim = int(str(runtime.loaded.describe()["pid"]))
    os.kill(victim, signal.SIGKILL)
    return victim


def settled(check: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def restarted(runtime: StageRuntime) -> bool:
    thread = runtime.restarter._thread
    return thread is not None and not thread.is_alive()


def served_by(runtime: StageRuntime) -> tuple[np.ndarray, int]:
    """One request on this very replica: its output and the generation that served it."""
    result = runtime.submit({"x": EXAMPLE_X}, deadline_s=30.0).result()
    try:
        return np.array(result.outputs["y"]), result.key.generation
    finally:
        result.ack()


def manifests(pipeline: Pipeline) -> list[tuple[str, str]]:
    """Per replica: the manifest sha256 and directory its live worker loaded."""
    return [(s["worker"]["manifest"]["manifest_sha256"], s["worker"]["manifest"]["directory"])
            for s in pipeline.execution_plan()["stages"]]


def test_a_restart_after_the_bundle_was_rewritten_in_place_serves_the_model_it_opened(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    bundle = tmp_path / "scale"
    opened = write_scale_bundle(bundle, 2.0)
    twice = EXAMPLE_X * 2
    with open_scale(plugins, ledger, bundle, replicas=2) as pipeline:
        first, second = pipeline.stages
        before = manifests(pipeline)
        assert {sha for sha, _ in before} == {opened}
        copy = Path(before[0][1])
        assert copy.is_dir() and copy != bundle
        rewritten = write_scale_bundle(bundle, 3.0)  # what an operator deploys in place
        assert rewritten != opened
        kill(first)
        assert settled(lambda: restarted(first) and first.state is StageState.READY), (
            first.state, first.closed_reason)
        for replica in (first, second):
            y, generation = served_by(replica)
            np.testing.assert_array_equal(y, twice)  # the old model, never 3 * x
            assert generation == (2 if replica is first else 1)
        assert manifests(pipeline) == before  # the plan: the bundle that serves
        gate = pipeline.execution_plan()["stages"][0]["gate"]
        assert "changed since the stage opened: bundles (the restart loads the bundle " \
               "the stage opened with)" in gate["note"]
        with pipeline.run({"x": EXAMPLE_X}) as result:
            np.testing.assert_array_equal(result.outputs["y"], twice)
    assert not copy.exists()  # the kept copy goes with the stage
    assert ledger.is_empty()


def test_a_restart_of_a_bundle_verified_in_place_and_rewritten_is_refused(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    bundle = tmp_path / "scale"
    opened = write_scale_bundle(bundle, 2.0)
    with open_scale(plugins, ledger, bundle, max_restarts=2,
                    options={"stage_bundle": False}) as pipeline:
        (only,) = pipeline.stages
        rewritten = write_scale_bundle(bundle, 3.0)
        kill(only)
        assert settled(lambda: restarted(only) and not only.restarter.pending), only.state
        assert only.state is StageState.FAILED
        health = only.health().to_dict()
        assert health["error"]["type"] == "BundleChanged"
        message = health["error"]["message"]
        assert str(bundle / "edge-manifest.json") in message
        assert opened in message and rewritten in message
        entry = pipeline.execution_plan()["stages"][0]
        assert entry["worker"] is None and entry["state"] == "failed"
        assert "BundleChanged" in entry["state_reason"] and rewritten in entry["state_reason"]
        # no gate ran for what the replica is now: the plan does not show the open's
        assert entry["gate"] == {"mode": "failed", "generation": 2, "points_checked": 0,
                                 "points": 0, "note": entry["gate"]["note"]}
        # nor the open's warm-up as current evidence: generation 1's worker is gone
        assert (entry["placement"], entry["numerics"], entry["buckets"]) == (None, None, [])
        assert entry["evidence"] == "backend-execution"
        assert entry["gate"]["note"].startswith(
            f"restart failed before its gate: BundleChanged: {bundle / 'edge-manifest.json'}")
        assert opened in entry["gate"]["note"] and rewritten in entry["gate"]["note"]
        assert [r["owner"] for r in ledger.snapshot()["reservations"]] == []
    assert ledger.is_empty()


def test_an_unchanged_bundle_restarts_from_the_copy_kept_since_the_open(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    bundle = tmp_path / "scale"
    opened = write_scale_bundle(bundle, 2.0)
    with open_scale(plugins, ledger, bundle) as pipeline:
        (only,) = pipeline.stages
        before = manifests(pipeline)
        kill(only)
        assert settled(lambda: restarted(only) and only.state is StageState.READY)
        y, generation = served_by(only)
        np.testing.assert_array_equal(y, EXAMPLE_X * 2)
        assert generation == 2
        assert manifests(pipeline) == before == [(opened, before[0][1])]
        gate = pipeline.execution_plan()["stages"][0]["gate"]
        assert gate["note"].endswith("(restart)")
        only.restart()  # by hand, too
        assert served_by(only)[1] == 3 and manifests(pipeline) == before
    assert not Path(before[0][1]).exists()
    assert ledger.is_empty()


def test_the_plan_judges_the_evidence_of_the_bundle_that_serves_not_the_rewrite(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    """The rewrite names no expected outputs: judged on it, the label would drop to
    backend-execution; the plan reads the copy that loaded, before and after a restart."""
    bundle = tmp_path / "scale"
    write_scale_bundle(bundle, 2.0)
    with open_scale(plugins, ledger, bundle) as pipeline:
        (only,) = pipeline.stages

        def evidence() -> tuple[str, str]:
            entry = pipeline.execution_plan()["stages"][0]
            return entry["evidence"], entry["evidence_basis"]

        opened = evidence()
        assert opened[0] == "complete-model"
        write_scale_bundle(bundle, 3.0, expected=False)
        assert evidence() == opened
        kill(only)
        assert settled(lambda: restarted(only) and only.state is StageState.READY)
        assert evidence() == opened
        np.testing.assert_array_equal(served_by(only)[0], EXAMPLE_X * 2)
    assert ledger.is_empty()


class ThreadedOrtPlugin(OrtPlugin):
    """ort-cpu whose load — its bundle's verification included — runs on a thread of its own.

    The real hooks and the real ``OrtStage.open``; only the thread differs. The names of
    the threads its loads ran on are kept in :attr:`threads`.
    """

    def __init__(self) -> None:
        super().__init__(backend="ort-cpu-thread", target="CPUExecutionProvider",
                         description="ort-cpu, loaded on a thread of its own",
                         distribution="test")
        self.threads: list[str] = []

    @hookimpl
    def edge_load(self, stage: StageContext) -> OrtStage:
        """``OrtStage.open`` on a new thread; its error re-raised here."""
        done: dict[str, Any] = {}

        def load() -> None:
            self.threads.append(threading.current_thread().name)
            try:
                done["loaded"] = OrtStage.open(stage, self.load_config(stage.options, stage),
                                               self.device_id(stage.options))
            except BaseException as error:  # handed to the hook's thread
                done["error"] = error

        thread = threading.Thread(target=load, name=f"own-load-{stage.generation}")
        thread.start()
        thread.join()
        if "error" in done:
            raise done["error"]
        return done["loaded"]


@pytest.fixture
def threaded() -> tuple[ThreadedOrtPlugin, PluginSet]:
    plugin = ThreadedOrtPlugin()
    return plugin, load_plugins(objects={"ort-cpu-thread": plugin},
                                env={"EDGE_PLUGINS": "ort-cpu"})


def test_a_plugin_verifying_on_a_thread_of_its_own_restarts_on_the_copy_it_opened(
        threaded: tuple[ThreadedOrtPlugin, PluginSet], ledger: ResourceLedger,
        tmp_path: Path) -> None:
    plugin, plugins = threaded
    bundle = tmp_path / "scale"
    opened = write_scale_bundle(bundle, 2.0)
    with open_scale(plugins, ledger, bundle, backend="ort-cpu-thread") as pipeline:
        (only,) = pipeline.stages
        before = manifests(pipeline)
        assert before[0][0] == opened and Path(before[0][1]) != bundle
        write_scale_bundle(bundle, 3.0)
        kill(only)
        assert settled(lambda: restarted(only) and only.state is StageState.READY), (
            only.state, only.closed_reason)
        y, generation = served_by(only)
        np.testing.assert_array_equal(y, EXAMPLE_X * 2)  # the copy it opened, not 3 * x
        assert generation == 2
        assert manifests(pipeline) == before
    assert plugin.threads == ["own-load-1", "own-load-2"]  # each load on its own thread
    assert not Path(before[0][1]).exists()
    assert ledger.is_empty()


def test_a_plugin_verifying_on_a_thread_of_its_own_in_place_is_refused_a_rewrite(
        threaded: tuple[ThreadedOrtPlugin, PluginSet], ledger: ResourceLedger,
        tmp_path: Path) -> None:
    _plugin, plugins = threaded
    bundle = tmp_path / "scale"
    opened = write_scale_bundle(bundle, 2.0)
    with open_scale(plugins, ledger, bundle, backend="ort-cpu-thread", max_restarts=1,
                    options={"stage_bundle": False}) as pipeline:
        (only,) = pipeline.stages
        rewritten = write_scale_bundle(bundle, 3.0)
        kill(only)
        assert settled(lambda: restarted(only) and not only.restarter.pending), only.state
        assert only.state is StageState.FAILED
        error = only.health().to_dict()["error"]
        assert error["type"] == "BundleChanged"
        assert opened in error["message"] and rewritten in error["message"]
        assert ledger.snapshot()["reservations"] == []
    assert ledger.is_empty()


def test_the_plan_of_a_stage_verified_in_place_judges_the_manifest_it_verified(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    """In place there is no copy to read: the plan judges the evidence on the manifest
    the stage verified when it loaded (kept by its pin), the expected outputs it names
    hashed on disk against it. A manifest rewritten to name no expected outputs does not
    take the label away; expected outputs rewritten since (a consistent 3 * x bundle,
    which the disk alone would call complete) are not counted."""
    bundle = tmp_path / "scale"
    write_scale_bundle(bundle, 2.0)
    with open_scale(plugins, ledger, bundle, options={"stage_bundle": False}) as pipeline:

        def evidence() -> tuple[str, str]:
            entry = pipeline.execution_plan()["stages"][0]
            return entry["evidence"], entry["evidence_basis"]

        opened = evidence()
        assert opened[0] == "complete-model"
        create_manifest(bundle, component="scale", example_inputs="example_inputs.npz",
                        precision="fp32", exporter="onnx.helper", overwrite=True)
        assert evidence() == opened  # the manifest that loaded names them
        write_scale_bundle(bundle, 3.0)
        label, basis = evidence()
        assert label == "backend-execution"
        assert "expected.npz: sha256 differs from the manifest" in basis
    assert ledger.is_empty()


def open_candidates(plugins: PluginSet, ledger: ResourceLedger, first: Path,
                    second: Path) -> Pipeline:
    """One stage, two ort-cpu candidates: ``first`` verified in place, then ``second``."""
    config = load_pipeline({"name": "r", "selection": "first-passing", "stages": [
        {"id": "s", "manifest": str(second), "restart": "on-failure",
         "restart_backoff_s": 0.0, "max_restarts": 1, "candidates": [
             {"backend": {"name": "ort-cpu", "options": {"stage_bundle": False}},
              "manifest": str(first)},
             {"backend": {"name": "ort-cpu"}}]}]})
    return Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)


def tried(pipeline: Pipeline) -> list[tuple[str, str]]:
    return [(c["outcome"], c["reason"] or "")
            for c in pipeline.execution_plan()["stages"][0]["candidates"]]


def test_a_restart_falls_back_to_the_candidate_it_opened_on_not_a_rewritten_first(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    """The first candidate is refused at open (its expected outputs are wrong); rewritten
    since into one that would pass, a restart refuses it and the second candidate
    restarts on the copy it opened on, whatever its own bundle on disk holds."""
    first, second = tmp_path / "first", tmp_path / "second"
    refused_at_open = write_scale_bundle(first, 2.0, expected_k=5.0)
    write_scale_bundle(second, 2.0)
    with open_candidates(plugins, ledger, first, second) as pipeline:
        (only,) = pipeline.stages
        assert [outcome for outcome, _ in tried(pipeline)] == ["refused", "chosen"]
        before = manifests(pipeline)
        rewritten = write_scale_bundle(first, 3.0)  # consistent now: its gate would pass
        write_scale_bundle(second, 3.0)
        kill(only)
        assert settled(lambda: restarted(only) and only.state is StageState.READY), (
            only.state, only.closed_reason)
        y, generation = served_by(only)
        np.testing.assert_array_equal(y, EXAMPLE_X * 2)  # never the rewritten 3 * x
        assert generation == 2
        (refusal, reason), (chosen, _) = tried(pipeline)
        assert (refusal, chosen) == ("refused", "chosen")
        assert reason.startswith("BundleChanged")
        assert refused_at_open in reason and rewritten in reason
        assert manifests(pipeline) == before  # the second candidate's copy, as opened
    assert ledger.is_empty()


def test_a_restart_refuses_a_candidate_never_tried_whose_bundle_was_rewritten(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    """The second candidate was never tried at open (the first passed): its manifest as
    read when the stage opened is the one a restart may load, else BundleChanged."""
    first, second = tmp_path / "first", tmp_path / "second"
    write_scale_bundle(first, 2.0)
    opened = write_scale_bundle(second, 2.0)
    with open_candidates(plugins, ledger, first, second) as pipeline:
        (only,) = pipeline.stages
        assert [outcome for outcome, _ in tried(pipeline)] == ["chosen"]
        write_scale_bundle(first, 3.0)
        rewritten = write_scale_bundle(second, 3.0)
        kill(only)
        assert settled(lambda: restarted(only) and not only.restarter.pending), only.state
        assert only.state is StageState.FAILED
        error = only.health().to_dict()["error"]
        assert error["type"] == "CandidatesRefused"
        reasons = [reason for _, reason in tried(pipeline)]
        assert [r.split(":")[0] for r in reasons] == ["BundleChanged", "BundleChanged"]
        assert opened in reasons[1] and rewritten in reasons[1]
        assert str(second / "edge-manifest.json") in reasons[1]
        assert ledger.snapshot()["reservations"] == []
    assert ledger.is_empty()
