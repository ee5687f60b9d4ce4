"""prechecked_request / prechecked_event: the per-call constructors equal the checked ones.

They skip only what their callers vouch for (ids, integers, kind); whatever depends on
the value itself (params, data, error and outputs against the kind) is still checked,
and a refusal is the one the dataclass raises, naming the same field.
"""

from __future__ import annotations

from typing import Any

import pytest

from edge_contracts.buffers import BufferDescriptor
from edge_contracts.errors import InvalidValue
from edge_contracts.jsonvalues import EMPTY_OBJECT, JSONObject
from edge_contracts.requests import (
    ErrorInfo,
    EventKind,
    Operation,
    StageEvent,
    StageRequest,
    prechecked_event,
    prechecked_request,
)

BUFFER = BufferDescriptor.for_shape("w1", 3, "float32", (2, 2))
FAILED = ErrorInfo("ValueError", "bad input")


@pytest.mark.parametrize("params", [None, {}, {"temperature": 0.5, "stop": ["\n"]}])
def test_a_prechecked_request_equals_the_checked_one(params: dict[str, Any] | None) -> None:
    fast = prechecked_request("ab12-1f", "det", 2, 3, Operation.GENERATE, params)
    checked = StageRequest("ab12-1f", "det", 2, 3, Operation.GENERATE, params=params or {})
    assert fast == checked
    assert isinstance(fast.params, JSONObject)
    if not params:
        assert fast.params is EMPTY_OBJECT


def test_a_prechecked_request_still_checks_and_freezes_params() -> None:
    params = {"stop": ["a"]}
    request = prechecked_request("r1", "det", 0, 1, Operation.RUN, params)
    params["stop"].append("b")  # the request holds a frozen copy
    assert request.params["stop"] == ("a",)
    with pytest.raises(InvalidValue) as refused:
        prechecked_request("r1", "det", 0, 1, Operation.RUN, {"x": float("nan")})
    assert refused.value.field.startswith("request.params")


VALID_EVENTS = [
    (EventKind.DONE, None, (BUFFER,), {}),
    (EventKind.OUTPUT, None, (BUFFER, BUFFER), {"note": "partial"}),
    (EventKind.TOKEN, None, (), JSONObject({"text": "hi"})),
    (EventKind.ERROR, FAILED, (), {}),
    (EventKind.CANCELLED, None, (), {}),
]


@pytest.mark.parametrize(("kind", "error", "outputs", "data"), VALID_EVENTS)
def test_a_prechecked_event_equals_the_checked_one(
    kind: EventKind, error: ErrorInfo | None, outputs: tuple[BufferDescriptor, ...],
    data: Any,
) -> None:
    fast = prechecked_event("r1", "det", 2, 3, 7, kind, error, outputs, data, 123)
    checked = StageEvent("r1", "det", 2, 3, 7, kind, kind.terminal, error, outputs, data, 123)
    assert fast == checked
    assert fast.terminal is kind.terminal
    assert isinstance(fast.data, JSONObject)


@pytest.mark.parametrize(
    ("kind", "error", "outputs", "data", "stage_id", "field"),
    [
        (EventKind.DONE, FAILED, (), {}, "det", "event.error"),  # an error on a DONE
        (EventKind.ERROR, None, (), {}, "det", "event.error"),  # an ERROR without one
        (EventKind.CANCELLED, None, (BUFFER,), {}, "det", "event.outputs"),
        (EventKind.ERROR, FAILED, (BUFFER,), {}, "det", "event.outputs"),
        (EventKind.DONE, None, (), {}, "", "event.stage_id"),
        (EventKind.TOKEN, None, (), "not an object", "det", "event.data"),
        (EventKind.TOKEN, None, (), {"x": float("inf")}, "det", "event.data"),
    ],
)
def test_a_prechecked_event_refuses_what_the_checked_one_refuses(
    kind: EventKind, error: ErrorInfo | None, outputs: tuple[BufferDescriptor, ...],
    data: Any, stage_id: str, field: str,
) -> None:
    with pytest.raises(InvalidValue) as checked:
        StageEvent("r1", stage_id, 2, 3, 0, kind, kind.terminal, error, outputs, data, 0)
    with pytest.raises(InvalidValue) as fast:
        prechecked_event("r1", stage_id, 2, 3, 0, kind, error, outputs, data, 0)
    assert fast.value.field.startswith(field)
    assert (fast.value.field, fast.value.reason) == (checked.value.field, checked.value.reason)
