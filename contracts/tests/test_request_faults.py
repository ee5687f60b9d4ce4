"""A request's own faults: declared on error types, carried by ErrorInfo, read back strictly."""

from __future__ import annotations

import pytest

from edge_contracts.errors import BoolBytesInvalid, DescriptorInvalid, InvalidValue
from edge_contracts.request_faults import MAX_PARAM_LENGTH, RequestFault, fault_of
from edge_contracts.requests import ErrorInfo
from edge_contracts.worker_errors import error_info, input_fault


class TooLong(ValueError):
    request_fault = "context_length_exceeded"

    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(f"{field}: too long")


class WithParam(Exception):
    request_fault = "invalid_value"
    param = "temperature"
    field = "ignored when param is set"


class BadCode(ValueError):
    request_fault = "Not A Word"


def test_a_type_declares_its_code_and_the_field_names_the_param() -> None:
    assert fault_of(TooLong("messages")) == RequestFault("context_length_exceeded", "messages")
    assert fault_of(WithParam()) == RequestFault("invalid_value", "temperature")
    declared = RequestFault("invalid_value", "n")
    carried = RuntimeError("from a worker")
    carried.request_fault = declared  # type: ignore[attr-defined]
    assert fault_of(carried) is declared


def test_an_undeclared_or_malformed_declaration_is_no_fault() -> None:
    assert fault_of(ValueError("plain")) is None
    assert fault_of(BadCode("x")) is None
    no_field = TooLong("x")
    no_field.field = 12  # type: ignore[assignment]
    assert fault_of(no_field) == RequestFault("context_length_exceeded", None)
    assert fault_of(TooLong("p" * 1000)) == RequestFault("context_length_exceeded",
                                                         "p" * MAX_PARAM_LENGTH)


def test_error_info_sends_the_declaration_and_error_info_reads_it_back() -> None:
    try:
        raise TooLong("max_tokens")
    except TooLong as exc:
        sent = error_info(exc)
    assert sent["fault"] == {"code": "context_length_exceeded", "param": "max_tokens"}
    assert "traceback" in sent and sent["type"] == "TooLong"
    info = ErrorInfo.from_dict(sent)
    assert info.fault == RequestFault("context_length_exceeded", "max_tokens")
    assert ErrorInfo.from_dict(info.to_dict()) == info
    assert "fault" not in error_info(ValueError("plain"))
    assert ErrorInfo.from_dict({"type": "X", "message": ""}).fault is None


@pytest.mark.parametrize(("fault", "field"), [
    ({"code": "Bad Code"}, "event.error.fault.code"),
    ({"code": "ok", "param": ""}, "event.error.fault.param"),
    ({"code": "ok", "param": 3}, "event.error.fault.param"),
    ({"param": "x"}, "event.error.fault.code"),
    ({"code": "ok", "extra": 1}, "event.error.fault.extra"),
    ("invalid_value", "event.error.fault"),
])
def test_a_malformed_fault_is_refused_naming_its_field(fault: object, field: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        ErrorInfo.from_dict({"type": "X", "message": "m", "fault": fault}, "event.error")
    assert caught.value.field == field


def test_a_bool_input_s_stray_bytes_are_reported_as_the_request_s_fault_naming_the_input(
) -> None:
    """Only on the worker's failure path for a request's inputs: any other error reading
    them (a frame the worker cannot read) is reported as raised, as no fault."""
    stray = BoolBytesInvalid("tensors.mask.v2", 7, "bool payload holds bytes other than 0 "
                             "and 1 (the largest is shown)")
    reported = input_fault(stray)
    assert str(reported) == ("inputs.mask.v2: a bool tensor's bytes must each be 0 or 1 "
                             "(the largest is shown): 7")
    info = error_info(reported)
    assert (info["type"], info["fault"]) == ("BoolInputInvalid",
                                             {"code": "invalid_value", "param": "inputs.mask.v2"})
    assert "traceback" not in info
    framing = DescriptorInvalid("tensors.x.ref", None, "shared memory is not in use")
    assert input_fault(framing) is framing and fault_of(framing) is None
    assert fault_of(stray) is None  # read anywhere else (a peer's outputs): nobody's request
