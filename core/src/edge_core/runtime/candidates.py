"""Candidate backends of a stage, ``selection = "first-passing"``: the first that passes serves.

A stage that lists ``candidates`` is opened one candidate at a time
(:meth:`StageOpener.open_candidate <edge_core.runtime.opener.StageOpener.open_candidate>`):
probe → reserve → load → warm-up placement gate → numerical and memory checks. A
candidate refused at any step is recorded with its layer and reason
(:mod:`edge_core.runtime.candidate_entries`); its workers are retired and its reservation
settled (released after verified retirement, else quarantined) before the next candidate
is reserved, so a first-passing open never holds two candidates of one stage at once.
(A measured selection or a first-ready start may, each candidate under its own ledger
owner and only when the ledger admits both: :mod:`edge_core.runtime.selection_policy`.)
When every candidate is refused the stage raises :class:`CandidatesRefused`, listing
every refusal.
A restart retries the candidates in the same order
(:meth:`StageOpener.reload <edge_core.runtime.opener.StageOpener.reload>`).

A stage without candidates is the one-candidate case, except that its error is raised
as it is (never wrapped), so the single-backend form behaves exactly as before.
"""

from __future__ import annotations

from typing import Any

from edge_core.runtime.candidate_entries import (
    CandidatesRefused,
    candidate_path,
    chosen_entry,
    refusal_entry,
)
from edge_core.runtime.linear_chain import check_linear_chain
from edge_core.runtime.opener import StageOpener
from edge_core.runtime.stage_slot import StageSlot

__all__ = ["open_stage", "open_stages"]


def open_stage(opener: StageOpener, index: int) -> list[StageSlot]:
    """Open stage ``index`` on its first candidate that passes; its replicas, gated.

    Records every try in ``opener.tried[stage id]``.

    Raises:
        CandidatesRefused: every candidate was refused (nothing of this stage is left
            running or charged).
        The stage's own error, unchanged, when it lists no candidates.
    """
    stage_config = opener.config.stages[index]
    tries: list[dict[str, Any]] = []
    opener.tried[stage_config.id] = tries
    for number, choice in enumerate(stage_config.choices()):
        try:
            replicas = opener.open_candidate(index, choice,
                                             candidate_path(index, stage_config, number))
        except BaseException as error:
            if not stage_config.candidates or not isinstance(error, Exception):
                raise
            tries.append(refusal_entry(choice.backend.name, error))
            opener.say(f"stage {stage_config.id}: candidate {choice.backend.name} refused "
                       f"at {tries[-1]['layer']}")
            continue
        tries.append(chosen_entry(choice.backend.name))
        for replica in replicas:
            replica.candidate = number
        return replicas
    raise CandidatesRefused(stage_config.id, tries)


def open_stages(opener: StageOpener) -> list[StageSlot]:
    """Open every stage in data-flow order, each on its first candidate that passes.

    Stages are reserved one after another (each candidate's replicas at once), so an
    earlier stage's preferred candidate is charged before a later stage's is tried.

    Raises:
        TopologyRefused: the stages are not a linear chain (before anything is reserved).
        CandidatesRefused: some stage had no candidate pass; every stage opened so far is
            retired and its reservation settled.
    """
    check_linear_chain(opener.config)
    stages: list[StageSlot] = []
    try:
        for index in range(len(opener.config.stages)):
            stages.extend(open_stage(opener, index))
    except BaseException as error:
        opener.retire(stages)
        if isinstance(error, CandidatesRefused):
            error.tried = {sid: [dict(t) for t in tries] for sid, tries in opener.tried.items()}
        raise
    return stages
