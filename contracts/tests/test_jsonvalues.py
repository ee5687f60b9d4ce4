import math

import pytest

from edge_contracts.errors import HeaderMalformed, InvalidValue
from edge_contracts.jsonvalues import (
    EMPTY_OBJECT,
    MAX_JSON_DEPTH,
    JSONObject,
    freeze_json,
    freeze_object,
    thaw_json,
)


def test_freezing_converts_lists_and_dicts_and_thawing_restores_them() -> None:
    data = {"a": [1, 2.5, "x", None, True], "b": {"c": []}}
    frozen = freeze_object(data, "params")
    assert isinstance(frozen, JSONObject)
    assert frozen["a"] == (1, 2.5, "x", None, True)
    assert isinstance(frozen["b"], JSONObject)
    assert thaw_json(frozen) == data


def test_frozen_objects_are_hashable_and_equal_to_dicts() -> None:
    one = freeze_object({"k": [1, {"z": 2}]}, "p")
    two = freeze_object({"k": [1, {"z": 2}]}, "p")
    assert hash(one) == hash(two)
    assert one == {"k": (1, {"z": 2})}
    assert freeze_object({}, "p") is EMPTY_OBJECT


def test_frozen_objects_cannot_be_changed() -> None:
    frozen = freeze_object({"k": 1}, "p")
    with pytest.raises(TypeError):
        frozen["k"] = 2  # type: ignore[index]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused(value: float) -> None:
    with pytest.raises(InvalidValue) as info:
        freeze_object({"x": [value]}, "params")
    assert info.value.field == "params.x[0]"


@pytest.mark.parametrize("value", [b"bytes", {1, 2}, object(), 1 + 2j])
def test_non_json_types_are_refused(value: object) -> None:
    with pytest.raises(InvalidValue) as info:
        freeze_json(value, "data")
    assert info.value.field == "data"


def test_integers_must_fit_in_64_signed_bits() -> None:
    assert freeze_json(-(2**63), "n") == -(2**63)
    with pytest.raises(InvalidValue):
        freeze_json(2**63, "n")


def test_non_string_keys_are_refused() -> None:
    with pytest.raises(InvalidValue):
        freeze_object({1: "x"}, "params")


def test_nesting_deeper_than_the_limit_is_refused_with_the_given_error() -> None:
    deep: object = []
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = [deep]
    with pytest.raises(HeaderMalformed):
        freeze_object({"d": deep}, "meta", error=HeaderMalformed)
    shallow: object = []
    for _ in range(MAX_JSON_DEPTH - 2):
        shallow = [shallow]
    freeze_object({"d": shallow}, "meta")


@pytest.mark.parametrize("empty", [{}, []])
def test_empty_containers_count_towards_the_nesting_limit(empty: object) -> None:
    def nested(levels: int) -> object:
        value: object = empty
        for _ in range(levels):
            value = {"k": value}
        return value

    freeze_object(nested(MAX_JSON_DEPTH - 1), "meta")  # the deepest accepted
    with pytest.raises(InvalidValue, match="nesting must be <= 32"):
        freeze_object(nested(MAX_JSON_DEPTH), "meta")


def test_frozen_object_get_and_membership_behave_like_a_dict() -> None:
    from edge_contracts.jsonvalues import freeze_object

    frozen = freeze_object({"a": 1, "n": None}, "meta")
    assert frozen.get("a") == 1 and frozen.get("n", 5) is None and frozen.get("z", 5) == 5
    assert "n" in frozen and "z" not in frozen and 1 not in frozen


def test_a_view_reads_the_items_and_cannot_change_them() -> None:
    frozen = freeze_object({"a": 1, "b": {"c": [2]}}, "meta")
    view = frozen.view()
    assert view == {"a": 1, "b": {"c": (2,)}}
    assert view["b"] is frozen["b"] and view.get("z") is None
    with pytest.raises(TypeError):
        view["a"] = 2  # type: ignore[index]
    assert frozen["a"] == 1


def test_arrays_of_leaves_in_an_array_are_checked_as_every_array() -> None:
    # (the pairs of a frame's acks: frozen inline, with every check of the general path)
    pairs = {"acks": [["seg", 3], ["t", 2**63 - 1], [None, True, -(2**63)], []]}
    assert freeze_object(pairs, "meta") == {
        "acks": (("seg", 3), ("t", 2**63 - 1), (None, True, -(2**63)), ())}
    for bad, reason in ((2**63, "64 signed bits"), (math.nan, "finite"), (b"x", "JSON-comp")):
        with pytest.raises(HeaderMalformed, match=reason) as info:
            freeze_object({"acks": [["seg", 1], ["seg", bad]]}, "meta", error=HeaderMalformed)
        assert info.value.field == "meta.acks[1][1]"
    frozen = freeze_json([["a", 1.5], ["b", {"c": [1]}]], "data")  # not all leaves: the call
    assert frozen == (("a", 1.5), ("b", {"c": (1,)}))

    def wrapped(levels: int) -> object:
        value: object = [["seg", 1]]
        for _ in range(levels):
            value = [value]
        return value

    freeze_json(wrapped(MAX_JSON_DEPTH - 2), "data")  # the pair at the deepest level
    with pytest.raises(InvalidValue, match="nesting must be <= 32"):
        freeze_json(wrapped(MAX_JSON_DEPTH - 1), "data")
