"""check_request_size: the one-tensor shortcut and the general sum refuse the same requests."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_core.runtime.admission import RequestTooLarge, check_request_size, request_bytes

LIMIT = 1024


@pytest.mark.parametrize(
    "inputs",
    [
        {"x": np.zeros(LIMIT, np.uint8)},  # exactly at the limit
        {"x": np.zeros(0, np.float32)},
        {"x": b"\0" * LIMIT},  # no nbytes: the general sum
        {"x": np.zeros(LIMIT // 2, np.uint8), "y": memoryview(b"\0" * (LIMIT // 2))},
        {"x": "not a tensor"},  # not counted, as request_bytes counts it
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
    ],
)
def test_a_request_over_the_limit_is_refused_naming_its_bytes(inputs: dict[str, Any]) -> None:
    total = request_bytes(inputs)
    assert total > LIMIT
    with pytest.raises(RequestTooLarge,
                       match=rf"stages\[s\]\.max_io_bytes: a request of {total} bytes "
                             rf"exceeds the limit: {LIMIT}"):
        check_request_size("s", inputs, LIMIT)
