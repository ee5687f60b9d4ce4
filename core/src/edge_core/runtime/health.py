"""A stage's health: one state machine, and the restart policy that drives it.

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
reservation is quarantined) and in-flight requests have ended with typed errors.

The restart policy (:class:`RestartPolicy`, stage options ``restart``, ``max_restarts``,
``restart_backoff_s``) decides what happens next: with ``never`` (the default) the stage
waits for an explicit ``restart()``; with ``on-failure`` a :class:`Supervisor` thread
restarts it — reserve again, load, the whole warm-up gate, a new generation — after a
backoff of ``restart_backoff_s * 2**(n-1)`` seconds (at most :data:`MAX_BACKOFF_S`) before
the n-th consecutive attempt, up to ``max_restarts`` attempts; after that the stage stays
``failed``. The count starts over once the restarted stage has served a request, or
after a successful manual ``restart()`` (a stage that fails before it serves again, a
crash loop, runs out of attempts).

A stage with ``replicas = N`` has one state machine, one supervisor and one restart count
per replica: a failed replica is retired, released and restarted alone while the others
serve; :func:`replica_summary` says how many of the N are live.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "MAX_BACKOFF_S",
    "RestartMode",
    "RestartPolicy",
    "StageHealth",
    "StageState",
    "Supervisor",
    "error_record",
    "pipeline_health",
    "replica_summary",
    "restart_coming",
]

MAX_BACKOFF_S = 30.0
"""The longest wait before one automatic restart attempt."""


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


class RestartMode(enum.StrEnum):
    """The stage option ``restart``."""

    NEVER = "never"
    ON_FAILURE = "on-failure"


@attrs.frozen
class RestartPolicy:
    """When and how often a stage is restarted automatically.

    Attributes:
        mode: ``never`` (wait for ``restart()``) or ``on-failure``.
        max_restarts: Consecutive automatic attempts before the stage stays failed.
        backoff_s: Wait before the first attempt; doubled for each further one.
    """

    mode: RestartMode = RestartMode.NEVER
    max_restarts: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    backoff_s: float = attrs.field(default=0.5, validator=attrs.validators.ge(0.0))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before automatic attempt number ``attempt`` (1-based)."""
        return float(min(MAX_BACKOFF_S, self.backoff_s * 2 ** max(0, attempt - 1)))

    def to_dict(self) -> dict[str, object]:
        """Plain form for reports."""
        return {"restart": self.mode.value, "max_restarts": self.max_restarts,
                "restart_backoff_s": self.backoff_s}


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

    def to_dict(self) -> dict[str, object]:
        """Plain form for reports and ``edge run``."""
        return {"stage": self.stage_id, "state": self.state.value, "reason": self.reason,
                "generation": self.generation, "restarts": self.restarts,
                "in_flight": self.in_flight, "policy": self.policy.to_dict(),
                "worker": self.worker, "error": self.error}


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


class Supervisor:
    """Runs a stage's automatic restarts on a thread of its own, as the policy says.

    Args:
        policy: The stage's restart policy.
        attempt: Runs one restart (reserve, load, gate); raises when it fails.
        failed: Called with the error of a failed attempt (the stage is then failed).
        name: Names the thread.
    """

    def __init__(self, policy: RestartPolicy, attempt: Callable[[], None],
                 failed: Callable[[BaseException], None], name: str) -> None:
        self.policy = policy
        self.restarts = 0
        self._attempt = attempt
        self._failed = failed
        self._name = name
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def schedule(self) -> bool:
        """Start restarting in the background if the policy says so; True when it does."""
        if self.policy.mode is not RestartMode.ON_FAILURE or self._closing.is_set():
            return False
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return True
            if self.restarts >= self.policy.max_restarts:
                return False
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return True

    def _run(self) -> None:
        while self.restarts < self.policy.max_restarts:
            self.restarts += 1
            if self._closing.wait(self.policy.delay(self.restarts)):
                return
            try:
                self._attempt()
            except Exception as error:  # the stage stays failed; maybe try again
                self._failed(error)
                if self._closing.is_set():
                    return
                continue
            return

    @property
    def pending(self) -> bool:
        """True while an automatic restart runs or may still start, as the policy allows.

        False under ``never``, once closing, and after the last of ``max_restarts``
        attempts has ended.
        """
        if self.policy.mode is not RestartMode.ON_FAILURE or self._closing.is_set():
            return False
        thread = self._thread
        running = thread is not None and thread.is_alive()
        return running or self.restarts < self.policy.max_restarts

    def reset(self) -> None:
        """The stage served again (or was restarted by hand): the count starts over."""
        self.restarts = 0

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop scheduling; wait (bounded) for an attempt in progress to end."""
        self._closing.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)


def restart_coming(state: StageState, supervisor: Supervisor) -> bool:
    """True when a stage in ``state`` does not serve now but a restart runs or will.

    ``restarting`` (an automatic or a manual restart in progress) always is; ``failed``
    and ``needs-restart`` are when the policy is ``on-failure`` with attempts left
    (:attr:`Supervisor.pending`); ``ready`` and ``retired`` never are.
    """
    if state is StageState.RESTARTING:
        return True
    if state in (StageState.FAILED, StageState.NEEDS_RESTART):
        return supervisor.pending
    return False


def pipeline_health(name: str, closed: bool, stages: Sequence[StageHealth],
                    replicas: Mapping[str, Mapping[str, object]] | None = None,
                    ) -> dict[str, Any]:
    """A pipeline's health: ``ready`` when every stage is, ``degraded`` otherwise, or ``closed``.

    Args:
        name: The pipeline.
        closed: Whether it was closed.
        stages: Each stage runtime's health (a replica r > 0 named ``stage#r``).
        replicas: Stage id → :func:`replica_summary` of its replicas.

    Returns:
        ``{"pipeline", "state", "stages": {stage id: StageHealth.to_dict()},
        "replicas": {stage id: {"declared", "live", "state"}}}``.
    """
    ready = all(h.state is StageState.READY for h in stages)
    state = "closed" if closed else "ready" if ready else "degraded"
    return {"pipeline": name, "state": state,
            "stages": {h.stage_id: h.to_dict() for h in stages},
            "replicas": {sid: dict(summary) for sid, summary in (replicas or {}).items()}}
