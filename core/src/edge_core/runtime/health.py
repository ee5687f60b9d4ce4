"""A stage's health: one state machine, and the reports built on it.

States (:class:`StageState`) and what moves a stage between them::

    ready ──cancel of a running non-preemptible call──▶ needs-restart
    ready ──worker died / unresponsive / call overran its deadline──▶ failed
    needs-restart, failed ──restart() or the automatic restart──▶ restarting
    restarting ──reserved, loaded and gated under a new generation──▶ ready
    restarting ──the reload failed──▶ failed
    any ──close()──▶ retired (for good)

``needs-restart`` and ``failed`` both refuse work with ``StageClosed``; they differ in
cause: a stage the user's own cancel retired is healthy otherwise, a failed one lost its
worker. On entering either, the worker tree has already been retired (verified, or the
reservation is quarantined) and in-flight requests have ended with typed errors. What
happens next is the restart policy's decision (:mod:`edge_core.runtime.restarts`).

A stage with ``replicas = N`` has one state machine per replica: a failed replica is
retired, released and restarted alone while the others serve; :func:`replica_summary`
says how many of the N are live.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from edge_core.runtime.restarts import Restarter, RestartPolicy

__all__ = [
    "StageHealth",
    "StageState",
    "error_record",
    "pipeline_health",
    "replica_summary",
    "restart_coming",
]

class StageState(enum.StrEnum):
    """Where a stage is in its life (see the module docstring for the transitions)."""

    READY = "ready"
    #: A running non-preemptible call was cancelled and its worker retired.
    NEEDS_RESTART = "needs-restart"
    #: The worker died, stopped answering or overran a deadline; it has been retired.
    FAILED = "failed"
    #: A restart (manual or automatic) is reserving, loading and gating a new generation.
    RESTARTING = "restarting"
    #: Shut down for good.
    RETIRED = "retired"


@attrs.frozen
class StageHealth:
    """A stage's health as :meth:`Pipeline.health` reports it.

    Attributes:
        stage_id: The stage.
        state: Its :class:`StageState`.
        reason: Why it is not ready (None while ready).
        generation: The worker generation serving (or last served).
        restarts: Automatic restart attempts since the last successful manual restart.
        in_flight: Requests submitted and not yet acknowledged.
        policy: The stage's restart policy.
        worker: The loaded stage's own health report, when it gives one.
        error: The typed error that took it out of ``ready`` or failed its last restart
            (:func:`error_record`), None while ready.
        bundle_changed: The ``BundleChanged`` (:func:`error_record`) a ``finish`` or a
            transform met reading this stage's bundle folder under the current
            generation: the bundle it opened with changed since, so requests that read it
            fail until the stage loads again. None otherwise. The pipeline is not
            ``ready`` while any stage has one.
    """

    stage_id: str
    state: StageState
    reason: str | None
    generation: int
    restarts: int
    in_flight: int
    policy: RestartPolicy
    worker: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    bundle_changed: dict[str, str] | None = None

    def to_dict(self) -> dict[str, object]:
        """Plain form for reports and ``edge run``."""
        return {"stage": self.stage_id, "state": self.state.value, "reason": self.reason,
                "generation": self.generation, "restarts": self.restarts,
                "in_flight": self.in_flight, "policy": self.policy.to_dict(),
                "worker": self.worker, "error": self.error,
                "bundle_changed": self.bundle_changed}


def error_record(error: BaseException) -> dict[str, str]:
    """``{"type", "layer", "message"}`` of an error, for health reports.

    The layer comes from its classes, as in docs/evidence.md: ``worker``, ``numerics``,
    ``placement``, ``admission``…
    """
    from edge_core.evidence.status import classify_error

    layer = classify_error([cls.__name__ for cls in type(error).__mro__]).layer
    return {"type": type(error).__name__, "layer": layer, "message": str(error)}


def replica_summary(states: Sequence[StageState]) -> dict[str, object]:
    """How many of a stage's declared replicas serve: ``{"declared", "live", "state"}``.

    ``state`` is ``ready`` when every replica is, ``degraded`` while some serve and
    others are failed, restarting or waiting for a restart, ``unavailable`` when none
    serves (the stage then refuses work with ``StageClosed``).
    """
    live = sum(1 for state in states if state is StageState.READY)
    state = ("ready" if live == len(states) else "degraded" if live else "unavailable")
    return {"declared": len(states), "live": live, "state": state}


def restart_coming(state: StageState, restarter: Restarter) -> bool:
    """True when a stage in ``state`` does not serve now but a restart runs or will.

    ``restarting`` (an automatic or a manual restart in progress) always is; ``failed``
    and ``needs-restart`` are when the policy is ``on-failure`` with attempts left
    (:attr:`Restarter.pending`); ``ready`` and ``retired`` never are.
    """
    if state is StageState.RESTARTING:
        return True
    if state in (StageState.FAILED, StageState.NEEDS_RESTART):
        return restarter.pending
    return False


def pipeline_health(name: str, closed: bool, stages: Sequence[StageHealth],
                    replicas: Mapping[str, Mapping[str, object]] | None = None,
                    ) -> dict[str, Any]:
    """A pipeline's health: ``ready`` when every stage is, ``degraded`` otherwise, or ``closed``.

    A stage whose bundle changed since it loaded (``bundle_changed``) is not ready, though
    its worker serves: requests that read its bundle folder fail.

    Args:
        name: The pipeline.
        closed: Whether it was closed.
        stages: Each stage runtime's health (a replica r > 0 named ``stage#r``).
        replicas: Stage id → :func:`replica_summary` of its replicas.

    Returns:
        ``{"pipeline", "state", "stages": {stage id: StageHealth.to_dict()},
        "replicas": {stage id: {"declared", "live", "state"}}}``.
    """
    ready = all(h.state is StageState.READY and h.bundle_changed is None for h in stages)
    state = "closed" if closed else "ready" if ready else "degraded"
    return {"pipeline": name, "state": state,
            "stages": {h.stage_id: h.to_dict() for h in stages},
            "replicas": {sid: dict(summary) for sid, summary in (replicas or {}).items()}}
