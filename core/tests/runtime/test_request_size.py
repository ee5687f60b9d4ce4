"""check_request_size: the one-tensor shortcut and the general sum refuse the same requests."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_core.runtime.admission import RequestTooLarge, check_request_size, request_bytes

LIMIT = 1024


class _Sized:
    """A value whose ``nbytes`` is an int of a subclass (the shortcut takes ints exactly)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = _Bytes(nbytes)


class _Bytes(int):
    """An ``int`` subclass."""


@pytest.mark.parametrize(
    "inputs",
    [
        {"x": np.zeros(LIMIT, np.uint8)},  # exactly at the limit
        {"x": np.zeros(0, np.float32)},
        {"x": b"\0" * LIMIT},  # no nbytes: the general sum
        {"x": np.zeros(LIMIT // 2, np.uint8), "y": memoryview(b"\0" * (LIMIT // 2))},
        {"x": "not a tensor"},  # not counted, as request_bytes counts it
        {"x": _Sized(LIMIT)},  # an int subclass: the general sum
    ],
)
def test_a_request_within_the_limit_passes(inputs: dict[str, Any]) -> None:
    assert request_bytes(inputs) <= LIMIT
    check_request_size("s", inputs, LIMIT)


@pytest.mark.parametrize(
    "inputs",
    [
        {"x": np.zeros(LIMIT + 1, np.uint8)},  # one byte over, one tensor
        {"x": bytearray(LIMIT + 1)},  # one tensor without nbytes
        {"x": np.zeros(LIMIT, np.uint8), "y": np.zeros(1, np.uint8)},  # over by the sum
        {"x": _Sized(LIMIT + 1)},  # an int subclass: the general sum
    ],
)
def test_a_request_over_the_limit_is_refused_naming_its_bytes(inputs: dict[str, Any]) -> None:
    total = request_bytes(inputs)
    assert total > LIMIT
    with pytest.raises(RequestTooLarge,
                       match=rf"stages\[s\]\.max_io_bytes: a request of {total} bytes "
                             rf"exceeds the limit: {LIMIT}"):
        check_request_size("s", inputs, LIMIT)


@pytest.mark.parametrize("inputs", [None, "x", "xy", [("x", np.zeros(1))], 3])
def test_inputs_that_are_no_mapping_are_refused_naming_inputs_and_their_type(
    inputs: Any,
) -> None:
    with pytest.raises(InvalidValue) as info:
        check_request_size("s", inputs, LIMIT)
    assert info.value.field == "inputs"
    assert info.value.value is inputs
    assert f"arrays, not {type(inputs).__name__}: " in str(info.value)


def test_a_value_that_fails_to_be_read_in_good_inputs_raises_its_own_error() -> None:
    class Broken:
        @property
        def nbytes(self) -> int:
            raise TypeError("broken nbytes")

    with pytest.raises(TypeError, match="broken nbytes"):  # not the inputs' fault
        check_request_size("s", {"x": Broken()}, LIMIT)
