"""A race between candidates: who is timed next, who stops, who wins — no clock, no I/O.

The measuring side asks :meth:`Race.next` which entrant to time, times one request of the
whole chain with it, and hands the cost back with :meth:`Race.record`. Entrants are timed
in rounds, one sample each, the order rotated every round so that drift on a loaded
machine falls on all of them alike. An entrant stops being timed:

- ``race``: it has at least ``min_samples`` and its lower bound is worse than the
  leader's upper bound plus the margin (``low > high_leader * (1 + margin)``);
- ``max-samples``: it has ``max_samples``;
- ``budget``: the next sample would not fit in what is left of the budget (its last
  sample's cost is the estimate). Every entrant gets its first sample whatever the
  budget says — a race cannot judge an entrant it never timed, and which one is slow is
  what it is finding out — so a slow first entrant costs one sample over the budget;
- ``failed``: a timed request failed (the measuring side stops it; it is never chosen);
- ``bound``: objective ``memory`` only — its p50's bounds already place it inside or
  outside the latency bound, so more samples would not change the answer (and one that
  reserves more than an entrant known to be inside, beyond the margin, stops: ``race``).

The race is over when no entrant is left to time, or when only one is still racing and
every other one was stopped by the race. :meth:`Race.result` then judges on the point
estimates: the best p50 (``latency``, ``throughput``: cost = seconds per request at the
pipeline's admission) or the least memory among the entrants whose p50 is within the
bound (``memory``; when none is, the fastest). A tie within the margin keeps the
earlier-listed entrant: entrants are given in order of preference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from edge_core.selection.statistics import DEFAULT_CONFIDENCE, Summary, summarize

__all__ = ["STOP_REASONS", "Entrant", "Race", "RaceResult", "RaceSettings"]

STOP_REASONS = ("race", "max-samples", "budget", "bound", "failed")
"""Why an entrant stopped being timed (see the module's docstring)."""


@attrs.frozen
class RaceSettings:
    """How a race is run: the ``[measurement]`` table's numbers and the objective."""

    objective: str = "latency"
    """``latency``, ``throughput`` (costs are seconds per request either way) or ``memory``."""
    margin: float = 0.05
    """Relative margin for stopping and for ties."""
    budget_s: float = 60.0
    """Seconds of timing the race may spend."""
    min_samples: int = 3
    """Samples before an entrant may be stopped by the race."""
    max_samples: int = 20
    """Samples at most per entrant."""
    latency_bound_s: float | None = None
    """``memory`` only: the largest p50 an entrant may have to be chosen for its memory."""
    confidence: float = DEFAULT_CONFIDENCE
    """Two-sided confidence of the bounds."""

    def __attrs_post_init__(self) -> None:
        if self.objective not in ("latency", "throughput", "memory"):
            raise ValueError(f"objective: expected latency, throughput or memory: "
                             f"{self.objective!r}")
        if self.objective == "memory" and self.latency_bound_s is None:
            raise ValueError("latency_bound_s: required with objective memory")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin: must be in [0, 1): {self.margin!r}")
        if self.min_samples < 1 or self.max_samples < self.min_samples:
            raise ValueError(f"samples: need 1 <= min_samples <= max_samples: "
                             f"{self.min_samples!r}, {self.max_samples!r}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s: must be above 0: {self.budget_s!r}")


@attrs.define
class Entrant:
    """One entrant's state: its label, memory, samples and why it stopped."""

    label: str
    """What is raced (a backend, or a combination ``a=ort-cpu,b=qnn``)."""
    memory_bytes: int = 0
    """Memory the entrant reserves (objective ``memory``)."""
    samples: list[float] = attrs.field(factory=list)
    """Costs recorded, in order."""
    stopped: str | None = None
    """One of :data:`STOP_REASONS`, or ``None`` while racing (or finished the race)."""

    def summary(self, confidence: float) -> Summary | None:
        """Figures of the samples, ``None`` before the first."""
        return summarize(self.samples, confidence) if self.samples else None


@attrs.frozen
class RaceResult:
    """The outcome: who won, on what figures, and why the others lost."""

    objective: str
    """The race's objective."""
    chosen: int
    """Index of the chosen entrant, in the order given."""
    reason: str
    """One sentence: why it was chosen."""
    entrants: tuple[dict[str, Any], ...]
    """Per entrant: ``label``, ``samples`` (count), ``p50_s``/``p95_s`` and bounds,
    ``memory_bytes``, ``stopped`` (why, or null), ``relative`` (p50 over the chosen one's,
    minus one; for ``memory``, reserved bytes likewise), ``outcome``
    (``chosen``/``slower``/``tie``/``over-bound``/``more-memory``/``unmeasured``/
    ``failed``)."""
    spent_s: float
    """Seconds of timing recorded."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready outcome."""
        return {"objective": self.objective, "chosen": self.chosen, "reason": self.reason,
                "entrants": [dict(e) for e in self.entrants], "spent_s": self.spent_s}


class Race:
    """The state of one race; see the module's docstring for the rules."""

    def __init__(self, labels: Sequence[str], settings: RaceSettings, *,
                 memory_bytes: Sequence[int] | None = None) -> None:
        """Start a race between ``labels``, in order of preference.

        Raises:
            ValueError: no entrant, or ``memory_bytes`` of another length.

        """
        if not labels:
            raise ValueError("labels: a race needs at least one entrant")
        if memory_bytes is not None and len(memory_bytes) != len(labels):
            raise ValueError("memory_bytes: one figure per entrant")
        self.settings = settings
        self.entrants = [Entrant(label, int(memory_bytes[i]) if memory_bytes else 0)
                         for i, label in enumerate(labels)]
        self.spent_s = 0.0
        self._round: list[int] = []
        self._rounds = 0

    # -- driving the race ------------------------------------------------------------------

    def racing(self) -> list[int]:
        """Indices of the entrants still being timed."""
        return [i for i, e in enumerate(self.entrants)
                if e.stopped is None and len(e.samples) < self.settings.max_samples]

    def next(self) -> int | None:
        """The entrant to time next, or ``None`` when the race is over."""
        while True:
            self._update()
            racing = self.racing()
            if not racing or self._decided(racing):
                return None
            if not self._round:
                self._start_round(racing)
            index = self._round.pop(0)
            if index not in racing:
                continue
            entrant = self.entrants[index]
            if entrant.samples and self.spent_s + entrant.samples[-1] > self.settings.budget_s:
                entrant.stopped = "budget"
                continue
            return index

    def record(self, index: int, cost: float, spent_s: float | None = None) -> None:
        """Record one sample of entrant ``index``.

        ``spent_s`` (default ``cost``) counts against the budget: the wall time the
        sample took, transfers included.

        Raises:
            ValueError: a cost that is negative or not finite.

        """
        if not math.isfinite(cost) or cost < 0:
            raise ValueError(f"cost: must be finite and >= 0: {cost!r}")
        self.entrants[index].samples.append(float(cost))
        self.spent_s += float(cost if spent_s is None else spent_s)

    def spend(self, seconds: float) -> None:
        """Count time that was no sample (a warm-up request) against the budget."""
        self.spent_s += max(0.0, float(seconds))

    def stop(self, index: int, reason: str) -> None:
        """Stop timing entrant ``index`` for ``reason`` (one of :data:`STOP_REASONS`)."""
        if reason not in STOP_REASONS:
            raise ValueError(f"reason: expected one of {', '.join(STOP_REASONS)}: {reason!r}")
        self.entrants[index].stopped = reason

    def _start_round(self, racing: list[int]) -> None:
        shift = self._rounds % len(racing)
        self._round = racing[shift:] + racing[:shift]
        self._rounds += 1

    def _decided(self, racing: list[int]) -> bool:
        """Only one left racing, every other one stopped by the race or the bound."""
        if len(racing) != 1 or self.settings.objective == "memory":
            return False
        others = [e for i, e in enumerate(self.entrants) if i != racing[0]]
        alone = self.entrants[racing[0]]
        return (len(alone.samples) >= self.settings.min_samples
                and all(e.stopped in ("race", "bound", "failed") for e in others))

    def _summaries(self) -> list[Summary | None]:
        return [e.summary(self.settings.confidence) for e in self.entrants]

    def _update(self) -> None:
        """Apply the stopping rules to every entrant that has enough samples."""
        settings = self.settings
        summaries = self._summaries()
        if settings.objective == "memory":
            bound = settings.latency_bound_s
            assert bound is not None
            for entrant, summary in zip(self.entrants, summaries, strict=True):
                if (entrant.stopped is None and summary is not None
                        and summary.n >= settings.min_samples
                        and (summary.p50_high <= bound or summary.p50_low > bound)):
                    entrant.stopped = "bound"
            inside = [e.memory_bytes for e, s in zip(self.entrants, summaries, strict=True)
                      if e.stopped == "bound" and s is not None and s.p50_high <= bound]
            if inside:  # an entrant that needs more memory than one known inside cannot win
                ceiling = min(inside) * (1.0 + settings.margin)
                for entrant in self.entrants:
                    if entrant.stopped is None and entrant.memory_bytes > ceiling:
                        entrant.stopped = "race"
            return
        leader = self._leader(summaries)
        if leader is None:
            return
        ceiling = summaries[leader].p50_high * (1.0 + settings.margin)  # type: ignore[union-attr]
        for index, (entrant, summary) in enumerate(zip(self.entrants, summaries, strict=True)):
            if (index != leader and entrant.stopped is None and summary is not None
                    and summary.n >= settings.min_samples and summary.p50_low > ceiling):
                entrant.stopped = "race"

    def _leader(self, summaries: list[Summary | None]) -> int | None:
        measured = [(s.p50, i) for i, s in enumerate(summaries)
                    if s is not None and self.entrants[i].stopped not in ("race", "failed")]
        return min(measured)[1] if measured else None

    # -- the outcome -----------------------------------------------------------------------

    def result(self) -> RaceResult:
        """Judge on what was measured (see the module's docstring)."""
        settings = self.settings
        summaries = self._summaries()
        measured = [i for i, s in enumerate(summaries)
                    if s is not None and self.entrants[i].stopped != "failed"]
        if not measured:
            chosen, reason = 0, "nothing was measured within the budget: the first serves"
        elif settings.objective == "memory":
            chosen, reason = self._by_memory(summaries, measured)
        else:
            chosen, reason = self._by_cost(summaries, measured)
        return RaceResult(objective=settings.objective, chosen=chosen, reason=reason,
                          entrants=tuple(self._entry(i, chosen, summaries)
                                         for i in range(len(self.entrants))),
                          spent_s=self.spent_s)

    def _by_cost(self, summaries: list[Summary | None], measured: list[int]) -> tuple[int, str]:
        margin = self.settings.margin
        best = min(summaries[i].p50 for i in measured)  # type: ignore[union-attr]
        chosen = next(i for i in measured
                      if summaries[i].p50 <= best * (1.0 + margin))  # type: ignore[union-attr]
        label = self.entrants[chosen].label
        what = "p50 latency" if self.settings.objective == "latency" else "seconds per request"
        if summaries[chosen].p50 > best:  # type: ignore[union-attr]
            return chosen, (f"{label}: within {margin:.0%} of the best {what}; the "
                            f"earlier-listed is kept")
        return chosen, f"{label}: the best {what}"

    def _by_memory(self, summaries: list[Summary | None],
                   measured: list[int]) -> tuple[int, str]:
        bound = self.settings.latency_bound_s
        assert bound is not None
        inside = [i for i in measured if summaries[i].p50 <= bound]  # type: ignore[union-attr]
        if not inside:
            fastest = min(measured, key=lambda i: summaries[i].p50)  # type: ignore[union-attr]
            return fastest, (f"{self.entrants[fastest].label}: no entrant is within the "
                             f"latency bound of {bound:g} s; the fastest serves")
        least = min(self.entrants[i].memory_bytes for i in inside)
        chosen = next(i for i in inside
                      if self.entrants[i].memory_bytes <= least * (1.0 + self.settings.margin))
        return chosen, (f"{self.entrants[chosen].label}: the least reserved memory within "
                        f"the latency bound of {bound:g} s")

    def _entry(self, index: int, chosen: int, summaries: list[Summary | None]) -> dict[str, Any]:
        entrant = self.entrants[index]
        summary = summaries[index]
        chosen_summary = summaries[chosen]
        entry: dict[str, Any] = {"label": entrant.label, "samples": len(entrant.samples),
                                 "memory_bytes": entrant.memory_bytes,
                                 "stopped": entrant.stopped}
        figures = summary.to_json() if summary is not None else {}
        for name in ("p50", "p95", "p50_low", "p50_high", "p95_low", "p95_high"):
            entry[f"{name}_s"] = figures.get(name)
        relative: float | None = None
        if self.settings.objective == "memory":
            base = self.entrants[chosen].memory_bytes
            relative = entrant.memory_bytes / base - 1.0 if base else None
        elif summary is not None and chosen_summary is not None and chosen_summary.p50 > 0:
            relative = summary.p50 / chosen_summary.p50 - 1.0
        entry["relative"] = relative
        entry["outcome"] = self._outcome(index, chosen, summary, relative)
        return entry

    def _outcome(self, index: int, chosen: int, summary: Summary | None,
                 relative: float | None) -> str:
        if index == chosen:
            return "chosen"
        if self.entrants[index].stopped == "failed":
            return "failed"
        if summary is None:
            return "unmeasured"
        if self.settings.objective == "memory":
            bound = self.settings.latency_bound_s
            assert bound is not None
            if summary.p50 > bound:
                return "over-bound"
            tie = relative is not None and relative <= self.settings.margin
            return "tie" if tie else "more-memory"
        if relative is not None and relative <= self.settings.margin:
            return "tie"
        return "slower"
