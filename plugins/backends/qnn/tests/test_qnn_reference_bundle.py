"""A warm-up compares a QNN target with a CPU run of the graph verified, never another.

Real QNN (HTP simulator) and CPU sessions in real workers, over the static conv-relu
bundle without expected outputs: the worker compares the target's outputs with a run of
a CPU session. The bundle is verified in place (``stage_bundle = false``) and its graph
rewritten with other weights — once the worker has loaded, before the warm-up (a hook
wrapper), or before the worker opens it (``OrtStage.start`` wrapped to rewrite first).
The CPU reference is made at the worker's load from the graph its target's session
loaded, and the controller checks the bundle unchanged once that load ended: a rewrite
after it is never compared with (the warm-up compares with the graph verified and the
stage serves it), a rewrite before it is refused with ``BundleChanged`` before any
warm-up. Before, the reference was read from disk at the warm-up: the target's outputs
were compared with the rewrite's and the stage was refused for numerics it did not have.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edge_core import hookimpl
from edge_core.artifacts import BundleChanged
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.runtime import Pipeline
from edge_ort.controller import OrtStage

from .conftest import build_conv_relu, example_input, make_bundle

CPU = "CPUExecutionProvider"


class BeforeWarmup:
    """Runs ``act`` (when given) right before each warm-up, and counts the warm-ups."""

    EDGE_CONTRACT = "1.0"

    def __init__(self, act: Callable[[], None] | None = None) -> None:
        self.act = act
        self.calls = 0

    @hookimpl(wrapper=True)
    def edge_warmup_placement(self, loaded: Any) -> Generator[None, Any, Any]:
        self.calls += 1
        if self.act is not None:
            self.act()
        return (yield)


def open_in_place(wrapper: BeforeWarmup, ledger: ResourceLedger, bundle: Path,
                  cache: Path) -> Pipeline:
    plugins = load_plugins(objects={"before-warmup": wrapper}, env={"EDGE_PLUGINS": "qnn"})
    config = load_pipeline({"name": "p", "stages": [{
        "id": "s", "manifest": str(bundle),
        "backend": {"name": "qnn", "options": {"context_cache_dir": str(cache),
                                               "stage_bundle": False}}}]})
    return Pipeline.open(config, plugins, ledger)


def cpu_run(graph: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(graph), providers=[CPU])
    return np.asarray(session.run(["y"], {"x": x})[0])


def test_a_graph_rewritten_before_the_warmup_is_never_the_cpu_reference(
        ledger: ResourceLedger, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "static", expected=False)
    verified = shutil.copyfile(bundle / "model.onnx", tmp_path / "verified.onnx")
    other = build_conv_relu(tmp_path / "other.onnx", seed=4)
    x = example_input(100)
    assert not np.allclose(cpu_run(other, x), cpu_run(verified, x), atol=1e-2)
    wrapper = BeforeWarmup(lambda: shutil.copyfile(other, bundle / "model.onnx"))
    with open_in_place(wrapper, ledger, bundle, tmp_path / "cache") as pipeline:
        assert wrapper.calls == 1
        plan = pipeline.execution_plan()["stages"][0]
        assert plan["numerics"]["reference"] == "cpu-run"
        assert plan["numerics"]["passed"] is True
        assert plan["numerics"]["max_abs_error"] <= 1e-4
        assert plan["worker"]["load"]["reference"]["providers"] == [CPU]
        with pipeline.run({"x": x}) as result:  # the graph verified, as the reference
            np.testing.assert_allclose(result.outputs["y"], cpu_run(verified, x),
                                       atol=1e-4, rtol=1e-4)


def test_a_graph_rewritten_before_the_worker_loads_it_is_refused_and_never_compared(
        ledger: ResourceLedger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = make_bundle(tmp_path / "static", expected=False)
    other = build_conv_relu(tmp_path / "other.onnx", seed=4)
    start = OrtStage.start.__func__  # type: ignore[attr-defined]

    def rewriting(cls: type[OrtStage], *args: Any, **kwargs: Any) -> OrtStage:
        shutil.copyfile(other, bundle / "model.onnx")  # after the pre-load check
        return start(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(OrtStage, "start", classmethod(rewriting))
    wrapper = BeforeWarmup()
    with pytest.raises(BundleChanged) as caught:
        open_in_place(wrapper, ledger, bundle, tmp_path / "cache").close()
    assert caught.value.field == 'manifest.files["model.onnx"]'
    assert wrapper.calls == 0  # no warm-up: nothing compared


def test_a_context_compiled_from_a_graph_rewritten_before_the_load_is_never_reused(
        ledger: ResourceLedger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The EP-context key is made of the sha256s verified, but the worker compiles what it
    reads: a load refused because the bundle changed before it ended removes the entries
    it wrote. Otherwise the verified bytes, put back, would load the rewrite's compiled
    graph under their own key."""
    bundle = make_bundle(tmp_path / "static", expected=False)
    verified = shutil.copyfile(bundle / "model.onnx", tmp_path / "verified.onnx")
    other = build_conv_relu(tmp_path / "other.onnx", seed=4)
    x = example_input(100)
    assert not np.allclose(cpu_run(other, x), cpu_run(verified, x), atol=1e-2)
    start = OrtStage.start.__func__  # type: ignore[attr-defined]

    def rewriting(cls: type[OrtStage], *args: Any, **kwargs: Any) -> OrtStage:
        shutil.copyfile(other, bundle / "model.onnx")  # after the pre-load check
        return start(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(OrtStage, "start", classmethod(rewriting))
    cache = tmp_path / "cache"
    with pytest.raises(BundleChanged) as caught:
        open_in_place(BeforeWarmup(), ledger, bundle, cache).close()
    assert any("EP-context cache entries it wrote removed" in note
               for note in getattr(caught.value, "__notes__", ()))
    assert list(cache.iterdir()) == []
    monkeypatch.undo()
    shutil.copyfile(verified, bundle / "model.onnx")  # the bytes verified, back in place
    with open_in_place(BeforeWarmup(), ledger, bundle, cache) as pipeline:
        context = pipeline.execution_plan()["stages"][0]["worker"]["load"]["ep_context"]
        assert (context["reused"], context["written"]) == (False, True)
        with pipeline.run({"x": x}) as result:
            np.testing.assert_allclose(result.outputs["y"], cpu_run(verified, x),
                                       atol=1e-4, rtol=1e-4)
