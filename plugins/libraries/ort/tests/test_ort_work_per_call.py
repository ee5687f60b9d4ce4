"""Python work per tiny call in the ONNX Runtime handler: counted bounds.

The handler's per-request function (:meth:`OrtHandler.submit`: the served-shape match,
the session, the zero-copy decision, the run and the output mapping) is counted on a real
handler with a real onnxruntime session, after a warm-up: Python function calls with
``sys.setprofile`` (onnxruntime's own Python wrapper around the run included) and
bytecode instructions with ``sys.settrace``'s opcode events. Counts, not timings: the
same on a loaded machine as on a quiet one. The serve loop around the handler is counted
in core (``core/tests/host/test_worker_work_per_call.py``). Each bound sits a little
above what the handler costs now; raise one only for work a request needs.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_contracts.headers import FrameHeader
from edge_contracts.worker_call import Call
from edge_core.testing.work_counts import bytecodes, python_calls
from edge_ort.bundles import write_add_relu_bundle
from edge_ort.worker import OrtHandler

REQUESTS = 200
#: 13 before the per-call trims (a comprehension, _spec's dtype_of, ServedShapes.match's
#: wrapper and _session_for and _run each a call); 8 after, of which 4 were onnxruntime's
#: own ``Session.run`` and its three validations; 4 since the run is the compiled
#: session's own (``edge_ort.worker._call_run``): submit, spec_of, match, zero_copy_bytes;
#: 2 since a lone input with the last accepted name, dtype and shape is accepted again
#: without spec_of and the match (``edge_ort.bucket.LoneAccepted``).
MAX_HANDLER_CALLS = 3
#: Bytecode counts depend on the interpreter's compiler, so the bound is kept per minor
#: version measured: on 3.11, 284 before the trims (onnxruntime 1.32's wrapper included);
#: 235 after; 160 without onnxruntime's wrapper; 135 with the lone input's accepted
#: shape reused (and the outputs paired without zip's strict keyword); 135 -> 134 in
#: session 33 with a lone output's dict made as a display (no dict() and zip() calls).
MAX_HANDLER_BYTECODES = {(3, 11): 144}


class _ServeLoopStandIn:
    """Stand-in for the worker's serve loop, as a :class:`Call` reads it on this path.

    The tiny call answers by returning its outputs (the loop packs them), so the only
    things the handler reads of the loop are the zero-copy threshold and whether shared
    memory is in use; the real loop is counted in core.
    """

    class boot:  # noqa: N801 - the attribute the real loop's BootConfig answers
        shm_threshold = 1 << 16

    use_shm = True


@pytest.fixture(scope="module")
def handler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OrtHandler, Any, Any]]:
    bundle = write_add_relu_bundle(tmp_path_factory.mktemp("work") / "add_relu")
    ort = OrtHandler()
    ort.load({"graph": str(bundle / "model.onnx"), "target": "CPUExecutionProvider",
              "providers": [["CPUExecutionProvider", {}]],
              "example_inputs": str(bundle / "example_inputs.npz"),
              "expected_outputs": str(bundle / "expected.npz"), "intra_op_threads": 1})
    ort.warmup({})
    x = np.load(Path(bundle / "example_inputs.npz"))["x"]
    expected = np.load(Path(bundle / "expected.npz"))["y"]
    yield ort, x, expected
    ort.close()


def _submits(ort: OrtHandler, x: Any) -> Iterator[Callable[[], object]]:
    """After 30 unmeasured calls, ``REQUESTS`` steps: each the handler's submit of a call made
    before the count starts."""
    header = FrameHeader("request", "r", "s0", 0, 1)
    for _ in range(30):
        ort.submit(Call(_ServeLoopStandIn(), header, {"x": x}, []))  # type: ignore[arg-type]
    for _ in range(REQUESTS):
        call = Call(_ServeLoopStandIn(), header, {"x": x}, [])  # type: ignore[arg-type]
        yield partial(ort.submit, call)


def test_a_tiny_call_costs_the_ort_handler_a_bounded_number_of_python_calls(
    handler: tuple[OrtHandler, Any, Any],
) -> None:
    ort, x, expected = handler
    count = python_calls(_submits(ort, x))
    header = FrameHeader("request", "r", "s0", 0, 1)
    outputs = ort.submit(Call(_ServeLoopStandIn(), header, {"x": x}, []))  # type: ignore[arg-type]
    assert outputs is not None
    np.testing.assert_array_equal(outputs["y"], expected)
    assert count.per_call <= MAX_HANDLER_CALLS, count


def test_a_tiny_call_runs_a_bounded_number_of_bytecodes_in_the_ort_handler(
    handler: tuple[OrtHandler, Any, Any],
) -> None:
    bound = MAX_HANDLER_BYTECODES.get(sys.version_info[:2])
    if bound is None:
        pytest.skip(f"no bytecode bound measured on Python {sys.version_info[:2]}")
    ort, x, _ = handler
    count = bytecodes(_submits(ort, x))
    assert count.per_call <= bound, count


def test_a_tiny_call_gives_the_run_an_options_object_never_none(
    handler: tuple[OrtHandler, Any, Any],
) -> None:
    """The run's options are ONNX Runtime's ``RunOptions``, never ``None``.

    pybind11 converts a ``None`` given for the compiled run's options only after looking
    for a foreign module's converter on ``NoneType``: a failed attribute lookup that
    formats and clears an ``AttributeError`` in C on every call (about 2,000 of the
    worker's instructions a call, by callgrind; nothing Python's own counters see). An
    empty ``RunOptions`` is ONNX Runtime's defaults, matched at once by its exact type.
    """
    import onnxruntime

    ort, x, expected = handler
    real = ort._session_run
    given: list[object] = []

    def recording(names: Any, feed: Any, options: Any) -> Any:
        given.append(options)
        return real(names, feed, options)

    ort._session_run = recording
    try:
        header = FrameHeader("request", "r", "s0", 0, 1)
        for _ in range(3):
            outputs = ort.submit(Call(_ServeLoopStandIn(), header, {"x": x}, []))  # type: ignore[arg-type]
            assert outputs is not None
            np.testing.assert_array_equal(outputs["y"], expected)
    finally:
        ort._session_run = real
    assert len(given) == 3
    assert all(type(options) is onnxruntime.RunOptions for options in given), given


class _InPlaceLoopStandIn(_ServeLoopStandIn):
    """The serve loop as an in-place call reads it: every output large enough for a buffer.

    Its packer hands out private arrays (no lease), where the real loop's hands out views
    of the worker's segments; the handler binds either the same way (``IOBinding``).
    """

    class boot:  # noqa: N801 - the attribute the real loop's BootConfig answers
        shm_threshold = 1

    class _Packer:
        @staticmethod
        def allocate(shape: tuple[int, ...], dtype: Any, private: bool = False) -> tuple[Any, None]:
            return np.empty(shape, dtype), None

    def tensors(self) -> tuple[Any, None]:
        return self._Packer(), None


def test_an_in_place_call_raises_no_exception_on_its_way(
    handler: tuple[OrtHandler, Any, Any],
) -> None:
    """A call whose outputs ONNX Runtime writes in place raises and catches no exception.

    onnxruntime 1.32's ``run_with_iobinding`` reads the run's ``gpu_graph_id`` config
    entry on every call; unset, the compiled lookup throws a C++ exception that its
    wrapper catches as ``RuntimeError`` (about 38 µs a call here): the worker's run
    options set the entry to the default it stands for. Python's tracer sees such an
    exception as an ``exception`` event in the frame that catches it.
    """
    ort, x, expected = handler
    header = FrameHeader("request", "r", "s0", 0, 1)

    def call() -> Any:
        return ort.submit(Call(_InPlaceLoopStandIn(), header, {"x": x}, []))  # type: ignore[arg-type]

    call()
    raised: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "exception":
            raised.append(f"{frame.f_code.co_qualname}: {arg[0].__name__}")
        return tracer

    collecting = gc.isenabled()
    gc.disable()  # (a collection's finalizers of earlier garbage would raise their own)
    sys.settrace(tracer)
    try:
        outputs = call()
    finally:
        sys.settrace(None)
        if collecting:
            gc.enable()
    assert outputs is not None
    np.testing.assert_array_equal(outputs["y"], expected)
    assert ort._bindings, "the call did not take the in-place path"
    assert raised == []
    # what keeps it so on the onnxruntime this runs (1.32 reads the entry every call)
    assert ort._run_options.get_run_config_entry("gpu_graph_id") == "0"
