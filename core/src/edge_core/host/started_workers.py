"""The workers started while a plugin's hook runs, so that a load that fails retires them.

:func:`edge_core.host.bootstrap.start_worker` notes every client it hands back
(:func:`note_started`) in the :class:`StartedWorkers` scope open on the calling thread,
if any. The binding of ``edge_load`` (:mod:`edge_core.binding`) opens one around the
plugin's hook: when the hook raises, or returns ``None`` (nothing to retire through
``edge_retire``), every worker it started is retired there and then, and the error
carries the combined :class:`~edge_core.host.retire.RetireOutcome`, so that the
runtime settles the stage's reservation by it (released when every worker is verified
gone, quarantined otherwise). Without this, such a worker lived on until the controller
exited: a handle no one held, memory the ledger had given back.

The scope is the calling thread's (a :class:`contextvars.ContextVar`): a worker a hook
starts on a thread of its own is not seen. Retiring is idempotent, so a worker the
plugin retired itself while failing (``WorkerStage.start`` does) is only asked again.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Protocol

from edge_core.host.retire import RetireOutcome

__all__ = ["StartedWorkers", "combined_outcome", "note_started"]

_ESCALATIONS = ("graceful", "terminate", "kill")


class _Retirable(Protocol):
    def retire(self, deadline_s: float = ...) -> RetireOutcome: ...


_current: contextvars.ContextVar[StartedWorkers | None] = contextvars.ContextVar(
    "edge_started_workers", default=None)


class StartedWorkers:
    """A ``with`` block that keeps every worker started on this thread while it is open.

    Scopes nest: a worker is noted in the innermost open one only.
    """

    def __init__(self) -> None:
        self.clients: list[_Retirable] = []
        """The clients started inside the block, in the order they started."""
        self._token: contextvars.Token[StartedWorkers | None] | None = None

    def __enter__(self) -> StartedWorkers:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None

    def retire(self, deadline_s: float) -> RetireOutcome | None:
        """Retire every worker noted (idempotent); their combined outcome, ``None`` if none.

        A retirement that raises counts as unverified, naming the error; the others are
        retired all the same.
        """
        outcomes = []
        for client in self.clients:
            try:
                outcomes.append(client.retire(deadline_s))
            except Exception as error:  # one worker's failure must not keep the others
                outcomes.append(RetireOutcome(
                    verified=False, reason=f"retire raised {type(error).__name__}: {error}"))
        return combined_outcome(outcomes) if outcomes else None


def note_started(client: _Retirable) -> None:
    """Note ``client`` in the scope open on this thread (nothing when none is open)."""
    scope = _current.get()
    if scope is not None:
        scope.clients.append(client)


def combined_outcome(outcomes: Sequence[RetireOutcome]) -> RetireOutcome:
    """One outcome for several retirements: verified only when every one is.

    Reasons are joined, survivors and trees put together, the furthest escalation kept
    and the times added up.
    """
    reasons = [outcome.reason for outcome in outcomes if outcome.reason]
    steps = [outcome.escalation for outcome in outcomes]
    return RetireOutcome(
        verified=all(outcome.verified for outcome in outcomes),
        reason="; ".join(reasons) or None,
        survivors=tuple(s for outcome in outcomes for s in outcome.survivors),
        tree=tuple(t for outcome in outcomes for t in outcome.tree),
        escalation=max(steps, key=lambda s: _ESCALATIONS.index(s) if s in _ESCALATIONS
                       else len(_ESCALATIONS)) if steps else "graceful",
        elapsed_s=sum(outcome.elapsed_s for outcome in outcomes),
    )
