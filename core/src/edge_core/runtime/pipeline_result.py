"""What a pipeline request gives back: the final result, acknowledged once."""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edge_core.runtime.chain import GatheredResult
from edge_core.runtime.results import AckOutcome, StageResult

__all__ = ["PipelineResult", "Release", "start_unacknowledged_drain"]

#: What gives back a request's slots, once (``left``: see :class:`PipelineResult`).
Release = Callable[[list[bool]], None]

# Results dropped unacknowledged: (final, release, left), acknowledged by the drain
# thread. A SimpleQueue's put is safe from a finalizer that runs inside a garbage
# collection, wherever it interrupts (a lock the acknowledgement takes may be held there).
_DROPPED: queue.SimpleQueue[tuple[StageResult | GatheredResult, Release, list[bool]]] = (
    queue.SimpleQueue())
_DRAIN_LOCK = threading.Lock()
_drain: list[threading.Thread] = []


def start_unacknowledged_drain() -> None:
    """Start, once per process, the thread that acknowledges results dropped unacknowledged.

    Called when a pipeline opens (not from a finalizer, where starting a thread is unsafe).
    """
    with _DRAIN_LOCK:
        if not _drain:
            thread = threading.Thread(target=_acknowledge_dropped, daemon=True,
                                      name="edge-unacknowledged")
            thread.start()
            _drain.append(thread)


def _acknowledge_dropped() -> None:
    """Acknowledge each result that was garbage-collected unacknowledged, with a warning."""
    while True:
        final, release, left = _DROPPED.get()
        rid = getattr(getattr(final, "key", None), "request_id", "?")
        note = "acknowledged now (use `with` or call ack())"
        try:
            try:
                final.ack()
            finally:
                release(left)
        except Exception as exc:  # this thread must live on: said in the warning
            note = f"its acknowledgement failed: {type(exc).__name__}: {exc}"
        warnings.warn(f"request[{rid}]: a result was garbage-collected without ack(): {note}",
                      ResourceWarning, stacklevel=1)
        del final, release, left



class PipelineResult:
    """The final stage's result plus each stage's latency; acknowledge it (or use ``with``).

    Acknowledging frees the final stage's slot and the pipeline's admission slot (and the
    hold on the placement it ran on). A result garbage-collected without an
    acknowledgement is acknowledged then, by a thread of its own (soon after, not at
    once), with a ``ResourceWarning``: a bug to fix, never a way to release.

    ``release(left)`` gives the request's slots back once: it counts them given back and
    appends to ``left`` (this result's own list) in one run of statements without a call,
    where a ``KeyboardInterrupt`` cannot act, and gives nothing back when ``left`` is set
    already (the pipeline's ``_leave_once``). ``left`` set is the acknowledgement's
    mark: an :meth:`ack` cut short by a Ctrl-C before it leaves the result unacknowledged
    (acknowledged again, or by the drain once dropped); one cut short after it, in the
    rest of the release (the waiters' wake-up), runs the release again to its end.
    ``placement`` is the request's placement receipt: given as it is, or as ``receipt``,
    which builds it when it is first read (a request
    whose receipt nobody reads does not build it).
    """

    __slots__ = ("_left", "_placement", "_receipt", "_release", "final", "latencies",
                 "outputs")

    def __init__(self, final: StageResult | GatheredResult, latencies: dict[str, float],
                 release: Release,
                 placement: Sequence[Mapping[str, Any]] = (),
                 receipt: Callable[[], Sequence[Mapping[str, Any]]] | None = None) -> None:
        # (receipt may be given by position: a class called with a keyword argument
        # costs a dict of them per call, about half of what the rest of the call costs)
        self.final = final
        self.outputs: dict[str, Any] = final.outputs
        """The final stage's outputs (its result's own dict: an attribute, read per call)."""
        self.latencies = latencies  # its maker's own dict, handed over
        self._placement: list[dict[str, Any]] | None = (
            None if receipt is not None else [dict(stage) for stage in placement])
        self._receipt = receipt
        self._release = release
        self._left: list[bool] = []  # (set last: see made)

    @property
    def made(self) -> bool:
        """Whether :meth:`__init__` ran to its end (it sets ``_left`` last).

        From then on this result holds the request's slots: given back by :meth:`ack`,
        or by the drain once it is dropped.
        """
        try:
            return self._left is not None  # set last: unset while __init__ had not ended
        except AttributeError:
            return False

    @property
    def placement(self) -> list[dict[str, Any]]:
        """The placement receipt (:meth:`~edge_core.runtime.serving_lineup.Serving.receipt`).

        Per stage the backend and execution provider that served this request, its
        candidate, the worker generation and where the decision came from.
        """
        if self._placement is None:
            assert self._receipt is not None  # one of the two is always given
            self._placement = [dict(stage) for stage in self._receipt()]
        return self._placement

    def ack(self) -> AckOutcome:
        """Acknowledge the final result; stale the second time."""
        outcome = self.final.ack()
        left = self._left
        if not left:  # once, even when the stage ack is stale (after a restart)
            try:
                self._release(left)
            except BaseException:  # cut short (a Ctrl-C): run again to its end, then raised
                self._release(left)  # (nothing given back twice: see the class's doc)
                raise
        return outcome

    def __del__(self) -> None:
        # AttributeError, TypeError: the interpreter is shutting down, this module's names
        # gone (contextlib's too, hence no suppress): nothing is served any more; or this
        # result was made half-way (a KeyboardInterrupt acted on as __init__ began, before
        # _left, set last, was set): it took nothing; raising here would only be reported
        try:
            if not self._left:  # dropped unacknowledged: its slots would be held for good
                _DROPPED.put((self.final, self._release, self._left))
        except (AttributeError, TypeError):
            pass

    def __enter__(self) -> PipelineResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ack()
