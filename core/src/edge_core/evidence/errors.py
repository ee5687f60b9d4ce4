"""Errors of the evidence tools: profiles, qualification records and matrix reports."""

from __future__ import annotations

from edge_core.errors import EdgeError

__all__ = ["EvidenceError", "RecordInvalid"]


class EvidenceError(EdgeError):
    """Base class of the evidence errors; the message reads ``field: reason: value``."""

    def __init__(self, field: str, reason: str, value: object = None) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")


class RecordInvalid(EvidenceError):
    """A profile, a job record or a qualification record is malformed or inconsistent."""
