"""ort-cpu stages from the warm pool: forked workers with real onnxruntime sessions."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from edge_core.config import load_pipeline
from edge_core.host import warm_pool
from edge_core.host.start_path import FORKED
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and hasattr(os, "pidfd_open")),
    reason="the warm pool needs Linux with pidfd_open",
)


def test_two_ort_cpu_stages_are_forked_verified_and_exact(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    direct = ort.InferenceSession(str(add_relu_bundle["graph"]), providers=["CPUExecutionProvider"])
    stage = {"backend": {"name": "ort-cpu", "options": {}},
             "manifest": str(add_relu_bundle["dir"])}
    first_config, second_config = (load_pipeline({"name": name, "stages": [{"id": "s", **stage}]})
                                   for name in ("p", "q"))
    with Pipeline.open(first_config, plugins, ledger) as first, \
            Pipeline.open(second_config, plugins, ledger) as second:
        starts = []
        for pipeline in (first, second):
            (plan,) = pipeline.execution_plan()["stages"]
            worker = plan["worker"]
            assert worker["start"]["kind"] == FORKED, worker["start"]
            assert plan["numerics"]["passed"] is True
            supervisor = psutil.Process(worker["pid"]).parent()
            assert supervisor is not None
            zygote = supervisor.parent()
            assert zygote is not None and zygote.pid == worker["start"]["zygote"]
            assert zygote.ppid() == os.getpid()
            starts.append(worker["start"])
            x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
            (expected,) = direct.run(["y"], {"x": x})
            with pipeline.run({"x": x}) as result:
                np.testing.assert_array_equal(result.outputs["y"], expected)
        assert starts[0]["zygote"] == starts[1]["zygote"]
        assert starts[1]["forks"] == starts[0]["forks"] + 1
    assert ledger.is_empty()


def _open_six(plugins: PluginSet, ledger: ResourceLedger, bundle: dict[str, Path],
              telemetry: bytes) -> int:
    """Six one-stage ort-cpu pipelines in turn, each forked and exact: their one zygote."""
    direct = ort.InferenceSession(str(bundle["graph"]), providers=["CPUExecutionProvider"])
    stage = {"id": "s", "backend": {"name": "ort-cpu", "options": {}},
             "manifest": str(bundle["dir"])}
    zygotes = set()
    for number in range(6):
        config = load_pipeline({"name": f"p{number}", "stages": [stage]})
        with Pipeline.open(config, plugins, ledger) as pipeline:
            (plan,) = pipeline.execution_plan()["stages"]
            worker = plan["worker"]
            assert worker["start"]["kind"] == FORKED, worker["start"]
            zygotes.add(worker["start"]["zygote"])
            with open(f"/proc/{worker['pid']}/environ", "rb") as environ:
                assert b"ORT_DISABLE_TELEMETRY=" + telemetry in environ.read().split(b"\0")
            x = np.random.default_rng(number).standard_normal((2, 3)).astype(np.float32)
            (expected,) = direct.run(["y"], {"x": x})
            with pipeline.run({"x": x}) as result:
                np.testing.assert_array_equal(result.outputs["y"], expected)
    assert ledger.is_empty()
    (zygote,) = zygotes
    return zygote


def test_by_default_ort_telemetry_is_off_and_the_zygote_holds_onnxruntime(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Where the user sets nothing, workers get ORT_DISABLE_TELEMETRY=1 and the zygote
    # imports onnxruntime: no uploader thread, so forking it is safe; every worker forked
    # from it creates and runs its own session
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
    monkeypatch.setenv("LANGUAGE", f"ort-{uuid.uuid4().hex}")  # a zygote of this test's own
    warm_pool.close_pool()  # room for it: a zygote started ahead never closes one
    zygote = _open_six(plugins, ledger, add_relu_bundle, b"1")
    with open(f"/proc/{zygote}/maps") as maps:
        assert "onnxruntime_pybind11_state" in maps.read()
    assert len(os.listdir(f"/proc/{zygote}/task")) == 1


def test_a_user_who_turns_ort_telemetry_on_gets_it_and_a_zygote_without_onnxruntime(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ORT_DISABLE_TELEMETRY=0 passes as given; ONNX Runtime's import would then start its
    # uploader thread, so the zygote leaves it to each forked worker
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "0")
    monkeypatch.setenv("LANGUAGE", f"ort-{uuid.uuid4().hex}")
    warm_pool.close_pool()
    zygote = _open_six(plugins, ledger, add_relu_bundle, b"0")
    with open(f"/proc/{zygote}/maps") as maps:
        assert "onnxruntime_pybind11_state" not in maps.read()
    assert len(os.listdir(f"/proc/{zygote}/task")) == 1


def test_the_open_starts_the_zygote_an_ort_cpu_stage_forks_from(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the key expected as the open begins (early_zygotes) is the ort-cpu stage's own:
    # its worker forks from the zygote started before any stage was loaded
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
    monkeypatch.setenv("LANGUAGE", f"ort-{uuid.uuid4().hex}")
    warm_pool.close_pool()
    before = warm_pool.pool_processes()
    seen: list[frozenset[int]] = []

    def progress(line: str) -> None:
        if line.startswith("loading stage") and not seen:
            seen.append(warm_pool.pool_processes() - before)

    config = load_pipeline({"name": "early", "stages": [{
        "id": "s", "backend": {"name": "ort-cpu", "options": {}},
        "manifest": str(add_relu_bundle["dir"])}]})
    with Pipeline.open(config, plugins, ledger, progress=progress) as pipeline:
        (early,) = seen[0]
        (plan,) = pipeline.execution_plan()["stages"]
        assert plan["worker"]["start"] == {"kind": FORKED, "reason": None, "zygote": early,
                                           "forks": 1}
    assert ledger.is_empty()


def test_the_backend_declares_the_preload_its_stage_starts_with(plugins: PluginSet) -> None:
    # Pipeline.open starts a zygote of the declared key; the stage's starts ask for
    # theirs: the two must agree, or the zygote started ahead is another key's
    from edge_ort.controller import OrtStage

    info, _ = plugins.backends["ort-cpu"]
    assert info.worker_preload == OrtStage.worker_preload == ("onnxruntime",)

