"""Keep the hook reference honest: every hook is documented and says who answers it."""

from __future__ import annotations

import inspect

import pytest

from edge_core import hookspecs
from edge_core.binding import OPTIONAL_OWNER_HOOKS, REQUIRED_OWNER_HOOKS


@pytest.mark.parametrize("name", hookspecs.HOOK_NAMES)
def test_every_hook_has_a_complete_docstring(name: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    assert len(doc.splitlines()) >= 3, f"{name}: docstring too short"
    owner_only = name in REQUIRED_OWNER_HOOKS + OPTIONAL_OWNER_HOOKS
    phrase = "Owner only" if owner_only else "Every plugin answers"
    assert phrase.lower() in doc.lower(), f"{name}: must say '{phrase}'"
    params = [p for p in inspect.signature(getattr(hookspecs, name)).parameters
              if p != "self"]
    for param in params:
        assert param in doc, f"{name}: parameter {param!r} undocumented"
    if inspect.signature(getattr(hookspecs, name)).return_annotation not in ("None", None):
        assert "Returns:" in doc, f"{name}: return value undocumented"


def test_owner_hooks_are_exactly_the_lifecycle_hooks_after_discovery() -> None:
    every = {"edge_backends", "edge_probe", "edge_register_commands"}
    assert set(hookspecs.HOOK_NAMES) == every | set(REQUIRED_OWNER_HOOKS) | set(
        OPTIONAL_OWNER_HOOKS)
