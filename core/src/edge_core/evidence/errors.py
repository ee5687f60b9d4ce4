"""Errors of the evidence tools: profiles, qualification records and matrix reports."""

from __future__ import annotations

from edge_core.errors import NO_VALUE, EdgeError

__all__ = ["EvidenceError", "RecordInvalid"]


class EvidenceError(EdgeError):
    """Base class of the evidence errors; the message reads ``field: reason: value``.

    Without a ``value`` (it is :data:`edge_core.errors.NO_VALUE`: a file that cannot be
    read, a key that is missing) it reads ``field: reason``.
    """

    def __init__(self, field: str, reason: str, value: object = NO_VALUE) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        shown = "" if value is NO_VALUE else f": {value!r}"
        super().__init__(f"{field}: {reason}{shown}")


class RecordInvalid(EvidenceError):
    """A profile, a job record or a qualification record is malformed or inconsistent."""
