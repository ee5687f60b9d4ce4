import dataclasses

import pytest

from edge_contracts.buffers import BufferDescriptor
from edge_contracts.errors import InvalidValue
from edge_contracts.jsonvalues import JSONObject
from edge_contracts.requests import (
    ErrorInfo,
    EventKind,
    Operation,
    StageEvent,
    StageRequest,
)

BUFFER = BufferDescriptor.for_shape("w1", 3, "uint8", (4,))


def request(**changes: object) -> StageRequest:
    fields: dict[str, object] = {
        "request_id": "r1",
        "stage_id": "det",
        "epoch": 2,
        "generation": 3,
        "operation": Operation.RUN,
    }
    fields.update(changes)
    return StageRequest(**fields)  # type: ignore[arg-type]


def event(kind: EventKind | str, **changes: object) -> StageEvent:
    fields: dict[str, object] = {
        "request_id": "r1",
        "stage_id": "det",
        "epoch": 2,
        "generation": 3,
        "seq": 0,
        "kind": kind,
        "terminal": isinstance(kind, EventKind) and kind.terminal,
    }
    fields.update(changes)
    return StageEvent(**fields)  # type: ignore[arg-type]


def test_request_round_trips_with_inputs_params_and_deadline() -> None:
    original = request(inputs=(BUFFER,), params={"k": [1, {"x": None}]}, deadline_ns=5)
    again = StageRequest.from_dict(original.to_dict())
    assert again == original
    assert hash(again) == hash(original)
    assert isinstance(again.params, JSONObject)


def test_request_params_are_frozen_copies() -> None:
    params = {"labels": ["a"]}
    made = request(params=params)
    params["labels"].append("b")
    assert made.params["labels"] == ("a",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.epoch = 3  # type: ignore[misc]


def test_request_defaults_may_be_omitted_in_dict_form() -> None:
    made = StageRequest.from_dict(
        {"request_id": "r", "stage_id": "s", "epoch": 0, "generation": 0, "operation": "generate"}
    )
    assert made.operation is Operation.GENERATE
    assert made.inputs == ()
    assert made.deadline_ns is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"request_id": ""}, "request.request_id"),
        ({"request_id": "x" * 129}, "request.request_id"),
        ({"stage_id": "a\nb"}, "request.stage_id"),
        ({"epoch": -1}, "request.epoch"),
        ({"generation": 1.0}, "request.generation"),
        ({"operation": "train"}, "request.operation"),
        ({"params": {"x": float("nan")}}, "request.params.x"),
        ({"params": ["not", "an", "object"]}, "request.params"),
        ({"deadline_ns": -1}, "request.deadline_ns"),
        ({"inputs": ({"owner": "w"},)}, "request.inputs[0]"),
    ],
)
def test_invalid_request_fields_are_named(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidValue) as info:
        request(**change)
    assert info.value.field == field


def test_a_bad_input_names_its_index_from_dict_form() -> None:
    data = request(inputs=(BUFFER, BUFFER)).to_dict()
    data["inputs"][1]["nbytes"] = 5
    with pytest.raises(InvalidValue) as info:
        StageRequest.from_dict(data)
    assert info.value.field == "request.inputs[1].nbytes"


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_kind_round_trips_with_consistent_terminal_flag(kind: EventKind) -> None:
    extra: dict[str, object] = {}
    if kind is EventKind.ERROR:
        extra["error"] = ErrorInfo("RuntimeError", "boom")
    made = event(kind, **extra)
    assert made.terminal is (kind in {EventKind.DONE, EventKind.ERROR, EventKind.CANCELLED})
    assert StageEvent.from_dict(made.to_dict()) == made


@pytest.mark.parametrize("kind", [EventKind.DONE, EventKind.ERROR, EventKind.CANCELLED])
def test_terminal_kinds_must_say_terminal(kind: EventKind) -> None:
    with pytest.raises(InvalidValue) as info:
        event(kind, terminal=False, error=ErrorInfo("E", "m") if kind is EventKind.ERROR else None)
    assert info.value.field == "event.terminal"


@pytest.mark.parametrize("kind", [EventKind.OUTPUT, EventKind.TOKEN, EventKind.PROGRESS])
def test_non_terminal_kinds_must_not_say_terminal(kind: EventKind) -> None:
    with pytest.raises(InvalidValue) as info:
        event(kind, terminal=True)
    assert info.value.field == "event.terminal"


def test_error_info_is_present_exactly_on_error_events() -> None:
    with pytest.raises(InvalidValue) as info:
        event(EventKind.ERROR)
    assert info.value.field == "event.error"
    with pytest.raises(InvalidValue) as info:
        event(EventKind.DONE, error=ErrorInfo("E", "m"))
    assert info.value.field == "event.error"


@pytest.mark.parametrize("kind", [EventKind.ERROR, EventKind.CANCELLED])
def test_failed_or_cancelled_work_carries_no_outputs(kind: EventKind) -> None:
    error = ErrorInfo("E", "m") if kind is EventKind.ERROR else None
    with pytest.raises(InvalidValue) as info:
        event(kind, error=error, outputs=(BUFFER,))
    assert info.value.field == "event.outputs"


def test_output_and_done_events_may_carry_outputs() -> None:
    assert event(EventKind.OUTPUT, outputs=(BUFFER,)).outputs == (BUFFER,)
    assert event(EventKind.DONE, outputs=[BUFFER]).outputs == (BUFFER,)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seq": -1}, "event.seq"),
        ({"kind": "finished", "terminal": False}, "event.kind"),
        ({"created_ns": -1}, "event.created_ns"),
        ({"data": {"t": {1, 2}}}, "event.data.t"),
        ({"epoch": True}, "event.epoch"),
    ],
)
def test_invalid_event_fields_are_named(change: dict[str, object], field: str) -> None:
    fields = {"kind": EventKind.TOKEN, **change}
    with pytest.raises(InvalidValue) as info:
        event(**fields)  # type: ignore[arg-type]
    assert info.value.field == field


def test_error_info_limits_and_nested_field_names() -> None:
    assert ErrorInfo("E", "").message == ""
    with pytest.raises(InvalidValue) as info:
        ErrorInfo("", "m")
    assert info.value.field == "error.type"
    with pytest.raises(InvalidValue) as info:
        ErrorInfo("E", "m" * 8193)
    assert info.value.field == "error.message"
    data = event(EventKind.ERROR, error=ErrorInfo("E", "m")).to_dict()
    data["error"]["type"] = ""
    with pytest.raises(InvalidValue) as info:
        StageEvent.from_dict(data)
    assert info.value.field == "event.error.type"
