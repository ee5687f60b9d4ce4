"""The one exception family of the OCR example: every message reads ``field: reason: value``."""

from __future__ import annotations

from edge_contracts.error_copies import whole_reduction

__all__ = ["ModelSourceError", "OcrError", "TensorMismatch"]


class OcrError(ValueError):
    """Base class of every error raised by the OCR example."""

    def __init__(self, field: str, reason: str, value: object = None) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


class TensorMismatch(OcrError):
    """A tensor handed to a transform or decoder is missing or has the wrong shape or dtype."""


class ModelSourceError(OcrError):
    """The PP-OCR graphs could not be found, fetched or verified."""
