"""An error's field, reason and value travel as data with it, exactly or not at all."""

from __future__ import annotations

import json

import pytest

from edge_contracts.error_details import MAX_DETAIL_TEXT, ErrorDetail, detail_of
from edge_contracts.errors import InvalidValue
from edge_contracts.requests import ErrorInfo
from edge_contracts.worker_errors import error_info


class Named(ValueError):
    """An error keeping its three parts, as every edge error does."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field, self.value, self.reason = field, value, reason
        super().__init__("worded in any way at all")


def test_error_info_sends_an_error_s_fields_and_error_info_reads_them_back() -> None:
    try:
        raise InvalidValue("/bundle/a: b.npz", "9f" * 32, "differs; sha256 now")
    except InvalidValue as exc:
        sent = error_info(exc)
    assert sent["detail"] == {"field": "/bundle/a: b.npz", "reason": "differs; sha256 now",
                              "value": "9f" * 32}
    info = ErrorInfo.from_dict(json.loads(json.dumps(sent)))
    assert info.detail == ErrorDetail("/bundle/a: b.npz", "differs; sha256 now", "9f" * 32)
    assert ErrorInfo.from_dict(info.to_dict()) == info
    assert "detail" not in error_info(ValueError("no fields"))
    assert ErrorInfo.from_dict({"type": "X", "message": ""}).detail is None


@pytest.mark.parametrize("value", [None, True, 0, -3, 2.5, "", "x" * MAX_DETAIL_TEXT])
def test_every_json_scalar_value_is_carried_as_it_is(value: object) -> None:
    detail = detail_of(Named("field", value, "why"))
    assert detail is not None and detail.value == value and type(detail.value) is type(value)


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("f", [1, 2], "a list"),
    ("f", {"a": 1}, "a mapping"),
    ("f", float("nan"), "not finite"),
    ("f", b"raw", "bytes"),
    ("f", "x" * (MAX_DETAIL_TEXT + 1), "a value too long"),
    ("", 1, "an empty field"),
    ("f" * (MAX_DETAIL_TEXT + 1), 1, "a field too long"),
    ("f", 1, "r" * (MAX_DETAIL_TEXT + 1)),
    (7, 1, "a field that is no string"),
])
def test_fields_that_do_not_fit_exactly_are_not_sent_never_cut_or_rendered(
        field: object, value: object, reason: str) -> None:
    error = Named(field, value, reason)  # type: ignore[arg-type]
    assert detail_of(error) is None
    assert "detail" not in error_info(error)


@pytest.mark.parametrize(("detail", "field"), [
    ({"field": "", "reason": "r", "value": 1}, "event.error.detail.field"),
    ({"field": "f", "reason": 3, "value": 1}, "event.error.detail.reason"),
    ({"field": "f", "reason": "r", "value": [1]}, "event.error.detail.value"),
    ({"field": "f", "reason": "r"}, "event.error.detail.value"),
    ({"field": "f", "reason": "r", "value": 1, "more": 2}, "event.error.detail.more"),
    ("f: r: 1", "event.error.detail"),
])
def test_a_malformed_detail_is_refused_naming_its_field(detail: object, field: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        ErrorInfo.from_dict({"type": "X", "message": "m", "detail": detail}, "event.error")
    assert caught.value.field == field
