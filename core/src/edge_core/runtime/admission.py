"""Admission limits: bounded slots, and the size check a request passes before it is sent.

* :class:`SlotPool` is a counter of slots that refuses at once or waits up to a deadline:
  a pipeline's ``admission`` and each stage's in-flight limit are slot pools
  (:func:`take_slot` takes one under a request's deadline).
* :func:`check_request_size` refuses, before anything is sent or charged, a request whose
  tensors exceed the stage's ``max_io_bytes`` (the worker would refuse the frame and drop
  its channel; refused here, the stage keeps serving).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from edge_core.errors import DeadlineExceeded, EdgeError, ResourceUnavailable, StageClosed
from edge_core.runtime.request_inputs import malformed_inputs

__all__ = ["RequestTooLarge", "SlotPool", "SlotsTaken", "check_request_size", "request_bytes",
           "take_slot"]


class SlotsTaken(ResourceUnavailable):
    """Every slot of a :class:`SlotPool` is taken, and none freed in time.

    Its own class, so that a caller trying several pools (a replica set) tells a slot taken
    meanwhile from a backend's own refusal after its slot was taken.
    """


class SlotPool:
    """``limit`` slots; :meth:`acquire` refuses with :class:`SlotsTaken` when none is free.

    Args:
        limit: How many slots exist.
        what: Names the bounded thing in refusals (``stages[ocr].in_flight``).
        lock: The pool's lock (reentrant), when its owner shares its own: the owner may
            then take and free slots within its own lock sections (:meth:`take_held`,
            :meth:`release_held`), one section where two were.
    """

    def __init__(self, limit: int, what: str, *, lock: threading.RLock | None = None) -> None:
        if limit < 1:
            raise ValueError(f"{what}: limit must be at least 1: {limit!r}")
        self.limit = limit
        self.what = what
        self.used = 0
        """Slots taken now. Changed under the pool's lock only: by :meth:`acquire` and the
        others, or by an owner sharing the lock (see ``lock``) that counts a slot taken
        (``used += 1`` once ``used < limit``, else :meth:`refusal`) or given back in the
        same run of statements, without a call between, as it records who holds it: a
        ``KeyboardInterrupt`` is acted on only where a call returns or a function
        starts, so it finds both done or neither."""
        self.waiters = 0
        """Threads inside :meth:`acquire`'s wait: a release notifies only then."""
        self._closed: str | None = None  # why every wait ends now (see close)
        self._closed_what = what  # what the refusals name once closed (see close)
        # The lock is taken directly on the per-call paths (no Python-level Condition
        # __enter__/__exit__); the Condition over it is only for waiting.
        self._lock = threading.RLock() if lock is None else lock
        self._cond = threading.Condition(self._lock)
        #: Called (without the lock) after every release: a replica set waiting for any
        #: of several pools to free a slot listens here.
        self.listeners: list[Callable[[], None]] = []

    @property
    def free(self) -> int:
        """Slots free now."""
        with self._lock:
            return self.limit - self.used

    def acquire(self, deadline_s: float | None = None,
                held: list[bool] | None = None) -> None:
        """Take a slot: at once, or waiting up to ``deadline_s`` seconds when it is given.

        ``held``: appended to as the slot is counted taken, with no call between (see
        :attr:`used`): a caller interrupted as this returns (a ``KeyboardInterrupt``)
        finds there whether it holds a slot.

        Raises:
            SlotsTaken: naming the limit, when no slot frees in time.
            StageClosed: no slot was free and the pool was closed (:meth:`close`), before
                or while this waited.
        """
        with self._lock:
            if self.used < self.limit:
                self.used += 1
                if held is not None:
                    held.append(True)
                return
            if deadline_s is not None and deadline_s > 0 and self._closed is None:
                end = time.monotonic() + deadline_s
                self.waiters += 1
                try:
                    while self.used >= self.limit:
                        if self._closed is not None:
                            raise StageClosed(f"{self._closed_what}: {self._closed}")
                        remaining = end - time.monotonic()
                        if remaining <= 0 or not self._cond.wait(remaining):
                            if self.used < self.limit:
                                break
                            if time.monotonic() >= end:
                                break
                finally:
                    self.waiters -= 1
                if self.used < self.limit:
                    self.used += 1
                    if held is not None:
                        held.append(True)
                    return
            raise self.refusal(deadline_s)

    def take_held(self) -> None:
        """``acquire(None)`` within a section of the pool's lock (its owner's: see ``lock``).

        Raises:
            SlotsTaken: no slot is free.
            StageClosed: no slot is free and the pool was closed.
        """
        if self.used < self.limit:
            self.used += 1
            return
        raise self.refusal(None)

    def refusal(self, deadline_s: float | None) -> Exception:
        """Why no slot was taken (asked holding the lock): closed, else every slot taken.

        ``deadline_s``: how long the refused request waited (named in the refusal).
        """
        if self._closed is not None:  # nothing free: a wait would outlive its owner
            return StageClosed(f"{self._closed_what}: {self._closed}")
        return SlotsTaken(
            f"{self.what}: all {self.limit} slot(s) taken"
            + (f" for {deadline_s} s" if deadline_s else "")
            + f": {self.used}"
        )

    def close(self, why: str, *, named: str | None = None) -> None:
        """End every wait for a slot, now and later, with ``StageClosed`` naming ``why``.

        What the pool's owner calls when it closes (``Pipeline.close``): a request waiting
        for a slot up to its deadline would otherwise wait for slots that only results
        still held can free. A slot free now is still taken at once (the request then
        meets the closed stage's own refusal); releases go on as before. ``named``: what
        the refusal names instead of the pool (``pipelines[p]: closed``: the owner that
        closed, as its own refusals name it), else :attr:`what`.
        """
        with self._lock:
            self._closed = why
            if named is not None:
                self._closed_what = named
            self._cond.notify_all()

    def release(self) -> None:
        """Free one slot and wake one waiter."""
        with self._lock:
            self.release_held()
        if self.listeners:  # (no iterator made for none, the usual case)
            for listener in self.listeners:
                listener()

    def release_once(self, released: list[bool]) -> None:
        """:meth:`release`, unless ``released`` says it was given back already.

        The slot is counted free and ``released`` appended to with no call between (see
        :attr:`used`): two holders that may each give back one slot (a cancel, and the
        thread that finds the request cancelled) give it back once between them, even
        where a ``KeyboardInterrupt`` cut one of them short.
        """
        with self._lock:
            if released:
                return
            if self.used <= 0:
                raise RuntimeError(f"{self.what}: release without a matching acquire")
            self.used -= 1
            released.append(True)
            if self.waiters:
                self._cond.notify()
        if self.listeners:
            for listener in self.listeners:
                listener()

    def release_held(self) -> None:
        """Free one slot within a section of the pool's lock (its owner's: see ``lock``).

        Wakes one waiter; the :attr:`listeners` are the caller's to call, once it has let
        go of the lock.
        """
        if self.used <= 0:
            raise RuntimeError(f"{self.what}: release without a matching acquire")
        self.used -= 1
        if self.waiters:
            self._cond.notify()

    def wake_held(self) -> None:
        """Wake one waiter for a slot, within a section of the pool's lock.

        What :meth:`release_held` does after its count, for an owner that counted a slot
        given back itself (``used -= 1``: see :attr:`used`), when :attr:`waiters`.
        """
        self._cond.notify()


def take_slot(pool: SlotPool, until: float | None, held: list[bool] | None = None) -> None:
    """Take a slot of ``pool``: at once without a deadline, else waiting until ``until``.

    ``until`` is a ``time.monotonic()`` deadline (a request's ``deadline_s`` bounds the
    whole request, waiting for slots included). ``held``: see :meth:`SlotPool.acquire`.

    Raises:
        ResourceUnavailable: no deadline and no free slot.
        DeadlineExceeded: no slot freed before ``until``.
    """
    if until is None:
        pool.acquire(None, held)
        return
    left = until - time.monotonic()
    try:
        pool.acquire(left if left > 0 else None, held)
    except ResourceUnavailable as exc:
        raise DeadlineExceeded(
            f"{pool.what}: no slot free before the deadline: {max(left, 0.0):.3f} s left"
        ) from exc


class RequestTooLarge(EdgeError, ValueError):
    """A request's tensors exceed the stage's ``max_io_bytes``; nothing was sent."""


def request_bytes(inputs: Mapping[str, Any]) -> int:
    """Total tensor bytes of a request's inputs (arrays and other buffer-like values)."""
    total = 0
    for value in inputs.values():
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
        elif isinstance(value, bytes | bytearray | memoryview):
            total += len(value)
    return total


def check_request_size(stage_id: str, inputs: Mapping[str, Any], limit: int) -> None:
    """Refuse a request larger than ``limit`` bytes, naming stage, bytes and limit.

    The first code to read a request's inputs: inputs that are no mapping (``None``, a
    ``str``, a list of pairs) fail here, and that failure is refused as
    :func:`~edge_core.runtime.request_inputs.malformed_inputs` words it
    (``InvalidValue`` naming ``inputs``), asked only once reading them failed.

    Raises:
        RequestTooLarge: the inputs exceed ``limit`` bytes.
        InvalidValue: the inputs are no mapping (field ``inputs``).
    """
    try:  # nothing is checked on the way: the refusal is asked for where reading failed
        if len(inputs) == 1:  # the common one-tensor request: its size without the loop
            (value,) = inputs.values()
            nbytes = getattr(value, "nbytes", None)
            # an array's is an int exactly (no isinstance call; request_bytes sums others)
            if nbytes.__class__ is int and nbytes <= limit:
                return
        total = request_bytes(inputs)
    except (AttributeError, TypeError, ValueError):
        if refusal := malformed_inputs(inputs):
            raise refusal from None  # the inputs' fault, not the code that read them
        raise
    if total > limit:
        raise RequestTooLarge(
            f"stages[{stage_id}].max_io_bytes: a request of {total} bytes exceeds the "
            f"limit: {limit}"
        )
