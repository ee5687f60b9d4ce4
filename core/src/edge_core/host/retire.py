"""Bounded retirement of a worker's whole process tree, with a verified outcome.

A :class:`ProcessTree` accumulates every process it has ever seen under a worker, each
by :class:`~edge_core.host.identity.ProcessIdentity`: the descendants of the root and the
members of the root's session (the worker is started as a session leader, so orphans that
were re-parented away still carry its session id). It captures at start, after the
hello, on every health check and again before and during retirement.

:meth:`ProcessTree.retire` escalates: wait for a graceful exit, ``SIGTERM`` every known
live process, then ``SIGKILL``; between steps it re-scans the session so that processes
forked late are caught too. Finally it verifies that every captured identity is gone.
Signals only ever reach a process whose PID *and* creation time match the capture, so a
reused PID is never signalled. The outcome is recorded; calling again returns it (an
unverified outcome is re-checked first).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time

import attrs
import psutil

from edge_core.host.identity import ProcessIdentity, descendants, session_members

__all__ = ["DEFAULT_RETIRE_DEADLINE_S", "ProcessTree", "RetireOutcome"]

DEFAULT_RETIRE_DEADLINE_S = 5.0
"""Default bound on a whole retirement, graceful wait included."""

_POLL_S = 0.01


@attrs.frozen
class RetireOutcome:
    """How a retirement ended.

    Attributes:
        verified: every captured process of the tree is confirmed gone.
        reason: why it is not verified (None when verified).
        survivors: identities still alive when the deadline passed.
        tree: every identity captured for this worker.
        escalation: the last step needed: ``graceful``, ``terminate`` or ``kill``.
        elapsed_s: wall time the retirement took.

    """

    verified: bool
    reason: str | None
    survivors: tuple[ProcessIdentity, ...] = ()
    tree: tuple[ProcessIdentity, ...] = ()
    escalation: str = "graceful"
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """Plain form for execution plans and reports."""
        return {
            "verified": self.verified,
            "reason": self.reason,
            "survivors": [s.to_dict() for s in self.survivors],
            "tree": [t.to_dict() for t in self.tree],
            "escalation": self.escalation,
            "elapsed_s": round(self.elapsed_s, 4),
        }


class ProcessTree:
    """Every process captured under one worker root, and the means to retire them all."""

    def __init__(self, root: ProcessIdentity, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.root = root
        self._popen = popen
        self._known: set[ProcessIdentity] = {root}
        self._lock = threading.Lock()
        self._outcome: RetireOutcome | None = None

    @property
    def known(self) -> frozenset[ProcessIdentity]:
        """Every identity captured so far (the root included)."""
        with self._lock:
            return frozenset(self._known)

    @property
    def outcome(self) -> RetireOutcome | None:
        """The recorded outcome of the last retirement, if any."""
        return self._outcome

    def capture(self) -> frozenset[ProcessIdentity]:
        """Add the root's live descendants and session members; return all known."""
        found = descendants(self.root) | session_members(self.root)
        with self._lock:
            self._known |= found
            return frozenset(self._known)

    def alive(self) -> list[ProcessIdentity]:
        """Known identities that are still running."""
        return [ident for ident in self.known if ident.is_alive()]

    def root_exited(self) -> bool:
        """Tell whether the root process has exited (reaping it if it is our child)."""
        if self._popen is not None:
            return self._popen.poll() is not None
        return not self.root.is_alive()

    def retire(
        self, deadline_s: float = DEFAULT_RETIRE_DEADLINE_S, *, graceful_s: float = 0.0
    ) -> RetireOutcome:
        """Retire the whole tree within ``deadline_s`` seconds; idempotent.

        ``graceful_s`` is how long to wait for the root to leave on its own (the caller
        has asked it to) before signals are sent.
        """
        with self._lock:
            previous = self._outcome
        if previous is not None and previous.verified:
            return previous
        started = time.monotonic()
        end = started + max(deadline_s, 0.0)
        self.capture()
        escalation = "graceful"
        if graceful_s > 0:
            self._wait_root(min(started + graceful_s, end))
            self.capture()
        if self._wait_all(time.monotonic()):
            return self._record(started, escalation)
        escalation = "terminate"
        term_end = min(end, time.monotonic() + max(0.2, (end - time.monotonic()) * 0.4))
        if not self._signal_until(signal.SIGTERM, term_end):
            escalation = "kill"
            self._signal_until(signal.SIGKILL, end)
        return self._record(started, escalation)

    def _wait_root(self, until: float) -> None:
        while time.monotonic() < until:
            if self.root_exited():
                return
            time.sleep(_POLL_S)

    def _wait_all(self, until: float) -> bool:
        while True:
            if not self.alive():
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(_POLL_S)

    def _signal_until(self, signum: signal.Signals, until: float) -> bool:
        """Send ``signum`` to every live known process (rescanning) until all gone or ``until``."""
        signalled: set[ProcessIdentity] = set()
        while True:
            self.capture()
            living = []
            for ident in self.known:
                proc = ident.process()
                if proc is None:
                    continue
                living.append(ident)
                if ident not in signalled:
                    _send(proc, signum)
                    signalled.add(ident)
            self._reap_root()
            if not living:
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(_POLL_S)

    def _reap_root(self) -> None:
        if self._popen is not None:
            self._popen.poll()

    def _record(self, started: float, escalation: str) -> RetireOutcome:
        self._reap_root()
        if self._popen is not None and self._popen.returncode is None:
            # the root is our child: reap it so that no zombie is left behind
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=0.5)
        survivors = tuple(sorted(self.alive(), key=lambda i: i.pid))
        reason = None
        if survivors:
            reason = f"tree: still alive after the deadline: {[s.pid for s in survivors]}"
        outcome = RetireOutcome(
            verified=not survivors,
            reason=reason,
            survivors=survivors,
            tree=tuple(sorted(self.known, key=lambda i: i.pid)),
            escalation=escalation,
            elapsed_s=time.monotonic() - started,
        )
        with self._lock:
            self._outcome = outcome
        return outcome


def _send(proc: psutil.Process, signum: signal.Signals) -> None:
    """Signal ``proc``; psutil refuses if its PID now belongs to another process."""
    with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        proc.send_signal(signum)
