"""What a worker loads of a bundle verified in place is the bundle verified.

Real ort-cpu workers over the ``y = k * x`` bundle of ``test_ort_cpu_restart_bundle``,
with no expected outputs: on the CPU provider the warm-up then has nothing to compare,
so a graph other than the one verified would open and serve unnoticed. The bundle is
rewritten in the window the check before the load cannot see: after the controller's
pre-load check (``ensure_unchanged``), before the worker opens the graph (``OrtStage.start``
wrapped to rewrite first, then start the worker). Verified in place, the stage is refused
with ``BundleChanged`` once the worker has loaded (a ``stat`` per file again: any write
moved a file's ctime), its worker retired, before any warm-up; staged, the worker loads
the private copy and serves the bundle verified. Each refusal leaves no worker, segment
or staged copy, and nothing charged.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core import hookimpl
from edge_core.artifacts import BundleChanged
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.controller import OrtStage

from .conftest import EXAMPLE_X
from .test_ort_cpu_restart_bundle import open_scale, write_scale_bundle

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


class Warmups:
    """Counts the warm-ups that ran (a hook wrapper)."""

    EDGE_CONTRACT = "1.0"

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl(wrapper=True)
    def edge_warmup_placement(self, loaded: Any) -> Generator[None, Any, Any]:
        self.calls += 1
        return (yield)


def rewrite_before_the_worker_starts(monkeypatch: pytest.MonkeyPatch,
                                     act: Callable[[], None]) -> None:
    """``act`` runs after the stage's pre-load check, right before its worker starts."""
    start = OrtStage.start.__func__  # type: ignore[attr-defined]

    def rewriting(cls: type[OrtStage], *args: Any, **kwargs: Any) -> OrtStage:
        act()
        return start(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(OrtStage, "start", classmethod(rewriting))


def copy_over(source: Path, bundle: Path, *names: str) -> Callable[[], None]:
    """Copy ``names`` of ``source`` over ``bundle``'s (a write in place, as ``cp`` does)."""
    def act() -> None:
        for name in names:
            shutil.copyfile(source / name, bundle / name)
    return act


def open_stage(warmups: Warmups, ledger: ResourceLedger, bundle: Path, staged: bool) -> Any:
    """Open the scale stage with ``warmups`` counting; the pipeline."""
    plugins = load_plugins(objects={"warmups": warmups}, env={"EDGE_PLUGINS": "ort-cpu"})
    return open_scale(plugins, ledger, bundle, options={"stage_bundle": staged})


def test_a_graph_rewritten_before_the_worker_opens_it_is_refused_once_it_loaded(
        ledger: ResourceLedger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle, tripled = tmp_path / "scale", tmp_path / "tripled"
    write_scale_bundle(bundle, 2.0, expected=False)
    write_scale_bundle(tripled, 3.0, expected=False)
    rewrite_before_the_worker_starts(monkeypatch, copy_over(tripled, bundle, "model.onnx"))
    warmups = Warmups()
    with pytest.raises(BundleChanged) as caught:
        open_stage(warmups, ledger, bundle, staged=False).close()
    assert caught.value.field == 'manifest.files["model.onnx"]'
    assert caught.value.reason == "changed in the bundle after verification"
    assert any("worker retired: verified=True" in note
               for note in getattr(caught.value, "__notes__", ()))
    assert warmups.calls == 0  # refused before any warm-up ran on the rewrite
    assert ledger.is_empty()


def test_a_bundle_redeployed_before_the_worker_opens_it_is_refused_naming_both_manifests(
        ledger: ResourceLedger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph, examples and manifest rewritten consistently (a fresh verification would
    pass): refused naming the manifest, the sha256 verified and the one now."""
    bundle, tripled = tmp_path / "scale", tmp_path / "tripled"
    opened = write_scale_bundle(bundle, 2.0, expected=False)
    now = write_scale_bundle(tripled, 3.0, expected=False, x=EXAMPLE_X * 10)
    rewrite_before_the_worker_starts(monkeypatch, copy_over(
        tripled, bundle, "model.onnx", "example_inputs.npz", "table.txt",
        "edge-manifest.json"))
    warmups = Warmups()
    with pytest.raises(BundleChanged) as caught:
        open_stage(warmups, ledger, bundle, staged=False).close()
    assert caught.value.field == str(bundle / "edge-manifest.json")
    assert f"rewritten since the stage opened with manifest sha256 {opened}" in (
        caught.value.reason)
    assert "a worker loads only the bundle its stage verified" in caught.value.reason
    assert caught.value.value == now
    assert warmups.calls == 0
    assert ledger.is_empty()


def test_a_staged_bundle_rewritten_before_the_worker_starts_serves_the_copy(
        ledger: ResourceLedger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle, tripled = tmp_path / "scale", tmp_path / "tripled"
    write_scale_bundle(bundle, 2.0, expected=False)
    write_scale_bundle(tripled, 3.0, expected=False)
    rewrite_before_the_worker_starts(monkeypatch, copy_over(tripled, bundle, "model.onnx"))
    warmups = Warmups()
    with open_stage(warmups, ledger, bundle, staged=True) as pipeline:
        assert warmups.calls == 1
        with pipeline.run({"x": EXAMPLE_X}) as result:
            np.testing.assert_array_equal(result.outputs["y"], EXAMPLE_X * 2)
    assert ledger.is_empty()
