"""Drafts: instances of a frozen slotted class built from values checked already.

A frozen dataclass or attrs class refuses attribute assignment, so the per-call builders
of such values (:func:`~edge_contracts.requests.prechecked_request` and the like) used to
set each field through its slot's descriptor, one C call per field (about as much as a
Python call each). A *draft class* declares the same slots and nothing else: a draft's
fields are set by plain attribute stores, and the finished draft then takes the frozen
class as its own (``draft.__class__ = cls``; CPython allows it between classes of the
same layout). It is from then on an instance of ``cls`` like one its constructor made
with the same values (type, equality, hash, repr, frozenness), without that
constructor's checks: only for values that passed them once already.

Standard library only, like the rest of the worker side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["draft_class"]


def draft_class(cls: type) -> Callable[[], Any]:
    """A class whose instances become instances of ``cls`` by ``draft.__class__ = cls``.

    ``cls`` must be a slotted class made directly on ``object`` (a frozen
    ``dataclass(slots=True)``, or ``attrs.frozen(weakref_slot=False)``: CPython refuses
    the change of class between classes with a ``__weakref__`` slot). Every field of a draft must be
    set before its class is changed: one left unset reads as missing (AttributeError).

    Raises:
        TypeError: ``cls`` is not such a class, or CPython refuses the change of class
            (checked here, once, with an empty draft).
    """
    slots = cls.__dict__.get("__slots__")
    if cls.__bases__ != (object,) or not isinstance(slots, tuple) or "__dict__" in slots:
        raise TypeError(f"draft_class: {cls.__qualname__} is no slotted class on object")
    draft = type(f"{cls.__name__}Draft", (), {"__slots__": slots,
                                             "__module__": cls.__module__})
    draft().__class__ = cls  # raises TypeError now when the layouts differ
    return draft
