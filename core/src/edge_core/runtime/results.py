"""What a stage call delivers: a result that must be acknowledged to free its slot."""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable, Mapping, Set
from types import TracebackType
from typing import Any

import attrs

from edge_contracts.requests import StageEvent
from edge_core.errors import EdgeError

__all__ = ["AckOutcome", "OutputReleased", "ResultKey", "ResultOutputs", "StageResult"]


class AckOutcome(enum.StrEnum):
    """What an acknowledgement did."""

    #: The result's slot was freed.
    ACKNOWLEDGED = "acknowledged"
    #: Nothing matched (already acknowledged, an older epoch or generation, a reused
    #: request id): nothing was freed.
    STALE = "stale"


@attrs.frozen(weakref_slot=False)
class ResultKey:
    """Identifies one delivery exactly: an acknowledgement must match all four fields.

    (No ``__weakref__`` slot: the runtime builds its keys on a draft,
    :mod:`edge_contracts.drafts`, and CPython refuses the change of class with one.)
    """

    request_id: str
    epoch: int
    generation: int
    serial: int


class OutputReleased(EdgeError, KeyError):
    """An output was read through a result after :meth:`StageResult.ack` released it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ResultOutputs(dict[str, Any]):
    """A result's outputs by name; names released by the acknowledgement say so when read.

    ``released`` is the set of names the owning :class:`StageResult` released; it is the
    result's own set (the result adds to it as it removes those outputs).
    """

    __slots__ = ("_owner", "_released")

    def __init__(self, outputs: Mapping[str, Any], request_id: str,
                 released: Set[str] = frozenset()) -> None:
        dict.__init__(self, outputs)  # (no super() lookup per result)
        self._owner = request_id  # worded only when an error needs it
        self._released = released

    def __missing__(self, key: str) -> Any:
        if key in self._released:
            raise OutputReleased(
                f"request[{self._owner}].outputs.{key}: released by ack() (it was a view of the "
                "worker's shared memory): take the array, or a copy, before acknowledging"
            )
        raise KeyError(key)


_NONE_RETAINED: list[tuple[set[str], Callable[[], bool]]] = []  # shared: never changed


class StageResult:
    """One request's outputs, retained (and holding its slot) until acknowledged.

    Use it as a context manager to acknowledge on exit, or call :meth:`ack`.

    Outputs that travelled inline are private, read-only arrays. Large outputs (those that came
    through shared memory) are read-only views of the worker's memory, not copies: the
    acknowledgement gives that memory back for reuse and removes them from
    :attr:`outputs` (reading one then raises :class:`OutputReleased`). An array taken
    from :attr:`outputs` before the acknowledgement stays valid as long as it is
    referenced: its memory is then kept for it and never reused (a ``ResourceWarning``
    says so, since that memory has to be replaced).

    Attributes:
        key: The request id, epoch, generation and serial the delivery belongs to.
        outputs: Output name to array: a :class:`ResultOutputs` when some came through
            shared memory (a name the acknowledgement released says so when read), else
            a plain dict.
        events: Every event the request produced, the terminal one last.
        latency_s: Submit-to-terminal time measured by the runtime.
    """

    __slots__ = ("_ack", "_released", "_retained", "events", "key", "latency_s", "outputs")

    # Only outputs that are views of worker memory (retained) are ever released.
    _released: set[str] | None
    outputs: dict[str, Any]

    def __init__(
        self,
        key: ResultKey,
        outputs: Mapping[str, Any],
        events: tuple[StageEvent, ...],
        latency_s: float,
        ack: Callable[[ResultKey], AckOutcome],
        retained: list[tuple[set[str], Callable[[], bool]]] | None = None,
    ) -> None:
        self.key = key
        if retained:
            self._released = set()
            self.outputs = ResultOutputs(outputs, key.request_id, self._released)
            self._retained = list(retained)
        else:  # nothing is ever released: a plain dict reads the same (KeyError if absent)
            self._released = None
            self.outputs = dict(outputs)
            self._retained = _NONE_RETAINED
        self.events = events
        self.latency_s = latency_s
        self._ack = ack

    @property
    def data(self) -> Mapping[str, Any]:
        """The terminal event's JSON data."""
        return self.events[-1].data if self.events else {}

    def ack(self) -> AckOutcome:
        """Acknowledge the delivery; frees its slot the first time, is stale afterwards.

        The first call also gives shared-memory outputs back to the worker.
        """
        try:
            return self._ack(self.key)
        finally:
            if self._retained:  # (no call when nothing came through shared memory)
                self.release_outputs()

    def release_outputs(self) -> None:
        """Give shared-memory outputs back to the worker now (idempotent; ack does it).

        Cut short by a ``KeyboardInterrupt``, it runs again to its end before the
        interrupt goes on (each output's release gives nothing back twice): no output's
        memory is left held by the worker for good.
        """
        retained, self._retained = self._retained, []  # (no call between: see the try)
        if not retained:
            return
        try:
            kept = self._give_back(retained)
        except BaseException:  # cut short (a Ctrl-C): run again to its end, then raised
            self._give_back(retained)
            raise
        if kept:
            warnings.warn(
                f"request[{self.key.request_id}]: outputs {sorted(kept)} were still "
                "referenced when acknowledged: their shared memory stays theirs and the "
                "worker must replace it (copy outputs you keep, or drop them before ack())",
                ResourceWarning,
                stacklevel=3,
            )

    def _give_back(self, retained: list[tuple[set[str], Callable[[], bool]]]) -> list[str]:
        """Remove ``retained``'s outputs and release their memory: the names still referenced.

        Run again after an interrupt, it releases nothing twice (each release is
        idempotent).
        """
        released = self._released
        assert released is not None  # made with the retained outputs
        outputs = self.outputs
        for names, _ in retained:
            for name in names:
                outputs.pop(name, None)
                released.add(name)
        kept: list[str] = []
        for names, release in retained:
            if release():
                kept.extend(names)
        return kept

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
