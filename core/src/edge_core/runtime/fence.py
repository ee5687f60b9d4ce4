"""Outcomes of a per-request cancel that never interrupts a running non-preemptible call.

``Submission.cancel(interrupt=False)`` (and :meth:`StageRuntime.fence`,
:meth:`ReplicaSet.fence`, :meth:`RequestTracker.fence`) fences a request at once — no
further stage starts for it, none of its output is delivered — without retiring any
worker: a call that a non-preemptible stage is running is left to finish there, and its
result is discarded (its shared memory given back, its stage slot and the pipeline's
admission slot freed) as soon as it arrives. A preemptible stage still stops it in place.

:class:`FenceOutcome` says exactly what became of the request. It is a core value, not
the hook contract's :class:`~edge_core.backend.CancelOutcome`: ``left-to-finish`` is no
answer a backend gives, it is what the runtime chose to do.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

__all__ = ["FenceOutcome", "strongest_fence"]


class FenceOutcome(str, enum.Enum):
    """What a non-interrupting cancel did with one request."""

    #: The request had ended (delivered, failed or cancelled before); nothing was touched.
    ALREADY_FINISHED = "already-finished"
    #: No stage call of it was running (waiting for admission or a stage slot, between
    #: two stages, or its last call had answered and nothing was delivered yet): it is
    #: stopped before anything further runs.
    NOT_STARTED = "not-started"
    #: A preemptible stage stopped its running call inside the worker; the worker stays.
    CANCELLED_IN_PLACE = "cancelled-in-place"
    #: A stage call of it is in flight on a stage that cannot stop it in place (or that
    #: answered that it cannot): fenced, left to finish in the worker, its result
    #: discarded when it arrives. The worker stays; the stage slot and the pipeline's
    #: admission slot are freed then.
    LEFT_TO_FINISH = "left-to-finish"


_ORDER = (FenceOutcome.LEFT_TO_FINISH, FenceOutcome.CANCELLED_IN_PLACE,
          FenceOutcome.NOT_STARTED)


def strongest_fence(outcomes: Iterable[FenceOutcome]) -> FenceOutcome:
    """The outcome that says most about work still in flight (fan-out items, replicas).

    ``left-to-finish`` before ``cancelled-in-place`` before ``not-started``; none of
    them: ``already-finished``.
    """
    seen = set(outcomes)
    for outcome in _ORDER:
        if outcome in seen:
            return outcome
    return FenceOutcome.ALREADY_FINISHED
