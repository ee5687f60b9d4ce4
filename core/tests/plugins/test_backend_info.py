"""``BackendInfo.params``: the request parameters a backend's stages read."""

from __future__ import annotations

import pytest

from edge_core.backend import BackendInfo


def test_params_are_undeclared_by_default_and_kept_as_a_set_when_declared() -> None:
    assert BackendInfo(name="toy", kinds=["graph"]).params is None
    assert BackendInfo(name="toy", kinds=["graph"]).to_json()["params"] is None
    info = BackendInfo(name="toy", kinds=["graph"], params=["b", "a", "b"])
    assert info.params == frozenset({"a", "b"})
    assert info.to_json()["params"] == ["a", "b"]
    none = BackendInfo(name="toy", kinds=["graph"], params=())
    assert none.params == frozenset() and none.to_json()["params"] == []


@pytest.mark.parametrize(("value", "shown"), [
    ("delay_s", "params: expected a collection of parameter names, or None: 'delay_s'"),
    (3, "params: expected a collection of parameter names, or None: 3"),
    (["delay_s", 3], "params: a parameter name is a non-empty string: 3"),
    ([""], "params: a parameter name is a non-empty string: ''"),
])
def test_params_that_are_not_names_are_refused_naming_the_value(value: object,
                                                                shown: str) -> None:
    with pytest.raises(ValueError) as caught:
        BackendInfo(name="toy", kinds=["graph"], params=value)
    assert str(caught.value) == shown


def test_worker_preload_is_undeclared_by_default_and_listed_when_declared() -> None:
    assert BackendInfo(name="toy", kinds=["graph"]).worker_preload is None
    assert BackendInfo(name="toy", kinds=["graph"]).to_json()["worker_preload"] is None
    info = BackendInfo(name="toy", kinds=["graph"], worker_preload=["numpy"])
    assert info.worker_preload == ("numpy",) and info.to_json()["worker_preload"] == ["numpy"]
    with pytest.raises(ValueError, match="collection of strings"):
        BackendInfo(name="toy", kinds=["graph"], worker_preload="numpy")
