"""The linear-chain check: the runtime serves linear chains, and says why it refuses others."""

from __future__ import annotations

from edge_core.config.model import PipelineConfig
from edge_core.runtime.errors import TopologyRefused

__all__ = ["PIPELINE_INPUT", "check_linear_chain", "linear_chain_problems"]

#: The name a stage uses in ``inputs_from`` for the pipeline's own input.
PIPELINE_INPUT = "input"


def check_linear_chain(config: PipelineConfig) -> None:
    """Refuse anything but a chain: stage *i* reads exactly stage *i-1* (stage 0: the input).

    Runs before anything is reserved. Fan-out (two stages reading one), joins (a stage
    reading several) and several final outputs (two stages nobody reads) are each named.

    Raises:
        TopologyRefused: with the offending stage's path (the first of
            :func:`linear_chain_problems`).
    """
    problems = linear_chain_problems(config)
    if problems:
        raise problems[0]


def linear_chain_problems(config: PipelineConfig) -> list[TopologyRefused]:
    """Every reason ``config`` is not a linear chain, each with its stage's path.

    Each stage's own ``inputs_from`` is checked first (an unknown stage, the stage itself,
    a join), every stage's problem listed; only a file without those is checked as a
    whole (fan-out, several final outputs, data-flow order), and the first such problem
    is the one listed. Empty for a linear chain.
    """
    ids = [stage.id for stage in config.stages]
    sources: list[tuple[str, ...]] = []
    problems: list[TopologyRefused] = []
    for index, stage in enumerate(config.stages):
        default = (PIPELINE_INPUT,) if index == 0 else (ids[index - 1],)
        wanted = tuple(stage.inputs_from) or default
        path = f"stages[{index}].inputs_from"
        for source in wanted:
            if source != PIPELINE_INPUT and source not in ids:
                problems.append(TopologyRefused(path, f"no such stage (stages: {ids})", source,
                                                stage=stage.id))
            elif source == stage.id:
                problems.append(TopologyRefused(path, "a stage cannot read its own outputs",
                                                source, stage=stage.id))
        if len(wanted) > 1:
            problems.append(TopologyRefused(
                path, "joins are not supported: a stage reads one source", list(wanted),
                stage=stage.id))
        sources.append(wanted)
    if problems:
        return problems
    readers: dict[str, list[str]] = {}
    for stage_id, wanted in zip(ids, sources, strict=True):
        readers.setdefault(wanted[0], []).append(stage_id)
    for source, who in readers.items():
        if len(who) > 1:
            index = ids.index(who[1])
            return [TopologyRefused(
                f"stages[{index}].inputs_from",
                f"fan-out is not supported: {source!r} is read by {who}", source,
                stage=who[1],
            )]
    finals = [stage_id for stage_id in ids if stage_id not in readers]
    if len(finals) > 1:
        return [TopologyRefused("stages", "several final outputs are not supported", finals)]
    for index, wanted in enumerate(sources):
        expected = PIPELINE_INPUT if index == 0 else ids[index - 1]
        if wanted[0] != expected:
            return [TopologyRefused(
                f"stages[{index}].inputs_from",
                f"stages must be listed in data-flow order (expected {expected!r})", wanted[0],
                stage=ids[index],
            )]
    return []
