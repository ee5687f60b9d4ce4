"""A stage after the first that refuses the inputs its transform built: the pipeline's fault.

Real echo stages in real worker processes. The request is well formed (its input passes
the first stage); the pipeline's own transform builds the next stage's inputs, and that
stage refuses them as it refuses a client's malformed input: before sending (an array no
stage can be sent, ``InvalidValue``), or in its worker (a bool tensor holding a byte other
than 0 and 1, ``BoolInputInvalid`` declared a request fault, arriving as ``RequestFailed``
with ``request_fault``). That was passed on as it came, so ``edge serve`` answered 400 and
``edge run`` exited 2 for it as for the client's own fault. It is
``TransformOutputRefused`` now, naming the refusing stage, the transform and the refusal,
wherever the refusing stage sits (in the middle of the chain, last, behind a fan-out) and
however the request is run. The first stage's refusal of the request's own input, and the
last stage's refusal of a parameter the caller sent, stay the request's fault, unchanged.
Nothing is held afterwards and the same workers serve on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.request_faults import RequestFault
from edge_core.fanout import Call, Fanout
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline, RequestFailed, TransformOutputRefused

from .conftest import OpenPipeline, echo_stage

X = {"x": np.ones((2, 2), np.float32)}
TRANSFORM = "transform edge_echo.transforms:returns_carried"


def _bad_bools() -> np.ndarray:
    return np.array([0, 1, 7], np.uint8).view(bool)


#: What the transform builds, the refusal's type and message (as the stage gave it), and
#: the field it names.
BUILT: list[tuple[Callable[[dict[str, Any]], object], str, str, str]] = [
    (lambda previous: {"x": np.array(previous["x"], dtype=object)}, "InvalidValue",
     "inputs.x.dtype: unsupported dtype (wire dtypes: bool, int8, int16, int32, int64, "
     "uint8, uint16, uint32, uint64, float16, float32, float64, bfloat16): 'object'",
     "inputs.x.dtype"),
    (lambda previous: {"x": _bad_bools()}, "BoolInputInvalid",
     "inputs.x: a bool tensor's bytes must each be 0 or 1 (the largest is shown): 7",
     "inputs.x"),
    (lambda previous: Fanout([{"x": previous["x"]}, {"x": _bad_bools()}]),
     "BoolInputInvalid",
     "inputs.x: a bool tensor's bytes must each be 0 or 1 (the largest is shown): 7",
     "inputs.x"),
    (lambda previous: Call({"x": previous["x"]}, params={"refuse": "the transform's"}),
     "ParamRefused", "params.refuse: refused as the request asked: \"the transform's\"",
     "refuse"),
]


def _calls(pipeline: Pipeline) -> list[Callable[..., object]]:
    """Each way to run a request: run, submit, stream (its first event or its end), arun."""
    async def on_a_loop(inputs: dict[str, Any], params: Any) -> object:
        return await pipeline.arun(inputs, params=params)

    return [
        lambda inputs, params=None: pipeline.run(inputs, params=params),
        lambda inputs, params=None: pipeline.submit(inputs, params=params).result(5.0),
        lambda inputs, params=None: list(pipeline.stream(inputs, params=params)),
        lambda inputs, params=None: asyncio.run(on_a_loop(inputs, params)),
    ]


@pytest.mark.parametrize("shape", ["last", "middle"])
def test_a_later_stage_refusing_what_its_transform_built_is_the_pipelines_fault(
    shape: str, open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """Stage ``b`` (last of two, or between ``a`` and ``c``) refuses the inputs its
    transform built, before sending or in its worker, an item of a fan-out included, or a
    parameter the transform asked for: each fails the request with
    ``TransformOutputRefused`` (no ``ValueError``) naming ``b``'s ``input_transform``, the
    stage, the transform, the refusal's type, message and field, the original kept as
    ``__cause__``; nothing is held, the same workers serve on."""
    stages = [echo_stage("a", backend="echo-preemptible"),
              echo_stage("b", transform="edge_echo.transforms:returns_carried",
                         backend="echo-preemptible")]
    if shape == "middle":
        stages.append(echo_stage("c", transform="edge_echo.transforms:passthrough",
                                 backend="echo-preemptible"))
    pipeline = open_pipeline(*stages, admission=2)
    workers = [(stage.generation, stage.state) for stage in pipeline.stages]
    held = ledger.holdings()

    def clean() -> None:
        assert pipeline.admission.used == 0
        assert [(s.outstanding, s.slots.used) for s in pipeline.stages] == \
            [(0, 0)] * len(stages)

    for built, kind, message, field in BUILT:
        for call in _calls(pipeline):
            with pytest.raises(TransformOutputRefused) as info:
                call({**X, "carry:returns": built})
            refused = info.value
            assert not isinstance(refused, ValueError)  # no 400, no exit 2
            assert (refused.path, refused.stage_id, refused.transform, refused.field) == (
                "pipelines[t].stages[b].input_transform", "b", TRANSFORM, field)
            assert refused.reason == f"stage 'b' refused the inputs {TRANSFORM} returned ({kind})"
            assert str(refused) == f"{refused.path}: {refused.reason}: {message}"
            assert refused.error is refused.__cause__
            cause = refused.error
            assert (cause.error_type if isinstance(cause, RequestFailed)
                    else type(cause).__name__) == kind
            clean()
    assert ledger.holdings() == held
    assert [(stage.generation, stage.state) for stage in pipeline.stages] == workers
    with pipeline.run({**X, "carry:returns": dict}) as result:  # the same workers serve on
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2 ** len(stages))
    clean()


def test_the_requests_own_input_and_the_callers_parameters_stay_the_requests_fault(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """The first stage refusing the request's own input (a bool tensor holding 7, an array
    of objects) and the last stage refusing a parameter the caller sent (``refuse``, with
    the transform between) are the request's fault: raised as the stage raised them
    (``RequestFailed`` with its ``request_fault``, ``InvalidValue``), never
    ``TransformOutputRefused``."""
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"),
                             echo_stage("b", transform="edge_echo.transforms:passthrough",
                                        backend="echo-preemptible"),
                             echo_stage("c", transform="edge_echo.transforms:passthrough",
                                        backend="echo-preemptible"), admission=2)
    held = ledger.holdings()
    for call in _calls(pipeline):
        with pytest.raises(RequestFailed) as own:
            call({"x": _bad_bools()})
        assert own.value.request_fault == RequestFault("invalid_value", "inputs.x")
        with pytest.raises(InvalidValue, match=r"^inputs\.x\.dtype: unsupported dtype"):
            call({"x": np.array([1, 2], dtype=object)})
        with pytest.raises(RequestFailed) as sent:
            call(X, {"refuse": "the caller's"})
        assert sent.value.request_fault == RequestFault("invalid_value", "refuse")
        assert sent.value.error_type == "ParamRefused"
    assert pipeline.admission.used == 0
    assert [(s.outstanding, s.slots.used) for s in pipeline.stages] == [(0, 0)] * 3
    assert ledger.holdings() == held


def test_whose_parameter_the_last_stage_refused_follows_who_wrote_the_value_it_got(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """The last stage gets the caller's parameters with what its transform's ``Call``
    asked merged over them. A refusal naming ``refuse`` when both sent it was passed on
    unchanged (the caller blamed for the value the transform wrote over its own): it is
    ``TransformOutputRefused`` now. A declared refusal naming no field
    (``refuse_unnamed``) was always ``TransformOutputRefused``, the caller's own
    ``refuse_unnamed`` included: it stays the request's own (``RequestFailed`` with its
    fault, no field) when any parameter of the caller's reached the stage as it sent it,
    and is the transform's when none did (the caller sent none, or the transform wrote
    over each)."""
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"),
                             echo_stage("b", transform="edge_echo.transforms:returns_carried",
                                        backend="echo-preemptible"), admission=2)
    held = ledger.holdings()

    def asking(**params: str) -> dict[str, Any]:
        return {**X, "carry:returns": lambda previous: Call({"x": previous["x"]}, params=params)}

    transforms = [  # (the inputs, the caller's params, whose fault: the transform's?)
        (asking(refuse="the transform's"), {"refuse": "the caller's"}, True),
        (asking(refuse_unnamed="the transform's"), None, True),
        (asking(refuse_unnamed="the transform's"), {"refuse_unnamed": "the caller's"}, True),
        ({**X, "carry:returns": dict}, {"refuse_unnamed": "the caller's"}, False),
        (asking(refuse_unnamed="the transform's"), {"delay_s": 0}, False),
    ]
    for call in _calls(pipeline):
        for inputs, params, transforms_fault in transforms:
            if transforms_fault:
                with pytest.raises(TransformOutputRefused) as info:
                    call(inputs, params)
                cause = info.value.error
                assert isinstance(cause, RequestFailed)
                assert "the transform's" in cause.error_message
            else:
                with pytest.raises(RequestFailed) as own:
                    call(inputs, params)
                assert own.value.request_fault == RequestFault("invalid_value", None)
                assert own.value.error_type == "RequestRefused"
    assert pipeline.admission.used == 0
    assert [(s.outstanding, s.slots.used) for s in pipeline.stages] == [(0, 0)] * 2
    assert ledger.holdings() == held
