"""What a pipeline request gives back: the final result, acknowledged once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edge_core.runtime.chain import GatheredResult
from edge_core.runtime.results import AckOutcome, StageResult

__all__ = ["PipelineResult"]


class PipelineResult:
    """The final stage's result plus each stage's latency; acknowledge it (or use ``with``).

    Acknowledging frees the final stage's slot and the pipeline's admission slot (and the
    hold on the placement it ran on). ``placement`` is the request's placement receipt.
    """

    def __init__(self, final: StageResult | GatheredResult, latencies: Mapping[str, float],
                 release: Callable[[], None],
                 placement: Sequence[Mapping[str, Any]] = ()) -> None:
        self.final = final
        self.latencies = dict(latencies)
        self.placement = [dict(stage) for stage in placement]
        """The placement receipt: per stage the backend and execution provider that served
        this request, its candidate, the worker generation and where the decision came
        from (:meth:`edge_core.runtime.serving_lineup.Serving.receipt`)."""
        self._release = release
        self._acked = False

    @property
    def outputs(self) -> dict[str, Any]:
        """The final stage's outputs."""
        return self.final.outputs

    def ack(self) -> AckOutcome:
        """Acknowledge the final result; stale the second time."""
        outcome = self.final.ack()
        if not self._acked:  # once, even when the stage ack is stale (after a restart)
            self._acked = True
            self._release()
        return outcome

    def __enter__(self) -> PipelineResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ack()
