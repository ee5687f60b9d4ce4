"""The ort-cpu backend under faults: a stopped worker, an oversize request, cancel outcomes.

Real bundles, real workers, real onnxruntime sessions (see docs/runtime.md).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from edge_contracts.errors import InvalidValue
from edge_contracts.request_faults import RequestFault
from edge_contracts.shapesets import ShapeRefused
from edge_core.artifacts import create_manifest
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import (
    Pipeline,
    RequestCancelled,
    RequestFailed,
    RequestTooLarge,
    StageState,
    WorkerUnresponsive,
)
from edge_core.testing.leaks import no_leaks as _no_leaks

from .conftest import EXAMPLE_X

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    """True once no process ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def open_stage(plugins: PluginSet, ledger: ResourceLedger, bundle: Path,
               **stage: Any) -> Pipeline:
    config = load_pipeline({"name": "f", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu"}, "manifest": str(bundle), **stage},
    ]})
    return Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)


def test_a_stopped_ort_worker_with_a_call_outstanding_is_unresponsive_within_two_seconds(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    with open_stage(plugins, ledger, add_relu_bundle["dir"]) as pipeline:
        stage = pipeline.stage("s")
        pid = int(str(stage.loaded.describe()["pid"]))
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(WorkerUnresponsive, match="stopped"):
                pipeline.run({"x": EXAMPLE_X})
            assert time.monotonic() - started < 2.0 + 1.0  # promised 2 s, plus host slack
            end = time.monotonic() + 15
            while stage.last_retire is None and time.monotonic() < end:
                time.sleep(0.02)
        finally:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGCONT)
        assert stage.state is StageState.FAILED
        assert stage.last_retire.verified is True
        assert gone(pid)
        assert ledger.is_empty()
        stage.restart()
        with pipeline.run({"x": EXAMPLE_X}) as result:
            assert result.final.key.generation == 2
    assert ledger.is_empty()


def test_an_oversize_request_is_refused_and_the_ort_stage_keeps_serving(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    with open_stage(plugins, ledger, add_relu_bundle["dir"], max_io_bytes=100) as pipeline:
        pid = pipeline.stage("s").loaded.describe()["pid"]
        big = {"x": np.ones((2, 30), np.float32)}  # 240 bytes
        with pytest.raises(RequestTooLarge, match=r"stages\[s\]\.max_io_bytes: .* 240 bytes"):
            pipeline.run(big)
        with pipeline.run({"x": EXAMPLE_X}) as result:
            assert result.outputs["y"].shape == EXAMPLE_X.shape
        assert pipeline.stage("s").loaded.describe()["pid"] == pid


def test_inputs_that_are_not_arrays_are_taken_as_numpy_takes_them_or_refused_by_name(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    with open_stage(plugins, ledger, add_relu_bundle["dir"]) as pipeline:
        pid = pipeline.stage("s").loaded.describe()["pid"]
        reserved = ledger.snapshot()["reservations"]
        as_list = [[np.float32(v) for v in row] for row in EXAMPLE_X]  # float32 to NumPy
        with pipeline.run({"x": as_list}) as result:
            assert np.array_equal(result.outputs["y"], np.maximum(EXAMPLE_X + EXAMPLE_X, 0))
        with pytest.raises(ShapeRefused, match=r"inputs\.x: dtype float64 is not served "
                                               r"\(only float32\)"):
            pipeline.run({"x": EXAMPLE_X.tolist()})  # Python floats: float64
        for value in (np.array([[None] * 3] * 2), "x", None):
            with pytest.raises(InvalidValue, match=r"^inputs\.x\.dtype: unsupported dtype"):
                pipeline.run({"x": value})
        assert ledger.snapshot()["reservations"] == reserved  # nothing more charged
        with pipeline.run({"x": EXAMPLE_X}) as result:
            assert result.outputs["y"].shape == EXAMPLE_X.shape
        assert pipeline.stage("s").loaded.describe()["pid"] == pid
    assert ledger.is_empty()


@pytest.fixture
def lookup_bundle(tmp_path: Path) -> Path:
    """A bundle whose graph gathers rows of a 10x2 table by ``ids`` (int64[3])."""
    root = tmp_path / "lookup"
    root.mkdir()
    table = helper.make_tensor("table", TensorProto.FLOAT, [10, 2],
                               np.arange(20, dtype=np.float32).tolist())
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"])], "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [3, 2])], [table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              root / "model.onnx")
    np.savez(root / "example.npz", ids=np.array([0, 4, 9], np.int64))
    create_manifest(root, graph="model.onnx", example_inputs="example.npz")
    return root


def test_input_values_the_runtime_refuses_are_the_requests_fault_and_the_stage_serves_on(
    plugins: PluginSet, ledger: ResourceLedger, lookup_bundle: Path
) -> None:
    with open_stage(plugins, ledger, lookup_bundle) as pipeline:
        pid = pipeline.stage("s").loaded.describe()["pid"]
        reserved = ledger.snapshot()["reservations"]
        with pytest.raises(RequestFailed) as caught:  # row 70 of 10: a value, not a shape
            pipeline.run({"ids": np.array([1, 70, 3], np.int64)})
        error = caught.value
        assert error.error_type == "InputValuesRefused"
        assert error.error_message.startswith("ONNX Runtime refused the inputs' values: ")
        assert "idx=70" in error.error_message
        assert error.request_fault == RequestFault("invalid_value", "inputs")
        assert ledger.snapshot()["reservations"] == reserved
        with pipeline.run({"ids": np.array([1, 7, 3], np.int64)}) as result:
            assert result.outputs["rows"].tolist() == [[2, 3], [14, 15], [6, 7]]
        assert pipeline.stage("s").loaded.describe()["pid"] == pid
        assert pipeline.stage("s").state is StageState.READY
    assert ledger.is_empty()


@pytest.fixture
def negate_bundle(tmp_path: Path) -> Path:
    """A bundle whose graph negates a bool[3] (``Not``)."""
    root = tmp_path / "negate"
    root.mkdir()
    graph = helper.make_graph(
        [helper.make_node("Not", ["x"], ["y"])], "negate",
        [helper.make_tensor_value_info("x", TensorProto.BOOL, [3])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              root / "model.onnx")
    np.savez(root / "example.npz", x=np.array([True, False, True]))
    create_manifest(root, graph="model.onnx", example_inputs="example.npz")
    return root


def test_a_bool_input_viewed_from_other_bytes_is_the_requests_fault_naming_it(
    plugins: PluginSet, ledger: ResourceLedger, negate_bundle: Path
) -> None:
    """The wire's bool is one byte, 0 or 1; a bool array viewed from other bytes holds 7.

    The worker refused it as an undeclared ``DescriptorInvalid`` on ``tensors.x`` (with
    its traceback): a server error where the request's own values were at fault.
    """
    with open_stage(plugins, ledger, negate_bundle) as pipeline:
        stage = pipeline.stage("s")
        pid = stage.loaded.describe()["pid"]
        reserved = ledger.snapshot()["reservations"]
        stray = np.array([0, 1, 7], dtype=np.uint8).view(bool)
        with pytest.raises(RequestFailed) as caught:
            pipeline.run({"x": stray})
        error = caught.value
        assert error.error_type == "BoolInputInvalid", error
        assert error.error_message == ("inputs.x: a bool tensor's bytes must each be 0 or 1 "
                                       "(the largest is shown): 7")
        assert error.request_fault == RequestFault("invalid_value", "inputs.x")
        assert "Traceback" not in str(error)
        assert (stage.outstanding, ledger.snapshot()["reservations"]) == (0, reserved)
        with pipeline.run({"x": np.array([0, 1, 1], dtype=np.uint8).view(bool)}) as result:
            assert result.outputs["y"].tolist() == [True, False, False]
        assert stage.loaded.describe()["pid"] == pid
        assert stage.state is StageState.READY
    assert ledger.is_empty()


def test_cancel_after_the_ort_worker_finished_is_already_finished_not_in_place(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    with open_stage(plugins, ledger, add_relu_bundle["dir"]) as pipeline:
        stage = pipeline.stage("s")
        client = stage.loaded.client  # type: ignore[attr-defined]
        for _ in range(20):
            pending = stage.submit({"x": EXAMPLE_X})
            end = time.monotonic() + 10
            while client.in_flight(pending.request_id) and time.monotonic() < end:
                time.sleep(0.001)
            assert pipeline.cancel() == {"s": "already-finished"}
            with pytest.raises(RequestCancelled):
                pending.result()
        assert stage.state is StageState.READY
