"""The record of a stage's candidates tried: one entry each, and the error when none passed.

An entry says what became of one candidate backend: ``chosen`` (it serves) or
``refused``, with the layer that refused it (the vocabulary of docs/evidence.md:
``backend``, ``admission``, ``artifact``, ``worker-start``, ``runtime``, ``placement``,
``numerics``, ``memory``…) and the reason. The execution plan lists them per stage; when
every candidate of a stage was refused it raises :class:`CandidatesRefused`, listing them.
"""

from __future__ import annotations

from typing import Any

from edge_core.config.model import StageConfig
from edge_core.errors import ConfigError, EdgeError
from edge_core.evidence.status import classify_error

__all__ = ["CHOSEN", "REFUSED", "CandidatesRefused", "candidate_path", "chosen_entry",
           "refusal_entry"]

CHOSEN = "chosen"
"""The outcome of the candidate that serves."""

REFUSED = "refused"
"""The outcome of a candidate that failed a step of opening."""


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
    """The plan's record of a refused candidate: its layer (from the error class) and reason.

    A configuration problem's reason names the stage's id after its path
    (:attr:`ConfigError.located <edge_core.errors.ConfigError.located>`).
    """
    layer = classify_error([cls.__name__ for cls in type(error).__mro__]).layer
    text = error.located if isinstance(error, ConfigError) else str(error)
    return {"backend": backend, "outcome": REFUSED, "layer": layer,
            "reason": f"{type(error).__name__}: {text}"}


def chosen_entry(backend: str) -> dict[str, Any]:
    """The plan's record of the candidate that serves."""
    return {"backend": backend, "outcome": CHOSEN, "layer": None, "reason": None}


def candidate_path(index: int, stage: StageConfig, number: int) -> str:
    """Where candidate ``number`` of stage ``index`` sits in the file, for error messages.

    ``stages[i].candidates[n]`` when the stage lists candidates, else ``stages[i]``.
    """
    return f"stages[{index}].candidates[{number}]" if stage.candidates else f"stages[{index}]"
