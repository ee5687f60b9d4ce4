"""What a stage call delivers: a result that must be acknowledged to free its slot."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import attrs

from edge_contracts.requests import StageEvent

__all__ = ["AckOutcome", "ResultKey", "StageResult"]


class AckOutcome(enum.StrEnum):
    """What an acknowledgement did."""

    #: The result's slot was freed.
    ACKNOWLEDGED = "acknowledged"
    #: Nothing matched (already acknowledged, an older epoch or generation, a reused
    #: request id): nothing was freed.
    STALE = "stale"


@attrs.frozen
class ResultKey:
    """Identifies one delivery exactly: an acknowledgement must match all four fields."""

    request_id: str
    epoch: int
    generation: int
    serial: int


class StageResult:
    """One request's outputs, retained (and holding its slot) until acknowledged.

    Use it as a context manager to acknowledge on exit, or call :meth:`ack`.

    Attributes:
        key: The request id, epoch, generation and serial the delivery belongs to.
        outputs: Output name to array (private copies: they stay valid after the ack).
        events: Every event the request produced, the terminal one last.
        latency_s: Submit-to-terminal time measured by the runtime.
    """

    __slots__ = ("_ack", "events", "key", "latency_s", "outputs")

    def __init__(
        self,
        key: ResultKey,
        outputs: Mapping[str, Any],
        events: tuple[StageEvent, ...],
        latency_s: float,
        ack: Callable[[ResultKey], AckOutcome],
    ) -> None:
        self.key = key
        self.outputs = dict(outputs)
        self.events = events
        self.latency_s = latency_s
        self._ack = ack

    @property
    def data(self) -> Mapping[str, Any]:
        """The terminal event's JSON data."""
        return self.events[-1].data if self.events else {}

    def ack(self) -> AckOutcome:
        """Acknowledge the delivery; frees its slot the first time, is stale afterwards."""
        return self._ack(self.key)

    def __enter__(self) -> StageResult:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.ack()

    def __repr__(self) -> str:
        return f"StageResult({self.key.request_id!r}, outputs={sorted(self.outputs)})"
