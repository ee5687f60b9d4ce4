import pytest

from edge_contracts.errors import InvalidValue, UnknownRequiredFeature
from edge_contracts.protocol import KNOWN_FEATURES, PROTOCOL_VERSION, negotiate


def test_protocol_version_is_one() -> None:
    assert PROTOCOL_VERSION == 1


def test_known_features_include_the_four_of_version_one() -> None:
    assert {"shm-tensors", "stream-events", "bfloat16", "cancel"} <= KNOWN_FEATURES


def test_agreed_set_is_required_plus_supported_offers() -> None:
    agreed = negotiate(["shm-tensors"], ["cancel", "someday-feature"])
    assert agreed == frozenset({"shm-tensors", "cancel"})


def test_unknown_required_feature_is_refused_naming_all_unknown() -> None:
    with pytest.raises(UnknownRequiredFeature) as info:
        negotiate(["cancel", "zeta", "alpha"])
    assert info.value.field == "features.required"
    assert info.value.value == ["alpha", "zeta"]
    assert "supported" in info.value.reason


def test_support_is_relative_to_the_given_set() -> None:
    with pytest.raises(UnknownRequiredFeature):
        negotiate(["bfloat16"], supported=frozenset({"cancel"}))
    assert negotiate([], ["bfloat16"], supported=frozenset({"cancel"})) == frozenset()


def test_malformed_feature_names_are_invalid_values() -> None:
    with pytest.raises(InvalidValue) as info:
        negotiate(["Shm Tensors"])
    assert info.value.field == "features.required"


def test_a_single_string_is_not_a_feature_collection() -> None:
    with pytest.raises(InvalidValue):
        negotiate("cancel")
