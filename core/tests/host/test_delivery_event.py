"""Delivery.event: a checked StageEvent, built without repeating the header parser's checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.request_faults import fault_of
from edge_contracts.requests import ErrorInfo, EventKind, StageEvent
from edge_contracts.validation import INT64_MAX
from edge_core.host.calls import Delivery
from edge_core.host.errors import ProtocolViolation


def delivery(**changes: Any) -> Delivery:
    fields: dict[str, Any] = {
        "request_id": "r1", "stage_id": "s0", "epoch": 1, "generation": 2, "seq": 0,
        "kind": EventKind.DONE, "data": {}, "error": None, "created_ns": 5,
        "arrays": {"y": np.zeros((2, 3), np.float32)}, "refs": [], "ack": None,
    }
    fields.update(changes)
    return Delivery(**fields)


def test_the_event_equals_the_checked_one_and_describes_the_arrays() -> None:
    event = delivery(data={"note": "ok"}).event
    assert event == StageEvent("r1", "s0", 1, 2, 0, EventKind.DONE, True, None,
                               event.outputs, {"note": "ok"}, 5)
    assert [(o.dtype.value, o.shape) for o in event.outputs] == [("float32", (2, 3))]
    assert delivery().event is not None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"seq": -1}, "event.seq"),  # from a JSON meta: not range-checked by the parser
        ({"seq": INT64_MAX + 1}, "event.seq"),
        ({"created_ns": -5}, "event.created_ns"),
        ({"data": ["not", "an", "object"]}, "event.data"),
        ({"kind": EventKind.DONE, "error": ErrorInfo("E", "m")}, "event.error"),
        ({"kind": EventKind.CANCELLED}, "event.outputs"),
        ({"stage_id": ""}, "event.stage_id"),
    ],
)
def test_what_the_header_parser_did_not_check_is_still_refused_as_the_workers_fault(
    changes: dict[str, Any], field: str
) -> None:
    """The worker sent an event the controller cannot accept: a ``ProtocolViolation``
    (the stage's fault; the ``InvalidValue`` alone declared a request fault, and edge
    serve answered it 400) naming the stage and the event's field, the check's
    ``InvalidValue`` kept as its cause."""
    with pytest.raises(ProtocolViolation) as refused:
        delivery(**changes).event  # noqa: B018 - the property builds and checks it
    stage = changes.get("stage_id", "s0")
    assert refused.value.field.startswith(f"stages[{stage}].{field}")
    assert fault_of(refused.value) is None
    cause = refused.value.__cause__
    assert isinstance(cause, InvalidValue)
    assert refused.value.field == f"stages[{stage}].{cause.field}"
    assert refused.value.reason == f"the worker sent a malformed event: {cause.reason}"
