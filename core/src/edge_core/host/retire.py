"""Bounded retirement of a worker's whole process tree, with a verified outcome.

A :class:`ProcessTree` accumulates every process it has ever seen under a worker, each
by :class:`~edge_core.host.identity.ProcessIdentity`. Each capture re-walks the tree from
*every* member seen so far (:func:`~edge_core.host.identity.related_members`): the
descendants of each live member, and the members of every session and process group a
member leads (orphans keep those ids after their parent died). On POSIX the root is the
worker's supervisor (:mod:`edge_core.host.supervisor`), a child subreaper: an orphan of
the worker's tree, even one that left the session, is re-parented to it and so stays a
descendant of the root. The tree is captured at start, after the hello, on every health
check and at every step of retirement.

:meth:`ProcessTree.retire` escalates: wait for a graceful exit, ``SIGTERM`` every known
live process, then ``SIGKILL`` (the root last, so that it keeps adopting orphans while
the rest is killed, and a Python resource tracker only once the processes it watches are
gone and it had a grace to clean up after them); between steps it re-captures so that
processes forked late are caught too. The deadline is split so that the kill phase always
keeps its share (:data:`KILL_SHARE`): a ``SIGTERM`` that is ignored cannot use up the
time that ``SIGKILL`` needs. Finally it verifies that every identity ever captured is gone
(``verified`` is never true while one lives). Signals only ever reach a process whose PID
*and* creation time match the capture, so a reused PID is never signalled. The outcome
is recorded; calling again returns it (an unverified outcome is re-checked first).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time

import attrs
import psutil

from edge_core.host.identity import ProcessIdentity, related_members
from edge_core.host.started_process import StartedProcess
from edge_core.host.supervisor import TRACKER_GRACE_S, is_tracker

__all__ = [
    "DEFAULT_RETIRE_DEADLINE_S",
    "GRACEFUL_SHARE",
    "KILL_SHARE",
    "ProcessTree",
    "RetireOutcome",
]

DEFAULT_RETIRE_DEADLINE_S = 5.0
"""Default bound on a whole retirement, graceful wait included."""

GRACEFUL_SHARE = 0.25
"""Most of a retirement's deadline the graceful wait may use."""

KILL_SHARE = 0.5
"""Least of a retirement's deadline kept for the ``SIGKILL`` phase."""

_POLL_S = 0.01

_LAST_STRETCH_S = 0.1
"""The last seconds before a ``SIGKILL`` phase's end, when no process is spared any more."""

_LAST_STRETCH_SHARE = 0.25
"""Most of the time left at its start that a phase's last stretch takes (a short phase)."""


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

    def __init__(self, root: ProcessIdentity, popen: StartedProcess | None = None) -> None:
        self.root = root
        self.main = root
        """The worker's own process: the root, or the root's child under a supervisor."""
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

    def adopt(self, main: ProcessIdentity) -> None:
        """Record the worker's own process (a child of the root under a supervisor)."""
        self.main = main
        with self._lock:
            self._known.add(main)

    def capture(self) -> frozenset[ProcessIdentity]:
        """Add every live process related to a known one (see module doc); return all known."""
        found = related_members(self.known)
        with self._lock:
            self._known |= found
            return frozenset(self._known)

    def alive(self) -> list[ProcessIdentity]:
        """Known identities that are still running."""
        return [ident for ident in self.known if ident.is_alive()]

    def root_exited(self) -> bool:
        """Tell whether the root process has exited (reaping it if it is our child)."""
        if self._popen is not None and self._popen.poll() is not None:
            return True
        # not ours to reap (a pooled root whose zygote died reports no status): by identity
        return not self.root.is_alive()

    def retire(
        self, deadline_s: float = DEFAULT_RETIRE_DEADLINE_S, *, graceful_s: float = 0.0,
        window_s: float = 0.0,
    ) -> RetireOutcome:
        """Retire the whole tree within ``window_s + deadline_s`` seconds; idempotent.

        ``graceful_s`` is how long to wait for the root to leave on its own (the caller
        has asked it to) before signals are sent, taken from the deadline (at most
        :data:`GRACEFUL_SHARE` of it). ``window_s`` is a graceful window the worker
        declared for its own shutdown (an engine that needs seconds to stop): it is
        waited in full *before* the deadline starts, so the signal phases keep all of
        the deadline and the whole retirement stays bounded by the sum.
        """
        with self._lock:
            previous = self._outcome
        if previous is not None and previous.verified:
            return previous
        started = time.monotonic()
        self.capture()
        if window_s > 0:
            self._wait_root(started + window_s)
            self.capture()
        begun = time.monotonic()
        deadline_s = max(deadline_s, 0.0)
        end = begun + deadline_s
        kill_from = end - KILL_SHARE * deadline_s
        escalation = "graceful"
        if graceful_s > 0:
            self._wait_root(min(begun + graceful_s, begun + GRACEFUL_SHARE * deadline_s))
            self.capture()
        if self._wait_all(time.monotonic()):
            return self._record(started, escalation)
        escalation = "terminate"
        if not self._signal_until(signal.SIGTERM, max(kill_from, time.monotonic())):
            escalation = "kill"
            self._signal_until(signal.SIGKILL, end, root_last=True)
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

    def _signal_until(
        self, signum: signal.Signals, until: float, *, root_last: bool = False
    ) -> bool:
        """Send ``signum`` to every live known process (re-capturing) until all gone or ``until``.

        With ``root_last``, Python multiprocessing resource trackers
        (:func:`~edge_core.host.supervisor.is_tracker`) are spared while any other process
        of the tree (the root aside) lives, then for
        :data:`~edge_core.host.supervisor.TRACKER_GRACE_S` more, as the supervisor spares
        them: once the processes they watch are gone they unlink what those left in
        ``/dev/shm`` and exit by themselves, which a ``SIGKILL`` would prevent. The root is
        signalled only once nothing else of the tree lives: while it lives, a subreaper root
        adopts the orphans that the other signals make, and the next capture finds them.
        Neither is spared into the last stretch before ``until`` (:data:`_LAST_STRETCH_S`,
        at most :data:`_LAST_STRETCH_SHARE` of the time left): then every live process is
        signalled, so that the signal takes effect within ``until``.
        """
        signalled: set[ProcessIdentity] = set()
        checked: set[ProcessIdentity] = set()
        trackers: set[ProcessIdentity] = set()
        last_from = until - min(_LAST_STRETCH_S,
                                _LAST_STRETCH_SHARE * max(until - time.monotonic(), 0.0))
        others_gone: float | None = None  # when only trackers (and the root) were left
        while True:
            self.capture()
            living = []
            for ident in self.known:
                proc = ident.process()
                if proc is not None:
                    living.append((ident, proc))
            if root_last:
                for ident, _ in living:
                    if ident != self.root and ident not in checked:
                        checked.add(ident)
                        if is_tracker(ident.pid):
                            trackers.add(ident)
            now = time.monotonic()
            watched = any(ident != self.root and ident not in trackers for ident, _ in living)
            if watched:
                others_gone = None
            elif others_gone is None:
                others_gone = now
            for ident, proc in living:
                if ident in signalled:
                    continue
                if root_last and now < last_from and (
                        (ident == self.root and len(living) > 1)
                        or (ident in trackers and (
                            others_gone is None or now < others_gone + TRACKER_GRACE_S))):
                    continue
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
