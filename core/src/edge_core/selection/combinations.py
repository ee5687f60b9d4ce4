"""Which placements a measured selection times, and when a split across backends is kept.

A *placement* gives each stage one of its candidates, as a tuple of candidate indices in
data-flow order. When several stages have more than one candidate, the placements are
measured **jointly** (every combination raced against every other) while there are at
most ``joint_limit`` of them, and **greedily** otherwise: stage by stage in data-flow
order, the stage's candidates raced with the earlier stages on their chosen candidate
and the later ones on their first. The **fewest-backend** placement puts the stages on
as few distinct backends as their candidates allow (every stage on one backend where
each has a candidate on it), the earliest-listed candidates among equals; a placement on
more backends than that — a *split* — is kept only when it beats it on the objective by
more than ``split_margin``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["Figures", "Schedule", "SplitVerdict", "backends_of", "fewest_backends",
           "greedy_entrants", "joint_entrants", "judge_split", "plan_schedule"]


@attrs.frozen
class Schedule:
    """How the placements of a pipeline are measured."""

    mode: str
    """``joint``, ``greedy``, or ``none`` when no stage has a choice."""
    stages: tuple[int, ...]
    """Indices of the stages with more than one candidate, in data-flow order."""
    combinations: int
    """How many placements there are in all."""
    joint_limit: int
    """The limit the mode was chosen against."""

    def describe(self) -> str:
        """One sentence for the plan."""
        if self.mode == "none":
            return "no stage has a choice of candidates"
        if self.mode == "joint":
            return (f"{self.combinations} combinations measured jointly "
                    f"(at most {self.joint_limit})")
        return (f"{self.combinations} combinations are more than {self.joint_limit}: "
                f"measured greedily, stage by stage in data-flow order")


def plan_schedule(counts: Sequence[int], joint_limit: int) -> Schedule:
    """The schedule for stages with ``counts`` candidates each (in data-flow order).

    Raises:
        ValueError: a stage with no candidate, or a limit below 1.

    """
    if any(count < 1 for count in counts):
        raise ValueError(f"counts: every stage needs a candidate: {list(counts)}")
    if joint_limit < 1:
        raise ValueError(f"joint_limit: must be at least 1: {joint_limit!r}")
    choosing = tuple(i for i, count in enumerate(counts) if count > 1)
    total = math.prod(counts)
    if not choosing:
        mode = "none"
    elif len(choosing) == 1 or total <= joint_limit:
        mode = "joint"
    else:
        mode = "greedy"
    return Schedule(mode=mode, stages=choosing, combinations=total, joint_limit=joint_limit)


def joint_entrants(counts: Sequence[int]) -> list[tuple[int, ...]]:
    """Every placement, in order of preference (earlier stages' preference first)."""
    return list(itertools.product(*(range(count) for count in counts)))


def greedy_entrants(counts: Sequence[int], stage: int,
                    fixed: Sequence[int]) -> list[tuple[int, ...]]:
    """The placements of one greedy step: ``stage``'s candidates in order.

    The other stages are as in ``fixed`` (earlier stages' choices, later stages' first
    candidates).

    Raises:
        ValueError: ``fixed`` of another length or out of range.

    """
    if len(fixed) != len(counts) or any(not 0 <= f < c for f, c in zip(fixed, counts,
                                                                        strict=True)):
        raise ValueError(f"fixed: one candidate index per stage, in range: {list(fixed)}")
    return [tuple(candidate if i == stage else f for i, f in enumerate(fixed))
            for candidate in range(counts[stage])]


def backends_of(backends: Sequence[Sequence[str]], placement: Sequence[int]) -> list[str]:
    """The distinct backends a placement uses, in data-flow order of first use."""
    seen: dict[str, None] = {}
    for stage, index in enumerate(placement):
        seen[backends[stage][index]] = None
    return list(seen)


def fewest_backends(backends: Sequence[Sequence[str]]) -> tuple[int, ...]:
    """The placement on the fewest distinct backends; among equals, the earliest-listed.

    ``backends[s]`` lists stage ``s``'s candidates' backend names in order of preference.

    Raises:
        ValueError: a stage without candidates.

    """
    if any(not names for names in backends):
        raise ValueError("backends: every stage needs a candidate")
    every = list(dict.fromkeys(name for names in backends for name in names))
    for size in range(1, len(every) + 1):
        found = [tuple(next(i for i, name in enumerate(names) if name in subset)
                       for names in backends)
                 for subset in map(set, itertools.combinations(every, size))
                 if all(any(name in subset for name in names) for names in backends)]
        if found:
            return min(found)
    raise AssertionError("unreachable: the set of every backend covers every stage")


@attrs.frozen
class Figures:
    """What a placement measured: its cost (seconds per request) and reserved memory."""

    cost_s: float
    """p50 latency, or seconds per request at the admission (``throughput``)."""
    memory_bytes: int = 0
    """Bytes the placement reserves."""
    latency_s: float | None = None
    """``memory`` objective: the p50 latency judged against the bound (``cost_s`` if
    None)."""


@attrs.frozen
class SplitVerdict:
    """Whether a split is kept over the fewest-backend placement, and on which numbers."""

    keep: bool
    """True: the split serves; False: the fewest-backend placement does."""
    gain: float
    """How much better the split is, relatively (``0.12``: 12 % better; negative: worse)."""
    reason: str
    """One sentence with the numbers."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready verdict."""
        return {"keep": self.keep, "gain": self.gain, "reason": self.reason}


def judge_split(objective: str, split: Figures, single: Figures, margin: float,
                latency_bound_s: float | None = None) -> SplitVerdict:
    """Keep ``split`` only if it beats ``single`` on the objective by more than ``margin``.

    ``latency`` and ``throughput`` compare ``cost_s``; ``memory`` compares reserved bytes
    between placements within ``latency_bound_s`` (a split within the bound beats a
    single placement over it; neither within: the faster).
    """
    if objective == "memory":
        if latency_bound_s is None:
            raise ValueError("latency_bound_s: required with objective memory")
        split_in = _latency(split) <= latency_bound_s
        single_in = _latency(single) <= latency_bound_s
        if split_in != single_in:
            keep = split_in
            gain = 1.0 if keep else -1.0
            return SplitVerdict(keep, gain, (
                f"{'only the split' if keep else 'only the fewest-backend placement'} is "
                f"within the latency bound of {latency_bound_s:g} s"))
        if split_in:
            gain = (1.0 - split.memory_bytes / single.memory_bytes
                    if single.memory_bytes else 0.0)
            keep = gain > margin
            return SplitVerdict(keep, gain, (
                f"split reserves {split.memory_bytes} bytes, fewest-backend "
                f"{single.memory_bytes}: {_verdict(gain, margin)}"))
    gain = 1.0 - split.cost_s / single.cost_s if single.cost_s > 0 else 0.0
    keep = gain > margin
    what = "p50" if objective == "latency" else "s/request"
    return SplitVerdict(keep, gain, (
        f"split {what} {split.cost_s * 1e3:.1f} ms, fewest-backend "
        f"{single.cost_s * 1e3:.1f} ms: {_verdict(gain, margin)}"))


def _latency(figures: Figures) -> float:
    return figures.cost_s if figures.latency_s is None else figures.latency_s


def _verdict(gain: float, margin: float) -> str:
    if gain > margin:
        return f"the split is {gain:.1%} better (more than the {margin:.0%} margin): kept"
    if gain >= 0:
        return (f"the split is only {gain:.1%} better (not more than the {margin:.0%} "
                f"margin): the fewest-backend placement serves")
    return f"the split is {-gain:.1%} worse: the fewest-backend placement serves"
