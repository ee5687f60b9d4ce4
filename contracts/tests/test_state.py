import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.state import StateHandle

CURRENT = StateHandle(
    session="chat-7",
    backend="vllm-cuda",
    artifact="tinyllama@3f2a",
    layout="kv-v1",
    epoch=2,
    instance="w-9",
    generation=5,
)


def test_handles_default_to_non_replayable_and_non_migratable() -> None:
    assert CURRENT.replayable is False
    assert CURRENT.migratable is False


def test_a_handle_accepts_the_identical_state() -> None:
    assert CURRENT.accepts(StateHandle.from_dict(CURRENT.to_dict()))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("session", "chat-8"),
        ("backend", "ort-cpu"),
        ("artifact", "tinyllama@0000"),
        ("layout", "kv-v2"),
        ("epoch", 3),
        ("instance", "w-10"),
        ("generation", 4),
    ],
)
def test_a_stale_handle_is_refused_when_any_identity_field_differs(
    field: str, value: object
) -> None:
    stale = StateHandle.from_dict({**CURRENT.to_dict(), field: value})
    assert not stale.accepts(CURRENT)
    assert not CURRENT.accepts(stale)


def test_flags_do_not_change_acceptance() -> None:
    flagged = StateHandle.from_dict({**CURRENT.to_dict(), "replayable": True, "migratable": True})
    assert flagged.accepts(CURRENT)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"epoch": -1}, "state.epoch"),
        ({"generation": True}, "state.generation"),
        ({"session": ""}, "state.session"),
        ({"replayable": "no"}, "state.replayable"),
    ],
)
def test_invalid_handles_are_refused(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidValue) as info:
        StateHandle.from_dict({**CURRENT.to_dict(), **change})
    assert info.value.field == field
