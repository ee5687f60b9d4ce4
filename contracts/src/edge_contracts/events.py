"""What a request asks (:class:`Operation`) and what an event is (:class:`EventKind`).

Kept apart from :mod:`edge_contracts.requests` (which re-exports both) so that the worker
serve loop can use them without importing the request and event value types.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TERMINAL_KINDS", "EventKind", "Operation"]


class Operation(StrEnum):
    """What a request asks of a stage."""

    RUN = "run"
    """A graph stage: one stateless call on a fixed input bucket."""
    GENERATE = "generate"
    """A streaming stage: a sequence of events, stateful inside the worker."""


class EventKind(StrEnum):
    """The kind of a stage event; see :attr:`terminal`."""

    OUTPUT = "output"
    TOKEN = "token"  # noqa: S105 - an event kind, not a secret
    PROGRESS = "progress"
    DONE = "done"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether an event of this kind ends its request (DONE, ERROR, CANCELLED)."""
        return self in TERMINAL_KINDS


TERMINAL_KINDS = frozenset({EventKind.DONE, EventKind.ERROR, EventKind.CANCELLED})
"""The kinds that end a request (``kind in TERMINAL_KINDS`` is :attr:`EventKind.terminal`
without the property call, for per-event paths)."""
