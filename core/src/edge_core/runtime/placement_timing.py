"""Timing placements inside the whole chain: held candidates, lineups and the race's driver.

A :class:`Held` is one candidate of one stage, opened and gated (its replicas' stage
slots); :func:`open_held` opens one through the
:class:`~edge_core.runtime.opener.StageOpener`'s steps, tagging its ledger owner so that
it may be held beside another candidate of its stage. A :class:`Lineup` is one
placement — a held candidate per stage — as the chain runs it: a replica set and the
input transform per stage. :func:`time_serial` times one request through a lineup, from
the first stage's submission to the acknowledged result, so transfers, copies and
conversions between stages are inside the figure; :func:`time_overlapped` keeps several
requests in flight and gives seconds per request. :func:`run_race` drives a
:class:`~edge_core.selection.racing.Race` between lineups.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from edge_core.config.model import StageConfig
from edge_core.runtime.bundle_folders import BundleFolders
from edge_core.runtime.chain import Transform, run_chain, with_bundles
from edge_core.runtime.opener import StageOpener
from edge_core.runtime.replicas import ReplicaSet
from edge_core.runtime.stage_slot import StageSlot
from edge_core.selection.racing import Race, RaceResult, RaceSettings

__all__ = ["MEASURE_BOUND_S", "Held", "Lineup", "RaceRun", "open_held", "race_settings",
           "run_race", "time_overlapped", "time_serial"]

MEASURE_BOUND_S = 600.0
"""Bound on one timed request, waiting for stage slots included (a stage call is also
bounded by its own ``call_timeout_s``)."""


@attrs.define(eq=False)
class Held:
    """One candidate of one stage, opened and gated."""

    index: int
    """The stage's index."""
    number: int
    """The candidate's number in the stage's list (0 for a stage without candidates)."""
    slots: list[StageSlot]
    """Its replicas."""
    open_s: float
    """Seconds from resolution to the end of the gate."""
    group: ReplicaSet | None = None
    """Its replica set, made on first use."""

    @property
    def backend(self) -> str:
        """The candidate's backend name."""
        return self.slots[0].binding.backend.name

    @property
    def stage_id(self) -> str:
        """The stage's id."""
        return self.slots[0].context.stage_id

    @property
    def memory_bytes(self) -> int:
        """Bytes its replicas reserve, every pool together."""
        return sum(int(n) for slot in self.slots for n in slot.demands.values())

    def replicas(self) -> ReplicaSet:
        """Its replica set (the same one for every lineup it is part of)."""
        if self.group is None:
            self.group = ReplicaSet([s.runtime for s in self.slots if s.runtime is not None])
        return self.group

    def gate(self) -> dict[str, Any]:
        """What its gate found (replica 0): provider split, numerics, memory check."""
        slot = self.slots[0]
        warmup = slot.warmup
        return {"placement": warmup.placement.to_json() if warmup is not None else None,
                "numerics": dict(warmup.numerics) if warmup is not None and warmup.numerics
                is not None else None,
                "memory_check": dict(slot.memory_check), "passed": True}

    def provider(self) -> str | None:
        """The execution provider its gate placed the graph on (replica 0)."""
        warmup = self.slots[0].warmup
        return warmup.placement.target if warmup is not None else None


def open_held(opener: StageOpener, index: int, number: int, choice: StageConfig,
              path: str, *, tag: bool) -> Held:
    """Open candidate ``number`` of stage ``index``: resolved, reserved, started, gated.

    With ``tag`` (another candidate of the stage is held) its ledger owners carry
    ``~number``, so that both hold a reservation of their own. On any failure what was
    started is retired, every reservation settled, and the error raised.
    """
    started = time.perf_counter()
    slots: list[StageSlot] = []
    try:
        slots = opener.resolve(index, choice, path)
        for slot in slots:
            slot.candidate = number
            slot.candidate_tag = f"~{number}" if tag else ""
        opener.reserve(slots)
        opener.start_all(slots)
    except BaseException:
        opener.unwind([s for s in slots if s.runtime is not None], slots)
        raise
    return Held(index=index, number=number, slots=slots, open_s=time.perf_counter() - started)


class Lineup:
    """One placement as the chain runs it: a held candidate per stage, in data-flow order."""

    def __init__(self, held: Sequence[Held]) -> None:
        """Build the lineup of ``held`` (one per stage)."""
        self.held = list(held)
        self.groups = [h.replicas() for h in self.held]
        self.transforms: list[Transform | None] = [
            with_bundles(h.slots[0].transform, self.bundle_directories) for h in self.held]

    @property
    def slots(self) -> list[StageSlot]:
        """Every replica of every stage, in data-flow order."""
        return [slot for h in self.held for slot in h.slots]

    @property
    def memory_bytes(self) -> int:
        """Bytes the whole placement reserves."""
        return sum(h.memory_bytes for h in self.held)

    def bundle_directories(self) -> BundleFolders:
        """Stage id → the folder of the verified bundle its worker loaded (or None).

        Its bytes as loaded: a folder verified in place is checked when looked up
        (:mod:`~edge_core.runtime.bundle_folders`).
        """
        return BundleFolders({h.stage_id: h.slots[0].runtime.loaded
                              if h.slots[0].runtime is not None else None for h in self.held})

    def label(self, stages: Sequence[int] | None = None) -> str:
        """``b=ort-cpu`` for the given stages (default: every stage with a choice)."""
        shown = range(len(self.held)) if stages is None else stages
        return ", ".join(f"{self.held[i].stage_id}={candidate_label(self.held[i])}"
                         for i in shown)


def candidate_label(held: Held) -> str:
    """A candidate's name in figures: its backend and number (``ort-cpu[1]``)."""
    return f"{held.backend}[{held.number}]"


def time_serial(lineup: Lineup, inputs: Mapping[str, Any], where: str,
                params: Mapping[str, Any] | None = None) -> float:
    """Seconds one request takes through ``lineup``: the chain run, the result acknowledged.

    Raises:
        Whatever the request raised (a stage's typed error).
    """
    until = time.monotonic() + MEASURE_BOUND_S
    started = time.perf_counter()
    pending, _, _, _ = run_chain(lineup.groups, lineup.transforms, inputs, params=params,
                              until=until, cancelled=lambda: False, where=where)
    try:
        pending.result().ack()
    finally:
        pending.close()
    return time.perf_counter() - started


def time_overlapped(lineup: Lineup, inputs: Sequence[Mapping[str, Any]], where: str,
                    concurrency: int, requests: int,
                    params: Mapping[str, Any] | None = None) -> float:
    """Seconds per request with ``concurrency`` requests in flight, over ``requests`` in all.

    Raises:
        The first error a request raised (after every caller has ended).
    """
    counter = iter(range(requests))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def caller() -> None:
        while True:
            with lock:
                number = next(counter, None)
            if number is None or errors:
                return
            try:
                time_serial(lineup, inputs[number % len(inputs)], where, params)
            except BaseException as error:
                errors.append(error)
                return

    threads = [threading.Thread(target=caller, name=f"edge-measure-{i}")
               for i in range(max(1, concurrency))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return (time.perf_counter() - started) / max(1, requests)


def race_settings(measurement: Any, objective: str, *, margin: float | None = None
                  ) -> RaceSettings:
    """The race's settings from a pipeline's ``[measurement]`` table and objective."""
    return RaceSettings(objective=objective,
                        margin=measurement.margin if margin is None else margin,
                        budget_s=measurement.budget_s, min_samples=measurement.min_samples,
                        max_samples=measurement.max_samples,
                        latency_bound_s=measurement.latency_bound_s)


@attrs.frozen
class RaceRun:
    """A race that was run: its lineups' placements, its result and each failure."""

    placements: tuple[tuple[int, ...], ...]
    """Each entrant's placement (indices into the stages' held candidates)."""
    result: RaceResult
    """Who won and the figures."""
    failures: Mapping[int, str]
    """Entrant index → why its request failed."""

    def to_json(self, names: Callable[[tuple[int, ...]], dict[str, int]]) -> dict[str, Any]:
        """JSON-ready: each entrant with its placement as stage id → candidate number."""
        document = self.result.to_json()
        for index, entry in enumerate(document["entrants"]):
            entry["placement"] = names(self.placements[index])
            if index in self.failures:
                entry["failure"] = self.failures[index]
        return document


def run_race(lineups: Sequence[Lineup], placements: Sequence[tuple[int, ...]],
             labels: Sequence[str], settings: RaceSettings,
             workload: Sequence[Mapping[str, Any]], *, where: str, warmup_calls: int,
             concurrency: int = 1, say: Callable[[str], None] | None = None,
             params: Mapping[str, Any] | None = None,
             stop: Callable[[], bool] | None = None) -> RaceRun:
    """Race ``lineups`` (one per placement) on ``workload`` until the race is over.

    Requests take the workload's inputs in turn.
    Each entrant gets ``warmup_calls`` untimed requests before its first timed one (their
    time counts against the budget). A sample is one request (``latency``, ``memory``) or
    ``2 x concurrency`` overlapped requests (``throughput``: seconds per request). A
    request that fails stops its entrant (``failed``). ``stop()`` true ends the race
    early (the pipeline is closing).
    """
    race = Race(labels, settings, memory_bytes=[lineup.memory_bytes for lineup in lineups])
    warmed: set[int] = set()
    turn = 0
    failures: dict[int, str] = {}
    while (index := race.next()) is not None:
        if stop is not None and stop():
            break
        lineup = lineups[index]
        try:
            if index not in warmed:
                for _ in range(warmup_calls):
                    race.spend(time_serial(lineup, workload[turn % len(workload)], where,
                                           params))
                warmed.add(index)
            started = time.perf_counter()
            if settings.objective == "throughput":
                requests = 2 * max(1, concurrency)
                cost = time_overlapped(lineup, [workload[(turn + i) % len(workload)]
                                                for i in range(requests)],
                                       where, concurrency, requests, params)
            else:
                cost = time_serial(lineup, workload[turn % len(workload)], where, params)
            race.record(index, cost, time.perf_counter() - started)
        except Exception as error:
            failures[index] = f"{type(error).__name__}: {error}"
            race.stop(index, "failed")
            if say is not None:
                say(f"measuring {labels[index]} failed: {failures[index]}")
        turn += 1
    return RaceRun(placements=tuple(tuple(p) for p in placements), result=race.result(),
                   failures=dict(failures))
