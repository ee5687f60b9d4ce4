"""The restart policy of a stage, and the thread that restarts it automatically.

The restart policy (:class:`RestartPolicy`, stage options ``restart``, ``max_restarts``,
``restart_backoff_s``) decides what happens after a stage left ``ready``
(:mod:`edge_core.runtime.health`): with ``never`` (the default) the stage waits for an
explicit ``restart()``; with ``on-failure`` a :class:`Restarter` thread restarts it —
reserve again, load, the whole warm-up gate, a new generation — after a backoff of
``restart_backoff_s * 2**(n-1)`` seconds (at most :data:`MAX_BACKOFF_S`) before the n-th
consecutive attempt, up to ``max_restarts`` attempts; after that the stage stays
``failed``. The count starts over once the restarted stage has served a request, or
after a successful manual ``restart()`` (a stage that fails before it serves again, a
crash loop, runs out of attempts).

A stage with ``replicas = N`` has one restarter and one restart count per replica.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

import attrs

__all__ = ["MAX_BACKOFF_S", "RestartMode", "RestartPolicy", "Restarter"]

MAX_BACKOFF_S = 30.0
"""The longest wait before one automatic restart attempt."""


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


class Restarter:
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
