"""A phase tracer for traced start-up runs: spans of a few named functions, one thread.

It uses :func:`sys.setprofile` on the calling thread and records the start and end of
every call to the functions it was given (by code object, so it sees them however a
plugin imported them). The profile hook runs on *every* call of the thread while it is
installed, which slows the traced work down: traced runs are therefore kept apart from
the uninstrumented baseline, and the profile reports both totals.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from types import FrameType, TracebackType
from typing import Any

import attrs

__all__ = ["PhaseTracer", "Span", "default_targets"]


@attrs.frozen
class Span:
    """One traced call: the phase it counts toward and its start/end (perf_counter, s)."""

    phase: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """The call's duration."""
        return self.end - self.start


def default_targets() -> dict[str, Callable[..., Any]]:
    """Phase name → function whose calls are that phase, for worker-backed stages.

    ``artifact_verification`` counts both the first verification and the check that the
    bundle is unchanged just before the worker starts. ``worker_load`` is the ``load``
    control call, or where the load went with the start (``start_worker``'s
    ``first_control``: sent once the hello is verified, the worker loading while the
    client is built, within ``worker_start``) the wait for its reply after that.
    """
    from edge_core.artifacts.bundle import VerifiedBundle
    from edge_core.artifacts.verify import verify_bundle
    from edge_core.host.bootstrap import start_worker
    from edge_core.host.client import WorkerClient

    return {
        "artifact_verification": verify_bundle,
        "artifact_verification:unchanged": VerifiedBundle.ensure_unchanged,
        "worker_start": start_worker,
        "worker_load": WorkerClient.load,
        "worker_load:sent": WorkerClient.sent_control_reply,
        "worker_warmup": WorkerClient.warmup,
    }


class PhaseTracer:
    """Record spans of the target functions called on this thread while active.

    Use as a context manager around the traced work; nested tracers are not supported
    (a profile function already installed is restored on exit).

    Args:
        targets: phase name → function; a name after ``:`` is dropped when reporting
            (``artifact_verification:unchanged`` counts as ``artifact_verification``).
    """

    def __init__(self, targets: Mapping[str, Callable[..., Any]]) -> None:
        self._codes: dict[Any, str] = {}
        for name, function in targets.items():
            code = getattr(function, "__code__", None)
            if code is None:
                raise TypeError(f"targets[{name!r}]: has no code object: {function!r}")
            self._codes[code] = name.partition(":")[0]
        self._open: dict[int, tuple[str, float]] = {}
        self.spans: list[Span] = []
        self._previous: Any = None

    def _hook(self, frame: FrameType, event: str, _arg: object) -> None:
        if event == "call":
            phase = self._codes.get(frame.f_code)
            if phase is not None:
                self._open[id(frame)] = (phase, time.perf_counter())
        elif event == "return" and frame.f_code in self._codes:
            started = self._open.pop(id(frame), None)
            if started is not None:
                self.spans.append(Span(started[0], started[1], time.perf_counter()))

    def __enter__(self) -> PhaseTracer:
        self._previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        sys.setprofile(self._previous)
        self._open.clear()

    def between(self, start: float, end: float) -> dict[str, float]:
        """Phase → summed seconds of the spans that started within ``[start, end)``."""
        totals: dict[str, float] = {}
        for span in self.spans:
            if start <= span.start < end:
                totals[span.phase] = totals.get(span.phase, 0.0) + span.seconds
        return totals
