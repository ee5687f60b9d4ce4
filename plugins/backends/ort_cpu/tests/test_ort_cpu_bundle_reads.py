"""What edge-core reads of a stage's bundle after the open is what the stage loaded.

Real ort-cpu workers over the ``y = k * x`` bundle of ``test_ort_cpu_restart_bundle``,
rewritten in place after the open as an operator deploying a new model would (graph,
example inputs, expected outputs, asset and manifest together, consistently). What the
open verified is the only thing read afterwards: the copy the stage keeps, else the
bundle on disk checked against the manifest the stage verified — and a rewrite is refused
with ``BundleChanged`` naming the manifest and both sha256s, never read silently:

* the first stage's example inputs (``edge run`` without inputs, the evidence workload:
  ``Pipeline.example_inputs``): staged, the kept copy's; verified in place, or by a
  backend that keeps no copy (``ort-cpu-nocopy`` below: the real hooks, the loaded stage
  holding no bundle, as the backend guide's), refused once rewritten; a manifest
  rewritten over the same example bytes still gives those bytes;
* the reference run (``reference_backend``): its example inputs as above, and its
  reference worker loaded inside the stage's pin: the copy the stage keeps, else
  ``BundleChanged`` for a bundle rewritten in place;
* the bundle folders a transform and ``finish`` read model assets from
  (``Pipeline.bundle_directories``): staged, the copy; in place, the bundle itself while
  unchanged, ``BundleChanged`` for the stage whose bundle was rewritten; and an asset read
  through ``BundleFolders.read`` is the verified bytes whenever the file is rewritten.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core import hookimpl
from edge_core.artifacts import BundleChanged, create_manifest
from edge_core.artifacts.errors import MemberMissing, MemberPathRefused
from edge_core.config import load_pipeline
from edge_core.evidence.workload import resolve_groups
from edge_core.ledger import ResourceLedger
from edge_core.placement import WarmupReport
from edge_core.plugins import PluginSet, load_plugins
from edge_core.runtime import Pipeline
from edge_core.runtime.reference_run import reference_run
from edge_core.stage import StageContext
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.controller import OrtStage
from edge_ort.plugin_base import OrtPlugin

from .conftest import EXAMPLE_X
from .test_ort_cpu_restart_bundle import open_scale, write_scale_bundle

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

TENFOLD = (EXAMPLE_X * 10).astype(np.float32)
"""The rewrite's example inputs."""


class NoCopyOrtPlugin(OrtPlugin):
    """ort-cpu whose loaded stage keeps no copy of its bundle, as the backend guide's.

    The real hooks; the loaded stage's ``bundle`` is taken away at load (so its pin keeps
    no copy) and the staged copy removed once the warm-up read what it needed.
    """

    def __init__(self) -> None:
        super().__init__(backend="ort-cpu-nocopy", target="CPUExecutionProvider",
                         description="ort-cpu, keeping no copy of its bundle",
                         distribution="test")
        self.copies: dict[int, Any] = {}

    @hookimpl
    def edge_load(self, stage: StageContext) -> OrtStage:
        """``OrtStage.open``, its bundle handed to the plugin instead of the stage."""
        loaded = OrtStage.open(stage, self.load_config(stage.options, stage),
                               self.device_id(stage.options))
        self.copies[id(loaded)] = loaded.bundle
        loaded.bundle = None  # type: ignore[assignment]
        return loaded

    @hookimpl
    def edge_warmup_placement(self, loaded: OrtStage) -> WarmupReport:
        """The warm-up, then the copy removed: the worker has read it all."""
        try:
            return super().edge_warmup_placement(loaded)
        finally:
            self._drop(loaded)

    @hookimpl
    def edge_retire(self, loaded: OrtStage, deadline_s: float) -> Any:
        """Retire the worker; its copy goes if the warm-up did not remove it."""
        try:
            return super().edge_retire(loaded, deadline_s)
        finally:
            self._drop(loaded)

    def _drop(self, loaded: OrtStage) -> None:
        copy = self.copies.pop(id(loaded), None)
        if copy is not None:
            copy.cleanup()


@pytest.fixture(scope="module")
def nocopy() -> PluginSet:
    return load_plugins(objects={"ort-cpu-nocopy": NoCopyOrtPlugin()},
                        env={"EDGE_PLUGINS": "ort-cpu"})


KEEPING = {
    "staged": ("ort-cpu", {}),
    "in-place": ("ort-cpu", {"stage_bundle": False}),
    "no-copy": ("ort-cpu-nocopy", {}),
}


@pytest.fixture(params=sorted(KEEPING))
def keeping(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """How the stage holds its bundle: its name, and its backend and options."""
    backend, options = KEEPING[request.param]
    return request.param, {"backend": backend, "options": options}


def example(pipeline: Any) -> np.ndarray:
    """The evidence workload's example group (what ``edge run`` without inputs sends)."""
    (group,) = resolve_groups(pipeline, [], [])
    assert group.source == "example_inputs(example_inputs.npz)"
    return np.asarray(group.arrays["x"])


def test_the_example_inputs_are_those_the_stage_loaded_or_refused(
        keeping: tuple[str, dict[str, Any]], nocopy: PluginSet, ledger: ResourceLedger,
        tmp_path: Path) -> None:
    name, stage = keeping
    bundle = tmp_path / "scale"
    opened = write_scale_bundle(bundle, 2.0)
    with open_scale(nocopy, ledger, bundle, **stage) as pipeline:
        np.testing.assert_array_equal(example(pipeline), EXAMPLE_X)
        create_manifest(bundle, component="renamed", example_inputs="example_inputs.npz",
                        expected_outputs="expected.npz", overwrite=True)
        np.testing.assert_array_equal(example(pipeline), EXAMPLE_X)  # the same bytes
        rewritten = write_scale_bundle(bundle, 3.0, x=TENFOLD)
        if name == "staged":  # the copy the stage keeps: what it loaded, whatever the disk
            np.testing.assert_array_equal(example(pipeline), EXAMPLE_X)
            found = pipeline.example_inputs()
            assert found is not None and found.member == "example_inputs.npz"
            assert found.manifest.component == "scale"  # the manifest verified at open
            np.testing.assert_array_equal(found.arrays["x"], EXAMPLE_X)
        else:  # nothing kept: the disk holds other bytes than those loaded
            with pytest.raises(BundleChanged) as caught:
                example(pipeline)
            assert caught.value.field == str(bundle / "edge-manifest.json")
            assert opened in caught.value.reason and caught.value.value == rewritten
        with pipeline.run({"x": EXAMPLE_X}) as result:  # it serves what it loaded
            np.testing.assert_array_equal(result.outputs["y"], EXAMPLE_X * 2)
    assert ledger.is_empty()


def test_example_inputs_changed_under_the_same_manifest_are_refused_naming_the_file(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    bundle = tmp_path / "scale"
    write_scale_bundle(bundle, 2.0)
    with open_scale(plugins, ledger, bundle, options={"stage_bundle": False}) as pipeline:
        found = pipeline.example_inputs()
        assert found is not None
        np.testing.assert_array_equal(found.arrays["x"], EXAMPLE_X)
        np.savez(bundle / found.member, x=TENFOLD)  # the manifest is left as it was
        with pytest.raises(BundleChanged) as caught:
            pipeline.example_inputs()
        assert caught.value.field == str(bundle / found.member)
        assert "that the manifest the stage opened with" in caught.value.reason
    assert ledger.is_empty()


def reference(pipeline: Any) -> dict[str, Any]:
    """The stage's reference run made again now, on the pipeline's opener."""
    (slot,) = pipeline.lineup.current.slots
    return reference_run(pipeline.opener, slot, 0)


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "in-place"])
def test_the_reference_run_compares_the_bundle_the_stage_loaded_never_a_rewrite(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path, staged: bool) -> None:
    """A stage and its independent reference run the same bundle: the one the stage
    loaded. Its graph rewritten since (k = 3; the example inputs' bytes kept), staged the
    reference loads the copy the stage keeps (2 * x both: a match); in place its load is
    refused with ``BundleChanged`` (both sha256s) — never compared on the rewrite (3 * x:
    a mismatch the stage did not make). Rewritten whole (the example inputs too), in
    place the example inputs are refused before any reference starts."""
    bundle = tmp_path / "scale"
    opened = write_scale_bundle(bundle, 2.0)
    examples = (bundle / "example_inputs.npz").read_bytes()
    with open_scale(plugins, ledger, bundle, reference_backend="ort-cpu",
                    options={"stage_bundle": staged}) as pipeline:
        assert reference(pipeline)["passed"] is True
        write_scale_bundle(bundle, 3.0)
        (bundle / "example_inputs.npz").write_bytes(examples)  # the very bytes loaded
        graph_only = create_manifest(bundle, component="scale",
                                     example_inputs="example_inputs.npz",
                                     expected_outputs="expected.npz", overwrite=True)
        record = reference(pipeline)
        if staged:
            assert (record["passed"], record["max_abs_error"]) == (True, 0.0), record
        else:
            assert record["passed"] is False
            assert record["reason"].startswith(
                "stages[0].reference_backend (stage 's'): the reference run failed: "
                "BundleChanged: "
                f"{bundle / 'edge-manifest.json'}"), record
            assert opened in record["reason"] and graph_only.manifest_sha256 in record["reason"]
        assert record["release"] == "released"
        rewritten = write_scale_bundle(bundle, 3.0, x=TENFOLD)
        record = reference(pipeline)
        if staged:
            assert (record["passed"], record["max_abs_error"]) == (True, 0.0), record
        else:
            assert record["passed"] is False and "release" not in record
            assert record["reason"].startswith(
                "stages[0].reference_backend (stage 's'): the bundle's example inputs: "
                "BundleChanged: "
                f"{bundle / 'edge-manifest.json'}"), record
            assert opened in record["reason"] and rewritten in record["reason"]
        # the reference's worker is gone and its reservation released each time
        assert [r["owner"] for r in ledger.snapshot()["reservations"]] == ["r/s"]
    assert ledger.is_empty()


def open_chain(plugins: PluginSet, ledger: ResourceLedger, first: Path, second: Path,
               options: dict[str, Any]) -> Pipeline:
    """``a`` (``first``, its ``options``) → ``b`` (``second``, staged), the transform
    between them reading each stage's ``table.txt`` from its bundle folder."""
    config = load_pipeline({"name": "r", "stages": [
        {"id": "a", "backend": {"name": "ort-cpu", "options": options},
         "manifest": str(first)},
        {"id": "b", "backend": {"name": "ort-cpu"}, "manifest": str(second),
         "input_transform": "edge_echo.transforms:read_tables"}]})
    return Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "in-place"])
def test_a_transform_and_finish_read_the_assets_of_the_bundle_that_loaded(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path, staged: bool) -> None:
    """The bundle folders a transform (and ``finish``) gets hold what each stage loaded:
    staged, the copy (``k = 2`` still after the rewrite); in place, the bundle itself
    while unchanged, and ``BundleChanged`` (both sha256s) once rewritten — for that stage
    alone: the other stage's folder and the list of stage ids are still given."""
    first, second = tmp_path / "first", tmp_path / "second"
    opened = write_scale_bundle(first, 2.0)
    write_scale_bundle(second, 2.0)
    with open_chain(plugins, ledger, first, second, {"stage_bundle": staged}) as pipeline:
        with pipeline.run({"x": EXAMPLE_X}) as result:
            assert result.outputs["carry:tables"] == {"a": "k = 2.0\n", "b": "k = 2.0\n"}
            np.testing.assert_array_equal(result.outputs["y"], EXAMPLE_X * 4)
        folders = pipeline.bundle_directories()
        assert (folders["a"] == first) is not staged  # in place: the bundle itself
        rewritten = write_scale_bundle(first, 3.0, x=TENFOLD)
        folders = pipeline.bundle_directories()
        assert sorted(folders) == ["a", "b"]
        assert (Path(str(folders["b"])) / "table.txt").read_text() == "k = 2.0\n"
        if staged:
            with pipeline.run({"x": EXAMPLE_X}) as result:
                assert result.outputs["carry:tables"]["a"] == "k = 2.0\n"
                np.testing.assert_array_equal(result.outputs["y"], EXAMPLE_X * 4)
            assert (Path(str(folders["a"])) / "table.txt").read_text() == "k = 2.0\n"
        else:
            with pytest.raises(BundleChanged) as caught:
                pipeline.run({"x": EXAMPLE_X})
            assert caught.value.field == str(first / "edge-manifest.json")
            assert opened in caught.value.reason and caught.value.value == rewritten
            with pytest.raises(BundleChanged):
                folders["a"]
        assert pipeline.admission.used == 0
    assert ledger.is_empty()


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "in-place"])
def test_an_asset_read_through_the_folders_is_the_verified_one_whenever_it_is_rewritten(
        plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path, staged: bool) -> None:
    """A folder's lookup checks the bundle (a ``stat`` per file) and a reader opens its
    file later: a rewrite in between reaches a reader that opens the folder's files
    itself, never one that reads through ``BundleFolders.read`` (the bytes read once,
    hashed and compared with the verified manifest): staged, the copy's; in place,
    ``BundleChanged`` naming the file and both its sha256s (the manifest unchanged). A
    request whose transform reads through it is refused; the other stage still reads."""
    first, second = tmp_path / "first", tmp_path / "second"
    write_scale_bundle(first, 2.0)
    write_scale_bundle(second, 2.0)
    verified = hashlib.sha256((first / "table.txt").read_bytes()).hexdigest()
    with open_chain(plugins, ledger, first, second, {"stage_bundle": staged}) as pipeline:
        folders = pipeline.bundle_directories()
        folder = Path(str(folders["a"]))  # looked up: checked unchanged now
        assert folders.read("a", "table.txt") == b"k = 2.0\n"
        (first / "table.txt").write_bytes(b"k = 9.0\n")  # under the same manifest
        now = hashlib.sha256(b"k = 9.0\n").hexdigest()
        if staged:
            assert folders.read("a", "table.txt") == b"k = 2.0\n"
            with pipeline.run({"x": EXAMPLE_X}) as result:
                assert result.outputs["carry:tables"]["a"] == "k = 2.0\n"
        else:
            # the caveat that remains: a path opened after the lookup reads the rewrite
            assert (folder / "table.txt").read_bytes() == b"k = 9.0\n"
            with pytest.raises(BundleChanged) as caught:
                folders.read("a", "table.txt")
            assert caught.value.field == str(first / "table.txt")
            assert f"differs from the sha256 {verified}" in caught.value.reason
            assert caught.value.value == now
            with pytest.raises(BundleChanged):
                pipeline.run({"x": EXAMPLE_X})
        assert folders.read("b", "table.txt") == b"k = 2.0\n"
        with pytest.raises(MemberPathRefused):
            folders.read("b", "notes.txt")  # not a verified member
        assert pipeline.admission.used == 0
    assert ledger.is_empty()


def test_a_stage_that_keeps_no_bundle_has_no_verified_asset_to_read(
        nocopy: PluginSet, ledger: ResourceLedger, tmp_path: Path) -> None:
    bundle = tmp_path / "scale"
    write_scale_bundle(bundle, 2.0)
    with open_scale(nocopy, ledger, bundle, backend="ort-cpu-nocopy") as pipeline:
        folders = pipeline.bundle_directories()
        assert folders["s"] is None
        with pytest.raises(MemberMissing) as caught:
            folders.read("s", "table.txt")
        assert caught.value.field == "bundles['s']"
    assert ledger.is_empty()
