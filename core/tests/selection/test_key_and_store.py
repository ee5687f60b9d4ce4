"""A decision's key follows what a measurement depends on; a bad stored file never crashes."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import attrs
import pytest

from edge_contracts.devices import DeviceDescriptor, DeviceKind, ExecutionDomain, Integration
from edge_core import hookimpl
from edge_core.backend import BackendInfo, ProbeReport
from edge_core.config import load_pipeline
from edge_core.config.model import PipelineConfig
from edge_core.identity import identity_digest
from edge_core.plugins import PluginSet, load_plugins
from edge_core.selection.gates import GateStore
from edge_core.selection.key import (
    decision_key,
    environment_identity,
    gate_bundle_part,
    gate_key,
    manifest_sha256,
)
from edge_core.selection.store import (
    FORMAT,
    KEEP_PER_PIPELINE,
    DecisionCacheWarning,
    DecisionStore,
    default_cache_dir,
)


@pytest.fixture(scope="module")
def plugins() -> PluginSet:
    return load_plugins(env={"EDGE_PLUGINS": "echo,ort-cpu"})


def _bundle(folder: Path, content: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "edge-manifest.json").write_text(content, encoding="utf-8")
    return folder


def _config(tmp_path: Path, **over: Any) -> PipelineConfig:
    bundle = tmp_path / "bundle"
    if not bundle.exists():
        _bundle(bundle, '{"files": {}}')
    stage: dict[str, Any] = {"id": "a", "manifest": str(bundle), "candidates": [
        {"backend": {"name": "echo", "options": {"delay_s": 0.2}}},
        {"backend": {"name": "echo-preemptible"}}]}
    stage.update(over.pop("stage", {}))
    return load_pipeline({"name": "p", "stages": [stage], **over}, base_dir=tmp_path)


def _decision(choice: int = 1, backend: str = "echo-preemptible") -> dict[str, Any]:
    return {"stages": {"a": {"choice": choice, "backend": backend}}}


def test_the_key_is_stable_and_each_change_names_its_part(
        tmp_path: Path, plugins: PluginSet, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path)
    key = decision_key(config, plugins, env={})
    assert decision_key(config, plugins, env={}) == key  # probes are the same twice
    # start and reuse change when, not what, is measured
    same = attrs.evolve(config, start="first-ready",
                        measurement=attrs.evolve(config.measurement, reuse=False))
    assert decision_key(same, plugins, env={}).digest == key.digest

    options = _config(tmp_path, stage={"candidates": [
        {"backend": {"name": "echo", "options": {"delay_s": 0.3}}},
        {"backend": {"name": "echo-preemptible"}}]})
    assert decision_key(options, plugins, env={}).changed(key.parts) == ["configuration"]

    objective = attrs.evolve(config, objective="throughput")
    assert decision_key(objective, plugins, env={}).changed(key.parts) == ["configuration"]

    _bundle(tmp_path / "bundle", '{"files": {"model.onnx": "00"}}')
    assert decision_key(config, plugins, env={}).changed(key.parts) == ["bundles"]
    _bundle(tmp_path / "bundle", '{"files": {}}')

    page = tmp_path / "page.txt"
    page.write_text("1 2 3")
    with_workload = decision_key(config, plugins, env={}, workload=[page])
    assert with_workload.changed(key.parts) == ["workload"]
    page.write_text("1 2 4")
    assert decision_key(config, plugins, env={}, workload=[page]).changed(
        with_workload.parts) == ["workload"]

    loader = decision_key(config, plugins, env={"LD_LIBRARY_PATH": "/opt/ep"})
    assert loader.changed(key.parts) == ["environment"]

    # a faked distribution version of the backend's plugin
    monkeypatch.setattr(plugins.record("echo"), "version", "9.9.9")
    assert decision_key(config, plugins, env={}).changed(key.parts) == ["runtime"]


def test_a_gate_key_made_of_the_manifest_that_loaded_not_the_one_on_disk(
        tmp_path: Path, plugins: PluginSet) -> None:
    """What the opener keys a restart's gate with: the sha256 the stage's pin recorded."""
    stage = _config(tmp_path).stages[0].choices()[0]
    opened = gate_key(stage, plugins, env={})
    loaded = manifest_sha256(tmp_path / "bundle")
    assert loaded is not None
    assert gate_bundle_part(stage, loaded) == opened.parts["bundles"]
    _bundle(tmp_path / "bundle", '{"files": {"model.onnx": "00"}}')  # rewritten
    now = gate_key(stage, plugins, env={})
    assert now.changed(opened.parts) == ["bundles"]
    pinned = now.with_part("bundles", gate_bundle_part(stage, loaded))
    assert pinned == opened and pinned.digest == opened.digest
    assert manifest_sha256(tmp_path / "missing") is None
    with pytest.raises(KeyError):
        now.with_part("workload", "00")  # not a part of a gate's key


def test_the_environment_part_holds_what_the_backends_declare(plugins: PluginSet,
                                                              tmp_path: Path) -> None:
    config = _config(tmp_path)
    env = {"LD_LIBRARY_PATH": "/x", "HOME": "/home/u", "VLLM_CPU_KVCACHE_SPACE": "1"}
    # echo declares nothing: only the loader's path counts
    assert environment_identity(config, plugins, env) == {"LD_LIBRARY_PATH": "/x"}


class _Declaring:
    """A third-party backend ``declared``: its own variables (``DECLARED_*``) and a GPU."""

    EDGE_CONTRACT = "1.0"

    def __init__(self, device: str) -> None:
        self.device = device

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="declared", kinds=("graph",), env_names=("DECLARED_*",))]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        gpu = DeviceDescriptor(physical_id=self.device, kind=DeviceKind.GPU, name=self.device,
                               execution_domain=ExecutionDomain.POSIX,
                               integration=Integration.DISCRETE, pools=(f"gpu:{self.device}",))
        return [ProbeReport(backend="declared", available=True, runtime={"declared": "1.0"},
                            devices=(gpu,))]


def _declared_config(tmp_path: Path) -> PipelineConfig:
    return _config(tmp_path, stage={"candidates": [{"backend": {"name": "declared"}}]})


def test_a_variable_a_backend_declares_is_in_the_environment_part(tmp_path: Path) -> None:
    """Set, changed or unset: measured again, and said to be the environment."""
    plugins = load_plugins(objects={"declaring": _Declaring("gpu0")},
                           env={"EDGE_PLUGINS": "echo"})
    config = _declared_config(tmp_path)
    env = {"DECLARED_THREADS": "4", "HOME": "/home/u", "UNDECLARED": "1"}
    assert environment_identity(config, plugins, env) == {"DECLARED_THREADS": "4"}
    base = decision_key(config, plugins, env={})
    stage = config.stages[0].choices()[0]
    gate = gate_key(stage, plugins, env={})
    for changed in ({"DECLARED_THREADS": "4"}, {"DECLARED_THREADS": "8"}):
        assert decision_key(config, plugins, env=changed).changed(base.parts) == [
            "environment"]
        assert gate_key(stage, plugins, env=changed).changed(gate.parts) == ["environment"]
    # a variable it does not declare changes nothing
    assert decision_key(config, plugins, env={"UNDECLARED": "1"}).digest == base.digest
    assert gate_key(stage, plugins, env={"UNDECLARED": "1"}).digest == gate.digest


def test_another_device_is_another_runtime(tmp_path: Path) -> None:
    """The probe's devices are part of the runtime identity: a swapped GPU is measured again."""
    config = _declared_config(tmp_path)
    stage = config.stages[0].choices()[0]
    keys = {}
    for device in ("gpu0", "gpu1"):
        plugins = load_plugins(objects={"declaring": _Declaring(device)},
                               env={"EDGE_PLUGINS": "echo"})
        keys[device] = (decision_key(config, plugins, env={}), gate_key(stage, plugins, env={}))
        again = load_plugins(objects={"declaring": _Declaring(device)},
                             env={"EDGE_PLUGINS": "echo"})
        assert decision_key(config, again, env={}).digest == keys[device][0].digest
    assert keys["gpu1"][0].changed(keys["gpu0"][0].parts) == ["runtime"]
    assert keys["gpu1"][1].changed(keys["gpu0"][1].parts) == ["runtime"]
    assert keys["gpu1"][0].runtime["backends"]["declared"]["devices"][0]["physical_id"] == "gpu1"


@pytest.mark.parametrize("name", ["EDGE_SPIN_US", "EDGE_COPY_THREADS", "EDGE_HEAP",
                                  "EDGE_SHM_HUGE"])
def test_what_edge_cores_worker_code_reads_is_in_the_environment_part(
        plugins: PluginSet, tmp_path: Path, name: str) -> None:
    """Spinning off, fewer copy threads, another heap policy: measured again, said so."""
    config = _config(tmp_path)
    base = decision_key(config, plugins, env={})
    assert base.changed(decision_key(config, plugins, env={name: "0"}).parts) == [
        "environment"]
    stage = config.stages[0].choices()[0]
    gate = gate_key(stage, plugins, env={})
    assert gate.changed(gate_key(stage, plugins, env={name: "0"}).parts) == ["environment"]


def test_a_route_interpreters_inventory_is_part_of_the_runtime(
        tmp_path: Path, plugins: PluginSet) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "onnxruntime_qnn-1.22.0.dist-info").mkdir(parents=True)
    (venv / "bin").mkdir()
    interpreter = venv / "bin" / "python"
    interpreter.write_text("#!/bin/false\n")  # never started: read from disk only
    interpreter.chmod(0o755)
    route = {"name": "vendor", "interpreter": str(interpreter)}
    config = _config(tmp_path, stage={"candidates": [
        {"backend": {"name": "echo", "route": route}}, {"backend": {"name": "echo"}}]})
    key = decision_key(config, plugins, env={})
    inventory = key.runtime["interpreters"][str(interpreter)]
    assert inventory["packages"] == {"onnxruntime-qnn": "1.22.0"}
    (site / "onnxruntime_qnn-1.22.0.dist-info").rename(site / "onnxruntime_qnn-1.23.0.dist-info")
    assert decision_key(config, plugins, env={}).changed(key.parts) == ["runtime"]


def test_a_decision_round_trips_and_a_new_key_finds_the_previous(
        tmp_path: Path, plugins: PluginSet) -> None:
    store = DecisionStore(tmp_path / "cache")
    config = _config(tmp_path)
    key = decision_key(config, plugins, env={})
    lookup = store.load(key, config)
    assert lookup.found is None and lookup.previous is None and lookup.warning is None
    saved = store.save(key, config, _decision())
    assert oct(saved.path.stat().st_mode & 0o777) == oct(0o600)
    found = store.load(key, config).found
    assert found is not None and found.decision == _decision()
    assert found.measured_at.endswith("Z")
    other = decision_key(config, plugins, env={"LD_LIBRARY_PATH": "/ep"})
    miss = store.load(other, config)
    assert miss.found is None and miss.previous is not None
    assert miss.changed(other) == ["environment"]
    assert store.forget(key) and not store.forget(key)


def _corruptions(document: dict[str, Any]) -> dict[str, Any]:
    digest_off = dict(document, measured_at="2001-01-01T00:00:00Z")
    wrong_backend = json.loads(json.dumps(document))
    wrong_backend["decision"]["stages"]["a"]["backend"] = "echo"
    wrong_backend["digest"] = identity_digest(  # well-formed, verified, and still wrong
        {k: v for k, v in wrong_backend.items() if k != "digest"})
    return {
        "not JSON": "{not json",
        "not a JSON object": "[1, 2]",
        "format": json.dumps(dict(document, format="other/9")),
        "another key": json.dumps(dict(document, key="0" * 64)),
        "digest does not verify": json.dumps(digest_off),
        "does not fit the pipeline": json.dumps(wrong_backend),
        "cannot be read": b"\xff\xfe\x00",
    }


@pytest.mark.parametrize("problem", ["not JSON", "not a JSON object", "format", "another key",
                                     "digest does not verify", "does not fit the pipeline",
                                     "cannot be read"])
def test_a_corrupt_or_unverifiable_file_warns_and_is_measured_again(
        tmp_path: Path, plugins: PluginSet, problem: str) -> None:
    store = DecisionStore(tmp_path / "cache")
    config = _config(tmp_path)
    key = decision_key(config, plugins, env={})
    saved = store.save(key, config, _decision())
    document = json.loads(saved.path.read_text())
    content = _corruptions(document)[problem]
    if isinstance(content, bytes):
        saved.path.write_bytes(content)
    else:
        saved.path.write_text(content)
    with pytest.warns(DecisionCacheWarning, match=problem):
        lookup = store.load(key, config)
    assert lookup.found is None and lookup.warning is not None
    assert str(saved.path) in lookup.warning and "measuring again" in lookup.warning


def test_a_decision_that_does_not_fit_is_never_saved(tmp_path: Path, plugins: PluginSet) -> None:
    store = DecisionStore(tmp_path / "cache")
    config = _config(tmp_path)
    key = decision_key(config, plugins, env={})
    for bad in ({"stages": {}}, _decision(choice=2), _decision(choice=0),
                {"stages": {"a": {"choice": True, "backend": "echo"}}},
                {"stages": {**_decision()["stages"], "b": {"choice": 0}}}):
        with pytest.raises(ValueError, match="decision"):
            store.save(key, config, bad)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_an_unreadable_directory_is_no_crash(tmp_path: Path, plugins: PluginSet) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    store = DecisionStore(blocked / "cache")
    config = _config(tmp_path)
    lookup = store.load(decision_key(config, plugins, env={}), config)
    assert lookup.found is None


def test_old_decisions_of_a_pipeline_are_pruned(tmp_path: Path, plugins: PluginSet) -> None:
    store = DecisionStore(tmp_path / "cache")
    config = _config(tmp_path)
    for number in range(KEEP_PER_PIPELINE + 3):
        key = decision_key(config, plugins, env={"LD_LIBRARY_PATH": str(number)})
        store.save(key, config, _decision())
    files = list((tmp_path / "cache").glob("*.json"))
    assert len(files) == KEEP_PER_PIPELINE
    assert all(json.loads(f.read_text())["format"] == FORMAT for f in files)
    assert not list((tmp_path / "cache").glob(".decision.*"))  # no temporary left


def test_the_cache_directory_follows_the_environment(tmp_path: Path) -> None:
    assert default_cache_dir({"EDGE_PLACEMENT_CACHE": str(tmp_path)}) == tmp_path
    assert default_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/edge/placement")
    home = default_cache_dir({})
    assert home == Path(os.path.expanduser("~")) / ".cache" / "edge" / "placement"


def test_no_warning_for_a_clean_miss(tmp_path: Path, plugins: PluginSet) -> None:
    config = _config(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DecisionStore(tmp_path / "c").load(decision_key(config, plugins, env={}),
                                                  config).found is None


def _write_as(store: DecisionStore, name: str, document: dict[str, Any]) -> Path:
    path = store.directory / f"{name}.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_the_previous_decision_is_only_one_this_version_wrote_and_can_verify(
        tmp_path: Path, plugins: PluginSet) -> None:
    """A newer edge's file, or a hand-edited one, is never the previous decision."""
    store = DecisionStore(tmp_path / "cache")
    config = _config(tmp_path)
    key = decision_key(config, plugins, env={})
    saved = store.save(key, config, _decision())
    document = json.loads(saved.path.read_text())
    later = {"measured_at": "2099-01-01T00:00:00Z", "key": "0" * 64}
    newer = dict(document, **later, format="edge-placement-decision/2",
                 decision=["another layout"], parts={"runtime": "x"})
    newer["digest"] = identity_digest({k: v for k, v in newer.items() if k != "digest"})
    _write_as(store, "0" * 64, newer)
    edited = dict(document, **{**later, "key": "1" * 64}, parts={"runtime": "x"})  # stale digest
    _write_as(store, "1" * 64, edited)
    other = decision_key(config, plugins, env={"LD_LIBRARY_PATH": "/ep"})
    miss = store.load(other, config)
    assert miss.previous is not None and miss.previous.path == saved.path
    assert miss.changed(other) == ["environment"]  # not every part, as the others say
    saved.path.unlink()
    alone = store.load(other, config)
    assert alone.previous is None and alone.changed(other) == []


def test_pruning_leaves_another_versions_files_alone(tmp_path: Path, plugins: PluginSet) -> None:
    store = DecisionStore(tmp_path / "cache")
    config = _config(tmp_path)
    saved = store.save(decision_key(config, plugins, env={}), config, _decision())
    newer = dict(json.loads(saved.path.read_text()), format="edge-placement-decision/2",
                 measured_at="2000-01-01T00:00:00Z")
    kept = _write_as(store, "0" * 64, newer)
    for number in range(KEEP_PER_PIPELINE + 1):
        store.save(decision_key(config, plugins, env={"LD_LIBRARY_PATH": f"/{number}"}),
                   config, _decision())
    assert kept.exists()


def test_a_gate_is_compared_only_with_stored_gates_that_verify(
        tmp_path: Path, plugins: PluginSet) -> None:
    """Which parts changed is said against a gate this version stored, never an edited one."""
    store = GateStore(tmp_path / "gates")
    stage = _config(tmp_path).stages[0].choices()[0]
    key = gate_key(stage, plugins, env={})
    points = [{"entry": "e", "point": "min", "shapes": {"x": [1]}}]
    saved = store.save(key, "p/a", "echo", points)
    document = json.loads(store.path(key).read_text())
    later = dict(document, key="0" * 64, checked_at="2099-01-01T00:00:00Z",
                 parts={"runtime": "x"})
    store.path("0" * 64).write_text(json.dumps(later))  # its digest no longer verifies
    newer = dict(later, key="1" * 64, format="edge-gate/2")
    newer["digest"] = identity_digest({k: v for k, v in newer.items() if k != "digest"})
    store.path("1" * 64).write_text(json.dumps(newer))
    other = gate_key(stage, plugins, env={"LD_LIBRARY_PATH": "/ep"})
    lookup = store.load(other, "p/a", "echo")
    assert lookup.found is None and lookup.changed == ("environment",)
    assert store.load(key, "p/a", "echo").found == saved


def test_what_changed_is_said_against_the_nearest_stored_decision(
        tmp_path: Path, plugins: PluginSet) -> None:
    """Back on the first environment with another workload: the workload changed, not
    the environment (which differs only from the newer decision, made elsewhere)."""
    store = DecisionStore(tmp_path / "cache")
    config = _config(tmp_path)
    first = store.save(decision_key(config, plugins, env={}), config, _decision())
    time.sleep(1.05)  # measured_at has whole seconds: the second one is the newer
    store.save(decision_key(config, plugins, env={"LD_LIBRARY_PATH": "/b"}), config,
               _decision())
    page = tmp_path / "page.npz"
    page.write_bytes(b"page")
    now = decision_key(config, plugins, env={}, workload=[page])
    lookup = store.load(now, config)
    assert lookup.previous is not None and lookup.previous.path == first.path
    assert lookup.changed(now) == ["workload"]


def test_what_changed_is_said_against_the_nearest_stored_gate(
        tmp_path: Path, plugins: PluginSet) -> None:
    store = GateStore(tmp_path / "gates")
    stage = _config(tmp_path).stages[0].choices()[0]
    points = [{"entry": "e", "point": "min", "shapes": {"x": [1]}}]
    runtime = {"onnxruntime": "1"}
    store.save(gate_key(stage, plugins, env={}, runtime=runtime), "p/a", "echo", points)
    store.save(gate_key(stage, plugins, env={"LD_LIBRARY_PATH": "/b"}, runtime=runtime),
               "p/a", "echo", points)  # newer, in another environment
    upgraded = gate_key(stage, plugins, env={}, runtime={"onnxruntime": "2"})
    assert store.load(upgraded, "p/a", "echo").changed == ("runtime",)


def test_a_first_gate_saved_makes_the_placement_directory_private_too(
        tmp_path: Path, plugins: PluginSet) -> None:
    """The gates' directory lies in the decisions' (``placement/gates``): saved first, a
    gate made ``placement`` as a parent with the default mode (0755 under umask 022), not
    the documented 0700. Every folder a save creates is 0700, its file 0600."""
    from edge_core.selection.gates import default_gate_dir

    cache = tmp_path / "cache"
    env = {"EDGE_PLACEMENT_CACHE": str(cache / "edge" / "placement")}
    store = GateStore(default_gate_dir(env))
    stage = _config(tmp_path).stages[0].choices()[0]
    key = gate_key(stage, plugins, env={})
    above = tmp_path.stat().st_mode
    old = os.umask(0o022)
    try:
        store.save(key, "p/a", "echo", [{"entry": "e", "point": "min", "shapes": {"x": [1]}}])
    finally:
        os.umask(old)
    for folder in (cache, cache / "edge", cache / "edge" / "placement",
                   cache / "edge" / "placement" / "gates"):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o700), folder
    assert oct(store.path(key).stat().st_mode & 0o777) == oct(0o600)
    assert tmp_path.stat().st_mode == above  # a folder that was there is left as it was
