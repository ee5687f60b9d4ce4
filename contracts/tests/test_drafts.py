"""Drafts: a frozen slotted instance built by plain stores, then given its frozen class.

What comes out is an instance of the frozen class like one its constructor made with the
same values (type, equality, hash, repr) and frozen from then on; a class whose layout
CPython will not let a draft take is refused when its draft class is made, not per call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from edge_contracts.drafts import draft_class


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: str


def test_a_draft_becomes_an_instance_like_the_constructors() -> None:
    draft: Any = draft_class(Point)()
    draft.x = 3
    draft.y = "a"
    draft.__class__ = Point
    made = Point(3, "a")
    assert type(draft) is Point
    assert draft == made and hash(draft) == hash(made) and repr(draft) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        draft.x = 4  # type: ignore[misc]  # frozen from then on


def test_a_field_left_unset_reads_as_missing() -> None:
    draft: Any = draft_class(Point)()
    draft.x = 1
    draft.__class__ = Point
    with pytest.raises(AttributeError):
        _ = draft.y


def test_a_class_a_draft_cannot_become_is_refused_when_its_draft_class_is_made() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
    class Weak:  # a __weakref__ slot: CPython refuses the change of class
        name: str

    @dataclasses.dataclass(frozen=True)
    class Plain:  # no slots
        name: str

    class Derived(Point):
        __slots__ = ()

    for cls in (Weak, Plain, Derived):
        with pytest.raises(TypeError):
            draft_class(cls)
