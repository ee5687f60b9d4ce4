"""A preview of opening: which candidate each stage would get, and why not the others.

Behind ``edge plan``; no request is served. Two ways to answer:

* :func:`plan_by_probe` — from probes and admission alone, no worker started: each
  candidate is resolved (installed, probed available, options valid) and its demands are
  reserved on the ledger and released at once; one that passes both *would be tried*
  (``would-try``), the first such is the stage's expected choice, and it stays charged
  while later stages are checked (as it would be at open). Every stage is answered, even
  after one with no candidate.
* :func:`plan_by_opening` — for real: each stage is opened on its first candidate that
  passes load, placement gate, numerics and memory (as :meth:`Pipeline.open` does), then
  everything is retired and released. Opening stops at the first
  stage with no candidate; its later stages are ``untried``.

Candidate outcomes: ``chosen`` (open), ``would-try`` (probe only), ``refused`` (with its
layer, the vocabulary of docs/evidence.md, and the reason) and ``untried``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from edge_core.config.model import PipelineConfig
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime.candidate_entries import (
    CHOSEN,
    CandidatesRefused,
    candidate_path,
    refusal_entry,
)
from edge_core.runtime.candidates import open_stage
from edge_core.runtime.linear_chain import check_linear_chain
from edge_core.runtime.opener import StageOpener
from edge_core.runtime.pipeline import Pipeline
from edge_core.runtime.stage_slot import StageSlot
from edge_core.selection.gates import GateStore
from edge_core.selection.store import DecisionStore
from edge_core.selection.workload import Workload

__all__ = ["BY_OPENING", "BY_PROBE", "UNTRIED", "WOULD_TRY", "PlanAnswer", "StageAnswer",
           "plan_by_opening", "plan_by_probe", "times_candidates"]

BY_PROBE = "probe-only"
BY_OPENING = "open"
WOULD_TRY = "would-try"
UNTRIED = "untried"


@attrs.frozen
class StageAnswer:
    """One stage: the candidate it would get (or None) and every candidate's outcome.

    Attributes:
        stage_id: the stage's id.
        choice: index of the chosen (open) or expected (probe only) candidate, or None.
        candidates: one entry per configured candidate, in order: ``candidate`` (index),
            ``backend``, ``outcome``, ``layer``, ``reason``.
    """

    stage_id: str
    choice: int | None
    candidates: tuple[Mapping[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        """The stage's JSON form."""
        chosen = self.candidates[self.choice]["backend"] if self.choice is not None else None
        return {"id": self.stage_id, "choice": self.choice, "backend": chosen,
                "candidates": [dict(c) for c in self.candidates]}


@attrs.frozen
class PlanAnswer:
    """The answer for a whole pipeline.

    Attributes:
        pipeline: the pipeline's name.
        mode: :data:`BY_PROBE` or :data:`BY_OPENING`.
        stages: one answer per stage, in data-flow order.
        plan: the execution plan while every stage was open (opening mode, all chosen).
        closed: stage id → retirement and release outcome (opening mode).
        ledger_after: the ledger's snapshot once everything was released.
    """

    pipeline: str
    mode: str
    stages: tuple[StageAnswer, ...]
    plan: Mapping[str, Any] | None = None
    closed: Mapping[str, Any] = attrs.field(factory=dict)
    ledger_after: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        """True when every stage has a candidate."""
        return all(stage.choice is not None for stage in self.stages)

    @property
    def released(self) -> bool:
        """True when nothing was left charged or quarantined after the answer."""
        return (not self.ledger_after.get("reservations")
                and all(v.get("release") in ("released", "none")
                        for v in self.closed.values()))

    def to_json(self) -> dict[str, Any]:
        """The whole answer as one JSON document."""
        return {"ok": self.ok, "pipeline": self.pipeline, "mode": self.mode,
                "stages": [s.to_json() for s in self.stages],
                "plan": dict(self.plan) if self.plan is not None else None,
                "closed": dict(self.closed), "released": self.released,
                "ledger_after": dict(self.ledger_after)}


def _entry(number: int, backend: str, outcome: str, reason: str | None = None,
           layer: str | None = None) -> dict[str, Any]:
    return {"candidate": number, "backend": backend, "outcome": outcome, "layer": layer,
            "reason": reason}


def _refused(number: int, backend: str, error: BaseException) -> dict[str, Any]:
    return {"candidate": number, **refusal_entry(backend, error)}


def plan_by_probe(config: PipelineConfig, plugins: PluginSet,
                  ledger: ResourceLedger) -> PlanAnswer:
    """Answer from probes and admission alone; no worker is started.

    Raises:
        TopologyRefused: the stages are not a linear chain (nothing is reserved).
    """
    check_linear_chain(config)
    opener = StageOpener(config, plugins, ledger)
    held: list[StageSlot] = []
    answers: list[StageAnswer] = []
    try:
        for index, stage in enumerate(config.stages):
            entries: list[dict[str, Any]] = []
            expected: list[StageSlot] | None = None
            choice: int | None = None
            for number, candidate in enumerate(stage.choices()):
                name = candidate.backend.name
                try:
                    replicas = opener.resolve(index, candidate,
                                              candidate_path(index, stage, number))
                    opener.reserve(replicas)
                    opener.release(replicas)  # never started
                except Exception as error:
                    entries.append(_refused(number, name, error))
                    continue
                entries.append(_entry(number, name, WOULD_TRY))
                if choice is None:
                    choice, expected = number, replicas
            if expected is not None:  # charged as it would be while later stages open
                opener.charge(expected)
                held.extend(expected)
            answers.append(StageAnswer(stage.id, choice, tuple(entries)))
    finally:
        opener.release(reversed(held))
    return PlanAnswer(config.name, BY_PROBE, tuple(answers), ledger_after=ledger.snapshot())


def _untried(config: PipelineConfig, index: int, why: str) -> StageAnswer:
    stage = config.stages[index]
    return StageAnswer(stage.id, None, tuple(
        _entry(n, c.backend.name, UNTRIED, why) for n, c in enumerate(stage.choices())))


def _opened(config: PipelineConfig, index: int,
            tries: Sequence[Mapping[str, Any]]) -> StageAnswer:
    stage = config.stages[index]
    entries = [{"candidate": n, **t} for n, t in enumerate(tries)]
    choice = next((e["candidate"] for e in entries if e["outcome"] == CHOSEN), None)
    for number, candidate in enumerate(stage.choices()):
        if number >= len(entries):
            entries.append(_entry(number, candidate.backend.name, UNTRIED,
                                  "an earlier candidate was chosen"))
    return StageAnswer(stage.id, choice, tuple(entries))


def times_candidates(config: PipelineConfig) -> bool:
    """True when opening ``config`` times its candidates: what a workload is read for.

    A measured selection (the default) with a choice to make: some stage lists more than
    one candidate. Otherwise each stage takes the first candidate that passes and nothing
    is timed, so an ``edge plan --input`` would be read for nothing (it is refused).
    """
    return config.selection == "measured" and any(len(s.candidates) > 1
                                                  for s in config.stages)


def plan_by_opening(config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger, *,
                    progress: Callable[[str], None] | None = None,
                    retire_deadline_s: float = 5.0, workload: Workload | None = None,
                    store: DecisionStore | None = None,
                    remeasure: bool = False) -> PlanAnswer:
    """Open every stage for real as the pipeline's selection says, then close.

    First-passing: each stage on its first candidate that passes. Measured (the default
    where a stage lists more than one candidate): every passing candidate is measured
    on ``workload`` — or the stored decision reused unless ``remeasure`` — exactly as
    :meth:`Pipeline.open` does (a ``first-ready`` pipeline is answered as if all-ready:
    with the choice it would switch to).

    Raises:
        TopologyRefused: the stages are not a linear chain (nothing is reserved).
        ConfigError: the workload cannot be read (nothing is reserved).
        Anything unexpected, after unwinding whatever was opened.
    """
    check_linear_chain(config)
    if times_candidates(config):
        return _plan_measured(attrs.evolve(config, start="all-ready"), plugins, ledger,
                              progress=progress, retire_deadline_s=retire_deadline_s,
                              workload=workload, store=store, remeasure=remeasure)
    opener = StageOpener(config, plugins, ledger, progress=progress,
                         retire_deadline_s=retire_deadline_s, gates=GateStore(),
                         reuse_gates=not remeasure)
    opened: list[StageSlot] = []
    answers: list[StageAnswer] = []
    failed: str | None = None
    try:
        for index, stage in enumerate(config.stages):
            if failed is not None:
                answers.append(_untried(config, index, f"stage {failed} has no candidate"))
                continue
            try:
                opened.extend(open_stage(opener, index))
            except CandidatesRefused:
                failed = stage.id
            except Exception as error:  # a stage without candidates: its own error
                opener.tried[stage.id] = [refusal_entry(stage.backend.name, error)]
                failed = stage.id
            answers.append(_opened(config, index, opener.tried.get(stage.id, [])))
    except BaseException:
        opener.retire(opened)
        raise
    plan = None
    if failed is None:
        pipeline = Pipeline(opener, opened)
        try:
            plan = pipeline.execution_plan()
        except BaseException:  # Ctrl-C included: closed before the caller reports it
            pipeline.close()
            raise
        closed = pipeline.close()
    else:
        opener.retire(opened)
        closed = {s.context.stage_id: {"release": s.release_outcome} for s in opened}
    opener.say("closed: every stage retired")
    return PlanAnswer(config.name, BY_OPENING, tuple(answers), plan=plan, closed=closed,
                      ledger_after=ledger.snapshot())


def _plan_measured(config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger, *,
                   progress: Callable[[str], None] | None, retire_deadline_s: float,
                   workload: Workload | None, store: DecisionStore | None,
                   remeasure: bool) -> PlanAnswer:
    """Open as :meth:`Pipeline.open` would (measuring), answer, close."""
    say = progress or (lambda _message: None)
    try:
        pipeline = Pipeline.open(config, plugins, ledger, progress=progress,
                                 retire_deadline_s=retire_deadline_s, workload=workload,
                                 store=store, remeasure=remeasure)
    except CandidatesRefused as error:
        answers: list[StageAnswer] = []
        failed: str | None = None
        for index, stage in enumerate(config.stages):
            if failed is not None:
                answers.append(_untried(config, index, f"stage {failed} has no candidate"))
                continue
            answers.append(_opened(config, index, error.tried.get(stage.id, [])))
            if stage.id == error.stage_id:
                failed = stage.id
        after = ledger.snapshot()
        held = {r["owner"].split("/", 1)[1].split("~")[0].split("#")[0]: r["state"]
                for r in after.get("reservations", [])
                if r["owner"].startswith(f"{config.name}/")}
        closed = {sid: {"release": "quarantined" if held.get(sid) == "quarantined"
                        else "released"}
                  for sid in error.tried if sid != error.stage_id}
        return PlanAnswer(config.name, BY_OPENING, tuple(answers), closed=closed,
                          ledger_after=after)
    try:
        plan = pipeline.execution_plan()
        answers = [_opened(config, index, pipeline.candidates.get(stage.id, []))
                   for index, stage in enumerate(config.stages)]
    except BaseException:  # Ctrl-C included: closed before the caller reports it
        pipeline.close()
        raise
    closed = pipeline.close()
    say("closed: every stage retired")
    return PlanAnswer(config.name, BY_OPENING, tuple(answers), plan=plan, closed=closed,
                      ledger_after=ledger.snapshot())
