"""The shared ONNX Runtime handler, driven directly (the serve loop is tested in core)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.shapesets import ShapeSet
from edge_ort.bucket import BucketMismatch, spec_of
from edge_ort.numerics import compare_outputs
from edge_ort.worker import OrtHandler


def config(bundle: dict[str, Path], **extra: Any) -> dict[str, Any]:
    return {
        "graph": str(bundle["graph"]),
        "target": "CPUExecutionProvider",
        "providers": [["CPUExecutionProvider", {}]],
        "example_inputs": str(bundle["example"]),
        "expected_outputs": str(bundle["expected"]),
        "intra_op_threads": 1,
        **extra,
    }


@pytest.mark.parametrize("method", ["assignment", "profiling"])
def test_warmup_reports_every_node_on_cpu_by_either_method(
    add_relu_bundle: dict[str, Path], method: str
) -> None:
    handler = OrtHandler()
    try:
        loaded = handler.load(config(add_relu_bundle, placement_method=method))
        assert loaded["target_available"] is True
        assert loaded["session_providers"] == ["CPUExecutionProvider"]
        report = handler.warmup({})
    finally:
        handler.close()
    providers = report["placement"]["providers"]
    assert set(providers) == {"CPUExecutionProvider"}
    assert providers["CPUExecutionProvider"]["nodes"] == 2
    assert providers["CPUExecutionProvider"]["op_types"] == {"Add": 1, "Relu": 1}
    assert sorted(providers["CPUExecutionProvider"]["node_names"]) == ["add0", "relu0"]
    assert report["numerics"]["passed"] is True
    assert report["numerics"]["outputs"]["y"]["exact"] is True
    assert [b["shapes"] for b in report["buckets"]] == [{"x": [2, 3]}]
    assert report["shape_set"] == [
        {"name": "example", "inputs": {"x": {"dtype": "float32", "dims": [2, 3]}}}]


class StandInSessionWithoutAssignmentInfo:
    """Stand-in for an ONNX Runtime build without ``get_provider_graph_assignment_info``
    (onnxruntime < 1.24.1, -qnn, -directml, vendor builds), which cannot be installed
    next to the suite's 1.32: a real ``InferenceSession`` with only that method missing,
    on the class (what the worker checks) and on the instance."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import onnxruntime as ort

        self._session = ort.InferenceSession(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "get_provider_graph_assignment_info":
            raise AttributeError(name)
        return getattr(self._session, name)


def onnxruntime_without_assignment_info() -> Any:
    """The real onnxruntime module, its ``InferenceSession`` the stand-in above."""
    import types

    import onnxruntime as ort

    module = types.SimpleNamespace(**{k: getattr(ort, k) for k in dir(ort)
                                      if not k.startswith("__") or k == "__version__"})
    module.InferenceSession = StandInSessionWithoutAssignmentInfo
    return module


def test_assignment_on_a_build_without_it_is_refused_at_load_by_name(
    add_relu_bundle: dict[str, Path],
) -> None:
    """Before, the load took it and the warm-up failed with AttributeError."""
    handler = OrtHandler()
    handler._ort = onnxruntime_without_assignment_info()
    try:
        with pytest.raises(InvalidValue, match=r"^placement_method: this onnxruntime build "
                           r"\(1\.\d+\.\d+\) has no InferenceSession\."
                           r"get_provider_graph_assignment_info .*'auto' or 'profiling' "
                           r"work here: 'assignment'$") as info:
            handler.load(config(add_relu_bundle, placement_method="assignment"))
        assert (info.value.field, info.value.value) == ("placement_method", "assignment")
        assert handler._session is None  # refused before any session was made
    finally:
        handler.close()


def test_auto_on_a_build_without_assignment_info_observes_by_profiling(
    add_relu_bundle: dict[str, Path],
) -> None:
    handler = OrtHandler()
    handler._ort = onnxruntime_without_assignment_info()
    try:
        loaded = handler.load(config(add_relu_bundle, placement_method="auto"))
        assert loaded["placement_method"] == "profiling"
        report = handler.warmup({})
    finally:
        handler.close()
    assert report["placement"]["method"] == "profiling"
    assert report["placement"]["providers"]["CPUExecutionProvider"]["nodes"] == 2


def test_profiling_leaves_no_file_behind(add_relu_bundle: dict[str, Path]) -> None:
    handler = OrtHandler()
    handler.load(config(add_relu_bundle, placement_method="profiling"))
    profile_dir = handler._profile_dir
    assert profile_dir is not None
    handler.warmup({})
    handler.close()
    assert not Path(profile_dir).exists()


def test_plain_onnxruntime_runs_on_the_cpu_when_the_asked_provider_is_absent(
    add_relu_bundle: dict[str, Path],
) -> None:
    """The peer: ONNX Runtime itself takes a session asking for DirectML first, warns, and
    runs it on the CPU, without an error (what edge's handler refuses, below)."""
    import onnxruntime as ort

    assert "DmlExecutionProvider" not in ort.get_available_providers()
    with pytest.warns(UserWarning, match="'DmlExecutionProvider' is not in available"):
        session = ort.InferenceSession(
            str(add_relu_bundle["graph"]),
            providers=["DmlExecutionProvider", "CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    with np.load(add_relu_bundle["example"]) as example:
        inputs = {name: example[name] for name in example.files}
    assert session.run(None, inputs)  # it answers, on the CPU


def test_absent_provider_creates_no_session(add_relu_bundle: dict[str, Path]) -> None:
    handler = OrtHandler()
    loaded = handler.load(config(
        add_relu_bundle, target="DmlExecutionProvider",
        providers=[["DmlExecutionProvider", {}], ["CPUExecutionProvider", {}]],
    ))
    assert loaded["target_available"] is False
    assert "DmlExecutionProvider" not in loaded["available_providers"]
    with pytest.raises(RuntimeError, match="target provider was unavailable"):
        handler.warmup({})


def test_versions_name_the_onnxruntime_distribution() -> None:
    versions = OrtHandler().versions()
    assert versions["onnxruntime_distribution"] == "onnxruntime"
    assert versions["onnxruntime"].count(".") >= 2


def test_wrong_expected_outputs_fail_the_numerical_check(
    add_relu_bundle: dict[str, Path], tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, y=np.zeros((2, 3), np.float32))
    handler = OrtHandler()
    handler.load(config(add_relu_bundle, expected_outputs=str(wrong)))
    numerics = handler.warmup({})["numerics"]
    handler.close()
    assert numerics["passed"] is False
    assert numerics["max_abs_error"] == pytest.approx(6.0)


def test_a_single_bucket_refuses_other_names_dtypes_and_shapes() -> None:
    shapes = ShapeSet.single({"x": ("float32", (2, 3))})
    shapes.match({"x": ("float32", (2, 3))})
    with pytest.raises(BucketMismatch, match=r"inputs: input names differ"):
        shapes.match({"z": ("float32", (2, 3))})
    with pytest.raises(BucketMismatch, match=r"inputs\.x: dtype float64 is not served "
                                             r"\(only float32\); "
                                             r"served: example\{x: float32\[2,3\]\}: "
                                             r"'float64\[2, 3\]'"):
        shapes.match({"x": ("float64", (2, 3))})
    with pytest.raises(BucketMismatch, match=r"inputs\.x: .*'float32\[4, 3\]'"):
        shapes.match({"x": ("float32", (4, 3))})


def test_the_handler_accepts_again_only_the_lone_input_it_accepted_last(
    add_relu_bundle: dict[str, Path],
) -> None:
    """The worker's check of a call (``LoneAccepted``): an accepted input's shape is
    accepted again without matching, and no other name, dtype or shape is."""
    from edge_contracts.headers import FrameHeader
    from edge_contracts.worker_call import Call

    handler = OrtHandler()
    handler.load(config(add_relu_bundle))
    handler.warmup({})
    header = FrameHeader("run", "r", "s0", 0, 1)
    x = np.load(add_relu_bundle["example"])["x"]
    expected = np.load(add_relu_bundle["expected"])["y"]
    try:
        for _ in range(2):
            outputs = handler.submit(Call(_ZeroCopyLoop(use_shm=False), header, {"x": x}, []))
            assert outputs is not None
            np.testing.assert_array_equal(outputs["y"], expected)
        wider = np.zeros((*x.shape[:-1], x.shape[-1] + 1), x.dtype)
        for inputs in ({"x": wider}, {"x": x.astype(np.float64)}, {"z": x}):
            with pytest.raises(BucketMismatch):
                handler.submit(Call(_ZeroCopyLoop(use_shm=False), header, inputs, []))
    finally:
        handler.close()


def test_compare_outputs_bounds_and_shapes() -> None:
    ref = {"y": np.array([1.0, 2.0], np.float32)}
    close = compare_outputs({"y": np.array([1.0, 2.00001], np.float32)}, ref,
                            {"max_abs_error": 1e-3, "normalised_error": 1e-3})
    assert close["passed"] is True
    assert close["outputs"]["y"]["exact"] is False
    shape = compare_outputs({"y": np.zeros(3, np.float32)}, ref)
    assert shape["passed"] is False
    assert "expected float32[2]" in shape["outputs"]["y"]["problem"]
    missing = compare_outputs({}, ref)
    assert missing["outputs"]["y"]["problem"] == "output missing"


def test_compare_outputs_says_why_an_output_failed_in_json_that_a_wire_carries() -> None:
    ref = {"y": np.array([[0.0, 1.0, 4.0], [6.0, 0.0, 0.5]], np.float32)}
    got = ref["y"].copy()

    def why(actual: dict[str, np.ndarray]) -> dict[str, Any]:
        record = compare_outputs(actual, ref)
        json.dumps(record, allow_nan=False)  # the worker's reply refuses NaN and infinity
        return dict(record["outputs"]["y"])

    assert why({})["why"] == "missing"
    shape = why({"y": got.reshape(3, 2)})
    assert (shape["why"], shape["expected"], shape["got"]) == (
        "shape", {"dtype": "float32", "shape": [2, 3]}, {"dtype": "float32", "shape": [3, 2]})
    dtype = why({"y": got.astype(np.float64)})
    assert (dtype["why"], dtype["expected"]["dtype"], dtype["got"]["dtype"]) == (
        "dtype", "float32", "float64")
    values = got.copy()
    values[1, 2] = 0.0  # 0.5 off; a smaller difference elsewhere is not the worst
    values[0, 1] = 1.001
    tolerance = why({"y": values})
    assert (tolerance["why"], tolerance["exceeds"], tolerance["worst"]) == (
        "tolerance", ["max_abs_error", "normalised_error"],
        {"index": [1, 2], "expected": 0.5, "got": 0.0})
    assert "why" not in why({"y": got}) and why({"y": got})["worst"]["index"] == [0, 0]
    nan = got.copy()
    nan[1, 0] = np.nan
    assert why({"y": nan})["why"] == "nan"
    assert why({"y": nan})["worst"] == {"index": [1, 0], "expected": 6.0, "got": "nan"}
    inf = got.copy()
    inf[0, 2] = np.inf
    record = compare_outputs({"y": inf}, ref)
    assert (record["max_abs_error"], record["normalised_error"]) == ("inf", "inf")
    assert why({"y": inf})["worst"] == {"index": [0, 2], "expected": 4.0, "got": "inf"}


def test_the_distribution_owning_onnxruntime_is_read_from_its_record(tmp_path) -> None:
    import os

    import onnxruntime

    from edge_ort.worker import _distribution_in, _search_distributions

    real = os.path.dirname(os.path.realpath(onnxruntime.__file__))
    assert _distribution_in(real) == _search_distributions(real) == "onnxruntime"
    site = tmp_path / "site-packages"
    (site / "onnxruntime").mkdir(parents=True)
    (site / "onnxruntime_qnn-2.7.0.dist-info").mkdir()  # ships only onnxruntime_qnn
    (site / "onnxruntime_qnn-2.7.0.dist-info" / "RECORD").write_text(
        "onnxruntime_qnn/__init__.py,sha256=x,1\n")
    (site / "onnxruntime_directml-1.20.0.dist-info").mkdir()
    (site / "onnxruntime_directml-1.20.0.dist-info" / "RECORD").write_text(
        "onnxruntime\\capi\\x.py,sha256=y,2\nonnxruntime\\__init__.py,sha256=z,3\n")
    assert _distribution_in(str(site / "onnxruntime")) == "onnxruntime-directml"


def test_spec_of_keeps_wire_names_and_refuses_an_unwired_dtype_every_time() -> None:
    x = np.zeros((2, 3), np.float32)
    assert spec_of(x) == ("float32", (2, 3))
    assert spec_of(x) == ("float32", (2, 3))  # the kept name: the same answer
    assert spec_of(np.zeros((2, 3), ">f4")) == ("float32", (2, 3))  # byte order aside
    assert spec_of(np.zeros(3, np.float64)[::2]) == ("float64", (2,))
    bad = np.zeros((2, 3), np.complex64)
    for _ in range(2):  # a refused dtype is never kept: refused again, naming the value
        with pytest.raises(InvalidValue, match="complex64"):
            spec_of(bad)
    shapes = ShapeSet.single({"x": ("float32", (2, 3))})
    with pytest.raises(BucketMismatch, match=r"inputs\.x: .*'float64\[2, 3\]'"):
        shapes.match({"x": spec_of(np.zeros((2, 3), np.float64))})


class _ZeroCopyLoop:
    """Stand-in for the worker's serve loop, as a :class:`Call` reads it: with shared memory
    in use every output counts as large (the IOBinding path) and is bound by address into
    a buffer from ``Call.output_buffer`` (a private array here: no producer); without, the
    handler runs the session plainly."""

    class boot:  # noqa: N801 - the attribute the real loop's BootConfig answers
        shm_threshold = 1

    def __init__(self, use_shm: bool = True) -> None:
        from edge_contracts.worker_transport import TensorPacker

        self.use_shm = use_shm
        self._packer = TensorPacker(None, 1)

    def tensors(self) -> tuple[Any, None]:
        return self._packer, None


def test_a_zero_copy_run_keeps_no_hold_on_its_input_mapping(
    add_relu_bundle: dict[str, Path],
) -> None:
    """An input read from a peer's mapping can be unmapped as soon as its call has ended.

    The handler keeps each session's IOBinding across calls; an input bound with
    ``bind_cpu_input`` stayed referenced by that binding after the call, so the
    controller's segment could not be unmapped (``BufferError``) until the next call.
    Each call also runs on its own input, not on one left bound by the call before.
    """
    import mmap

    from edge_contracts.headers import FrameHeader
    from edge_contracts.worker_call import Call

    ort = OrtHandler()
    ort.load(config(add_relu_bundle))
    ort.warmup({})
    header = FrameHeader("run", "r", "s0", 0, 1)

    def run(loop: _ZeroCopyLoop, x: np.ndarray) -> np.ndarray:
        outputs = ort.submit(Call(loop, header, {"x": x}, []))  # type: ignore[arg-type]
        assert outputs is not None
        return np.array(outputs["y"])

    try:
        x = np.load(add_relu_bundle["example"])["x"]
        np.testing.assert_array_equal(
            run(_ZeroCopyLoop(), x), np.load(add_relu_bundle["expected"])["y"])
        answers = set()
        for scale in (1.0, -3.0, 2.0):
            mapping = mmap.mmap(-1, x.nbytes)
            view = memoryview(mapping)
            shared = np.frombuffer(view, x.dtype, x.size).reshape(x.shape)
            shared[...] = x * scale
            shared.flags.writeable = False  # as the worker maps a controller's segment
            got = run(_ZeroCopyLoop(), shared)
            np.testing.assert_array_equal(got, run(_ZeroCopyLoop(use_shm=False), shared.copy()))
            answers.add(got.tobytes())
            del shared
            view.release()
            mapping.close()  # BufferError while anything still exports the mapping
        assert len(answers) == 3  # three inputs, three answers: none ran on a stale input
    finally:
        ort.close()
