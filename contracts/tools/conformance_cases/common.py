"""Shared constants and the ``case`` helper of the hand-written conformance cases."""

from __future__ import annotations

from typing import Any

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024
SHA_A = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
SHA_B = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
ALL_FEATURES = ["bfloat16", "cancel", "shm-tensors", "stream-events"]


def case(name: str, error: str, field: str | None, set_: dict[str, Any] | None = None,
         delete: list[str] | None = None, base: int = 0) -> dict[str, Any]:
    """An override of valid object number ``base`` that must raise ``error`` at ``field``."""
    out: dict[str, Any] = {"name": name, "base": base, "set": set_ or {}, "delete": delete or []}
    out["error"] = error
    if field is not None:
        out["field"] = field
    return out
