"""Byte sizes: units, exactness, refusals, and a round trip through the formatter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_core.config.sizes import ByteSizeError, format_byte_size, parse_byte_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512 MiB", 512 * 1024**2),
        ("512MiB", 512 * 1024**2),
        ("1.5 GiB", 3 * 1024**3 // 2),
        ("64 MB", 64_000_000),
        ("2 kB", 2000),
        ("3 KiB", 3072),
        ("1 TiB", 1024**4),
        ("7", 7),
        ("7 B", 7),
        ("  10 gib ", 10 * 1024**3),
        (0, 0),
        (123, 123),
    ],
)
def test_sizes_in_every_unit_parse_exactly(text: object, expected: int) -> None:
    assert parse_byte_size(text) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("0.1 GiB", "not a whole number of bytes"),
        ("1.5 B", "not a whole number of bytes"),
        ("12 XB", "unknown unit"),
        ("lots", "expected '<number> <unit>'"),
        ("-1 MiB", "expected '<number> <unit>'"),
        (-5, "must not be negative"),
        (True, "expected an integer or a string"),
        (1.5, "expected an integer or a string"),
        (None, "expected an integer or a string"),
    ],
)
def test_malformed_sizes_are_refused_with_reason_and_value(value: object, reason: str) -> None:
    with pytest.raises(ByteSizeError) as info:
        parse_byte_size(value)
    assert reason in info.value.reason
    assert info.value.value == value
    assert repr(value) in str(info.value)


@given(st.integers(min_value=0, max_value=2**62))
def test_formatted_sizes_parse_back_to_the_same_number(nbytes: int) -> None:
    assert parse_byte_size(format_byte_size(nbytes)) == nbytes


def test_format_uses_the_largest_exact_binary_unit() -> None:
    assert format_byte_size(512 * 1024**2) == "512 MiB"
    assert format_byte_size(1536) == "1536 B"
    assert format_byte_size(3072) == "3 KiB"
    assert format_byte_size(1000) == "1000 B"
    assert format_byte_size(0) == "0 B"
