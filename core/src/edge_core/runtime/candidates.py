"""Candidate backends of a stage: tried in order of preference, the first that passes serves.

A stage that lists ``candidates`` is opened one candidate at a time: probe → reserve →
load → warm-up placement gate → numerical and memory checks. A candidate refused at any
step is recorded with its layer (the vocabulary of docs/evidence.md: ``backend``,
``admission``, ``artifact``, ``worker-start``, ``runtime``, ``placement``, ``numerics``,
``memory``…) and reason; its workers are retired and its reservation settled (released
after verified retirement, else quarantined) before the next candidate is reserved, so
the ledger never holds two candidates of one stage at once. When every candidate is
refused the stage raises :class:`CandidatesRefused`, listing every refusal.

A stage without candidates is the one-candidate case, except that its error is raised
as it is (never wrapped), so the single-backend form behaves exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge_core.config.model import StageConfig
from edge_core.errors import EdgeError
from edge_core.evidence.status import classify_error
from edge_core.runtime.topology import check_linear_chain
from edge_core.stage import LoadedStage

if TYPE_CHECKING:
    from edge_core.runtime.pipeline import Pipeline, _Stage

__all__ = ["CHOSEN", "CandidatesRefused", "chosen_entry", "open_stage", "open_stages",
           "refusal_entry", "reload_in_order"]

CHOSEN = "chosen"
REFUSED = "refused"


class CandidatesRefused(EdgeError):
    """Every candidate of a stage was refused; ``refusals`` lists each, in the order tried."""

    def __init__(self, stage_id: str, refusals: list[dict[str, Any]]) -> None:
        self.stage_id = stage_id
        self.refusals = [dict(r) for r in refusals]
        self.tried: dict[str, list[dict[str, Any]]] = {stage_id: self.refusals}
        """Stage id → the candidates tried for every stage opened so far, this one last."""
        listed = "; ".join(f"{r['backend']} refused at {r['layer']}: {r['reason']}"
                           for r in refusals)
        super().__init__(f"stages[{stage_id}].candidates: every candidate was refused: "
                         f"{listed}")


def refusal_entry(backend: str, error: BaseException) -> dict[str, Any]:
    """The plan's record of a refused candidate: its layer (from the error class) and reason."""
    layer = classify_error([cls.__name__ for cls in type(error).__mro__]).layer
    return {"backend": backend, "outcome": REFUSED, "layer": layer,
            "reason": f"{type(error).__name__}: {error}"}


def chosen_entry(backend: str) -> dict[str, Any]:
    """The plan's record of the candidate that serves."""
    return {"backend": backend, "outcome": CHOSEN, "layer": None, "reason": None}


def _path(index: int, stage: StageConfig, number: int) -> str:
    return f"stages[{index}].candidates[{number}]" if stage.candidates else f"stages[{index}]"


def open_stage(pipeline: Pipeline, index: int, say: Callable[[str], None],
               retire_deadline_s: float) -> list[_Stage]:
    """Open stage ``index`` on its first candidate that passes; its replicas, gated.

    Records every try in ``pipeline.candidates[stage id]``.

    Raises:
        CandidatesRefused: every candidate was refused (nothing of this stage is left
            running or charged).
        The stage's own error, unchanged, when it lists no candidates.
    """
    from edge_core.runtime.pipeline import _owner

    stage_config = pipeline.config.stages[index]
    tries: list[dict[str, Any]] = []
    pipeline.candidates[stage_config.id] = tries
    for number, choice in enumerate(stage_config.choices()):
        replicas: list[_Stage] = []
        try:
            replicas = pipeline._resolve(pipeline.config, index, pipeline.plugins,
                                         choice, _path(index, stage_config, number))
            plan = {}
            for replica in replicas:
                replica.demands = dict(replica.binding.reserve(replica.context))
                plan[_owner(replica)] = replica.demands
            tokens = pipeline.ledger.reserve_plan(plan)
            for replica in replicas:
                replica.token = tokens[_owner(replica)]
            for replica in replicas:
                pipeline._start(replica, say, retire_deadline_s)
        except BaseException as error:
            pipeline._unwind([r for r in replicas if r.runtime is not None], replicas)
            if not stage_config.candidates or not isinstance(error, Exception):
                raise
            tries.append(refusal_entry(choice.backend.name, error))
            say(f"stage {stage_config.id}: candidate {choice.backend.name} refused "
                f"at {tries[-1]['layer']}")
            continue
        tries.append(chosen_entry(choice.backend.name))
        return replicas
    raise CandidatesRefused(stage_config.id, tries)


def open_stages(pipeline: Pipeline, say: Callable[[str], None],
                retire_deadline_s: float) -> list[_Stage]:
    """Open every stage in data-flow order, each on its first candidate that passes.

    Stages are reserved one after another (each candidate's replicas at once), so an
    earlier stage's preferred candidate is charged before a later stage's is tried.

    Raises:
        TopologyRefused: the stages are not a linear chain (before anything is reserved).
        CandidatesRefused: some stage had no candidate pass; every stage opened so far is
            retired and its reservation settled.
    """
    check_linear_chain(pipeline.config)
    stages: list[_Stage] = []
    try:
        for index in range(len(pipeline.config.stages)):
            stages.extend(open_stage(pipeline, index, say, retire_deadline_s))
    except BaseException as error:
        pipeline._unwind(stages, stages)
        if isinstance(error, CandidatesRefused):
            error.tried = {sid: [dict(t) for t in tries]
                           for sid, tries in pipeline.candidates.items()}
        raise
    return stages


def reload_in_order(pipeline: Pipeline, stage: _Stage, generation: int) -> LoadedStage:
    """Restart one replica, retrying its stage's candidates in order of preference.

    The replica switches to the first candidate that passes the whole gate (its runtime
    then calls that candidate's backend). A stage without candidates reloads as before.

    Raises:
        CandidatesRefused: every candidate was refused; nothing is left charged.
    """
    original = pipeline.config.stage(stage.context.stage_id)
    if not original.candidates:
        return pipeline._reload(stage, generation)
    index = pipeline.config.stages.index(original)
    runtime = stage.runtime
    tries: list[dict[str, Any]] = []
    for number, choice in enumerate(original.choices()):
        try:
            fresh = pipeline._resolve(pipeline.config, index, pipeline.plugins, choice,
                                      _path(index, original, number))[stage.context.replica]
            stage.config, stage.binding, stage.transform = (fresh.config, fresh.binding,
                                                            fresh.transform)
            stage.context = fresh.context
            stage.demands = dict(fresh.binding.reserve(fresh.context))
            if runtime is not None:
                runtime.binding = fresh.binding
            loaded = pipeline._reload(stage, generation)
        except Exception as error:
            tries.append(refusal_entry(choice.backend.name, error))
            continue
        if runtime is not None:
            runtime.context = stage.context
        tries.append(chosen_entry(choice.backend.name))
        pipeline.candidates[original.id] = tries
        return loaded
    pipeline.candidates[original.id] = tries
    raise CandidatesRefused(original.id, tries)
