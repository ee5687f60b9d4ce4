"""Gate reuse on ort-cpu: a matching stored full gate checks one point per dynamic entry.

Real ONNX Runtime workers over a bundle whose graph is ``y = relu(x + x)`` with a static
bucket (2 rows) and a dynamic entry (8..32 rows, examples at 8, 32 and 13 with expected
outputs). The first open runs the full gate (four warm-up points) and stores it; a second
open with the same key warms up the static bucket and the entry's minimum only, and says
so in the plan ("gate reused from DATE, 2 of 4 points checked now"), never as a full
gate. Every part of the key that changes — the bundle's sha256, the runtime identity, the
provider or session options, the environment — runs the full gate again and names the
part; so do ``--remeasure`` (``reuse_gates=False``), ``measurement.reuse = false`` and a
stored file that does not verify.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.artifacts import create_manifest
from edge_core.artifacts.errors import BundleChanged
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline
from edge_core.selection import gates as gates_module
from edge_core.selection import key as key_module
from edge_core.selection.gates import GateStore
from edge_core.selection.key import gate_key
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.bundles import write_add_relu_graph

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def _example(directory: Path, name: str, rows: int, offset: float) -> dict[str, Any]:
    x = (np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) - offset) / 3.0
    np.savez(directory / f"{name}.npz", x=x)
    np.savez(directory / f"{name}.expected.npz", y=np.maximum(x + x, 0))
    return {"example_inputs": f"{name}.npz", "expected_outputs": f"{name}.expected.npz"}


def write_bundle(directory: Path, offset: float = 4.0) -> Path:
    """A static 2-row bucket and a dynamic 8..32-row entry, each example with outputs."""
    directory.mkdir(exist_ok=True)
    write_add_relu_graph(directory, shape=("n", 3))
    shapes = [
        {"name": "n2", "inputs": {"x": {"dtype": "float32", "dims": [2, 3]}},
         "examples": [_example(directory, "n2", 2, offset)]},
        {"name": "many", "inputs": {"x": {"dtype": "float32", "dims": [[8, 32], 3]}},
         "examples": [_example(directory, f"many{r}", r, offset) for r in (8, 32, 13)]},
    ]
    create_manifest(directory, component="add-relu", example_inputs="n2.npz",
                    expected_outputs="n2.expected.npz", exporter="onnx.helper",
                    validation={"shapes": shapes}, overwrite=True)
    return directory


def _config(bundle: Path, **options: Any) -> Any:
    return load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu", "options": options},
         "manifest": str(bundle)}]})


def _open(plugins: PluginSet, ledger: ResourceLedger, store: GateStore, config: Any,
          **kwargs: Any) -> dict[str, Any]:
    """Open, serve every shape of the entry, close; the stage's plan entry."""
    with Pipeline.open(config, plugins, ledger, gates=store, **kwargs) as pipeline:
        stage = pipeline.execution_plan()["stages"][0]
        for rows in (2, 8, 20, 32):
            x = np.full((rows, 3), -0.5 + rows, np.float32)
            with pipeline.run({"x": x}) as result:
                np.testing.assert_array_equal(result.outputs["y"], np.maximum(x + x, 0))
    assert ledger.is_empty()
    return stage


def _points(stage: dict[str, Any]) -> list[tuple[str, str]]:
    return [(b["entry"], b["point"]) for b in stage["buckets"]]


FULL = [("n2", "static"), ("many", "min"), ("many", "max"), ("many", "between")]


def test_a_matching_stored_gate_checks_one_point_per_dynamic_entry_and_says_so(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    store = GateStore(tmp_path / "gates")
    config = _config(write_bundle(tmp_path / "b"))
    first = _open(plugins, ledger, store, config)
    assert _points(first) == FULL
    assert first["gate"]["mode"] == "full"
    assert first["gate"]["note"] == "full gate, 4 of 4 points checked now (no stored gate)"
    assert first["evidence"] == "complete-model"
    stored_at = first["gate"]["stored"]

    second = _open(plugins, ledger, store, config)
    assert _points(second) == [("n2", "static"), ("many", "min")]
    gate = second["gate"]
    assert gate["mode"] == "reused" and gate["reused_from"] == stored_at
    assert (gate["points_checked"], gate["points"]) == (2, 4)
    assert gate["note"] == f"gate reused from {stored_at}, 2 of 4 points checked now"
    # never counted as a full gate: the dynamic entry's three examples were not all run
    assert second["evidence"] == "backend-execution"
    assert second["evidence_buckets"]["compared"] == 1
    assert second["evidence_buckets"]["runs_compared"] == 2
    assert all(b["numerics"]["passed"] for b in second["buckets"])
    # the reused open stores nothing new: the stored gate is still the full one
    assert len(list(store.directory.glob("*.json"))) == 1


def test_remeasure_and_reuse_off_run_the_full_gate(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    store = GateStore(tmp_path / "gates")
    bundle = write_bundle(tmp_path / "b")
    _open(plugins, ledger, store, _config(bundle))
    forced = _open(plugins, ledger, store, _config(bundle), remeasure=True)
    assert _points(forced) == FULL and forced["gate"]["mode"] == "full"
    assert forced["gate"]["note"].endswith("(reuse off)")
    off = load_pipeline({"name": "p", "measurement": {"reuse": False}, "stages": [
        {"id": "s", "backend": {"name": "ort-cpu"}, "manifest": str(bundle)}]})
    assert _points(_open(plugins, ledger, store, off)) == FULL


def test_a_changed_bundle_or_options_runs_the_full_gate_naming_the_part(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    store = GateStore(tmp_path / "gates")
    bundle = write_bundle(tmp_path / "b")
    _open(plugins, ledger, store, _config(bundle))
    write_bundle(bundle, offset=5.0)  # other examples: another manifest sha256
    changed = _open(plugins, ledger, store, _config(bundle))
    assert _points(changed) == FULL
    assert changed["gate"]["note"] == ("full gate, 4 of 4 points checked now (changed since "
                                       "the stored gate: bundles)")
    options = _open(plugins, ledger, store, _config(bundle, intra_op_threads=1))
    assert _points(options) == FULL
    assert options["gate"]["note"].endswith("(changed since the stored gate: configuration)")


def test_a_stored_gate_that_does_not_verify_is_not_used(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    store = GateStore(tmp_path / "gates")
    config = _config(write_bundle(tmp_path / "b"))
    _open(plugins, ledger, store, config)
    (path,) = store.directory.glob("*.json")
    document = json.loads(path.read_text())
    document["points"] = document["points"][:1]  # edited after it was written
    path.write_text(json.dumps(document))
    stage = _open(plugins, ledger, store, config)
    assert _points(stage) == FULL
    assert "its digest does not verify" in stage["gate"]["note"]
    path.write_text("{not json")
    assert _points(_open(plugins, ledger, store, config)) == FULL


def test_the_key_changes_with_runtime_environment_and_session_options(
        plugins: PluginSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind of mismatch without a worker: the key part that names it changes."""
    bundle = write_bundle(tmp_path / "b")
    stage = _config(bundle).stages[0]
    base = gate_key(stage, plugins)
    assert gate_key(stage, plugins).digest == base.digest  # stable

    real = key_module.runtime_identity

    def upgraded(*args: Any, **kwargs: Any) -> dict[str, Any]:
        # a stand-in for an upgraded ONNX Runtime: the real identity, one version changed
        identity = json.loads(json.dumps(real(*args, **kwargs)))
        for entry in identity.get("backends", {}).values():
            entry.setdefault("runtime", {})["onnxruntime"] = "999.0"
        identity["faked"] = "onnxruntime 999.0"
        return identity

    monkeypatch.setattr(key_module, "runtime_identity", upgraded)
    assert base.changed(gate_key(stage, plugins).parts) == ["runtime"]
    monkeypatch.setattr(key_module, "runtime_identity", real)

    monkeypatch.setenv("LD_LIBRARY_PATH",
                       os.pathsep.join([str(tmp_path), os.environ.get("LD_LIBRARY_PATH", "")]))
    assert base.changed(gate_key(stage, plugins).parts) == ["environment"]
    monkeypatch.undo()

    threads = _config(bundle, session_config={"session.intra_op.allow_spinning": "0"})
    assert base.changed(gate_key(threads.stages[0], plugins).parts) == ["configuration"]
    provider = _config(bundle, provider_options={"arena_extend_strategy": "kSameAsRequested"})
    assert base.changed(gate_key(provider.stages[0], plugins).parts) == ["configuration"]


def test_edge_plan_says_the_gate_was_reused(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    config = tmp_path / "p.toml"
    config.write_text(f'name = "p"\n[[stages]]\nid = "s"\nmanifest = "{bundle}"\n'
                      '[stages.backend]\nname = "ort-cpu"\n')
    edge = str(Path(sys.executable).with_name("edge"))
    env = {**os.environ, gates_module.GATE_CACHE_ENV: str(tmp_path / "gates")}
    answers = []
    for _ in range(2):
        done = subprocess.run([edge, "plan", str(config)], capture_output=True, text=True,
                              timeout=300, env=env, check=False)
        assert done.returncode == 0, done.stderr
        answers.append(done.stdout)
    assert "gate: full gate, 4 of 4 points checked now (no stored gate)" in answers[0]
    assert "gate: gate reused from 20" in answers[1]
    assert ", 2 of 4 points checked now" in answers[1]
    # edge run says it on its plan's stage line too, and its --json plan carries it
    np.savez(tmp_path / "x.npz", x=np.ones((8, 3), np.float32))
    ran = subprocess.run([edge, "run", str(config), "--inputs", str(tmp_path / "x.npz")],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert ran.returncode == 0, ran.stderr
    shown = [line.strip() for line in ran.stdout.splitlines() if line.strip().startswith("gate:")]
    assert len(shown) == 1 and shown[0].startswith("gate: gate reused from 20"), ran.stdout
    assert shown[0].endswith(", 2 of 4 points checked now"), ran.stdout
    ran = subprocess.run([edge, "run", str(config), "--inputs", str(tmp_path / "x.npz"),
                          "--json"], capture_output=True, text=True, timeout=300, env=env,
                         check=False)
    assert ran.returncode == 0, ran.stderr
    gate = json.loads(ran.stdout)["plan"]["stages"][0]["gate"]
    assert gate["mode"] == "reused" and gate["note"] == shown[0].removeprefix("gate: ")


def test_a_profile_records_reused_gates_of_its_opens_and_keeps_its_evidence_full(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    """The evidence record says how each untraced open's gates ran; its plan is full."""
    from edge_core.evidence.profiling import ProfileSettings, run_profile
    from edge_core.evidence.qualify import record_from_profile

    bundle = write_bundle(tmp_path / "b")
    _open(plugins, ledger, GateStore(), _config(bundle))  # the user's gate store: stored
    path = tmp_path / "p.toml"
    path.write_text(f'name = "p"\n[[stages]]\nid = "s"\nmanifest = "{bundle}"\n'
                    '[stages.backend]\nname = "ort-cpu"\n')
    np.savez(tmp_path / "x.npz", x=np.ones((8, 3), np.float32))
    settings = ProfileSettings(requests=1, warmup_requests=0, concurrency=(1,),
                               process_start_repeats=1, warm_restart=False)
    profile = run_profile(str(path), npz_files=[str(tmp_path / "x.npz")], settings=settings,
                          command=["edge", "profile", str(path)])
    record = record_from_profile(profile, profile_path="p.json")
    untraced = record.performance["startup"]["untraced_gates"]
    assert untraced and untraced[0]["s"]["mode"] == "reused"
    assert untraced[0]["s"]["note"].endswith(", 2 of 4 points checked now")
    stage = record.functional["stages"]["s"]
    assert stage["gate"]["mode"] == "full" and stage["evidence"] == "complete-model"


def _plan(config: Path, env: dict[str, str]) -> str:
    edge = str(Path(sys.executable).with_name("edge"))
    done = subprocess.run([edge, "plan", str(config)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env}, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_onnxruntime_upgrade_runs_the_full_gate_naming_the_runtime(tmp_path: Path) -> None:
    """What runtime_identity reads, changed as an upgrade changes it: the version in the
    distribution's metadata, in a folder on the path (here one ahead of the real one)."""
    bundle = write_bundle(tmp_path / "b")
    config = tmp_path / "p.toml"
    config.write_text(f'name = "p"\n[[stages]]\nid = "s"\nmanifest = "{bundle}"\n'
                      '[stages.backend]\nname = "ort-cpu"\n')
    site = tmp_path / "site"
    installed = site / "onnxruntime-1.0.dist-info"
    installed.mkdir(parents=True)
    (installed / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime\n"
                                        "Version: 1.0\n")
    env = {gates_module.GATE_CACHE_ENV: str(tmp_path / "gates"),
           "EDGE_PROBE_CACHE": str(tmp_path / "probes"),  # kept answers: seen to move too
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    assert "(no stored gate)" in _plan(config, env)
    assert "gate: gate reused from 20" in _plan(config, env)
    upgraded = installed.rename(site / "onnxruntime-999.0.dist-info")
    (upgraded / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime\n"
                                       "Version: 999.0\n")
    assert ("gate: full gate, 4 of 4 points checked now (changed since the stored gate: "
            "runtime)") in _plan(config, env)


def test_edge_plan_says_a_gate_it_could_not_store(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    config = tmp_path / "p.toml"
    config.write_text(f'name = "p"\n[[stages]]\nid = "s"\nmanifest = "{bundle}"\n'
                      '[stages.backend]\nname = "ort-cpu"\n')
    blocked = tmp_path / "gates"
    blocked.write_text("a file where the directory should be")
    answer = _plan(config, {gates_module.GATE_CACHE_ENV: str(blocked)})
    assert "gate: full gate, 4 of 4 points checked now (no stored gate)" in answer
    assert f"    gate not stored: [Errno 17] File exists: '{blocked}'" in answer


def test_a_restart_stores_its_gate_under_the_key_of_the_bundle_it_loaded(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    """A restart of an unchanged bundle stores its full gate under the open's key. After
    the bundle was rewritten under the serving pipeline, every restart loads the bundle
    the stage opened with (its kept staged copy), so its gate is stored under that
    bundle's key — the open's, refreshed — restart after restart, never under the
    rewritten bundle's: the next open of the rewritten bundle runs the full gate, and an
    open after the bundle is restored reuses the restart's gate."""
    store = GateStore(tmp_path / "gates")
    bundle = write_bundle(tmp_path / "b")
    config = _config(bundle)
    opened_key = gate_key(config.stages[0], plugins)

    def stored_ns() -> int:
        return int(json.loads(store.path(opened_key).read_text())["stored_ns"])

    with Pipeline.open(config, plugins, ledger, gates=store) as pipeline:
        stage = pipeline.stage("s")
        stage.restart()
        gate = pipeline.execution_plan()["stages"][0]["gate"]
        assert gate["note"] == "full gate, 4 of 4 points checked now (restart)"
        before = stored_ns()
        write_bundle(bundle, offset=5.0)  # another manifest sha256
        now_key = gate_key(config.stages[0], plugins)
        assert now_key.changed(opened_key.parts) == ["bundles"]
        for _ in range(2):  # the second restart as the first: the stage opened with it
            stage.restart()
            gate = pipeline.execution_plan()["stages"][0]["gate"]
            assert gate["note"] == ("full gate, 4 of 4 points checked now (restart; changed "
                                    "since the stage opened: bundles (the restart loads "
                                    "the bundle the stage opened with))")
            assert stored_ns() > before  # refreshed under the key of what loaded
            before = stored_ns()
            assert not store.path(now_key).exists()
        restarted_at = gate["stored"]
    assert ledger.is_empty()
    rewritten = _open(plugins, ledger, store, config)
    assert _points(rewritten) == FULL  # never the gate run on the bundle it replaced
    assert rewritten["gate"]["note"] == ("full gate, 4 of 4 points checked now (changed "
                                         "since the stored gate: bundles)")
    write_bundle(bundle)  # the bundle the stage opened with, restored
    assert gate_key(config.stages[0], plugins).digest == opened_key.digest
    restored = _open(plugins, ledger, store, config)
    assert restored["gate"]["mode"] == "reused"
    assert restored["gate"]["reused_from"] == restarted_at


def test_a_manifest_rewritten_between_the_gate_lookup_and_the_load(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    """The key is made before the load; the load verifies the bundle as it is then. A
    reused gate on a manifest rewritten in between is refused (the new bundle had one
    point checked); a full gate that ran on one is not stored under the old key."""
    store = GateStore(tmp_path / "gates")
    bundle = write_bundle(tmp_path / "b")
    config = _config(bundle)
    _open(plugins, ledger, store, config)  # stored for this manifest

    def rewrite(offset: float) -> Any:
        def said(line: str) -> None:
            if line.startswith("loading stage s"):
                write_bundle(bundle, offset=offset)
        return said

    with pytest.raises(BundleChanged, match="changed while the stage opened") as refused:
        Pipeline.open(config, plugins, ledger, gates=store, progress=rewrite(5.0))
    assert refused.value.field == str(bundle / "edge-manifest.json")
    assert ledger.is_empty()
    before = {p.name for p in store.directory.glob("*.json")}
    with Pipeline.open(config, plugins, ledger, gates=store, progress=rewrite(6.0)) as p:
        gate = p.execution_plan()["stages"][0]["gate"]
    assert gate["mode"] == "full"
    assert gate["stored"] == "not stored: bundles changed while the stage opened"
    assert {p.name for p in store.directory.glob("*.json")} == before
    assert ledger.is_empty()
