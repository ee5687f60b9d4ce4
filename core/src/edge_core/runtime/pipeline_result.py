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
    hold on the placement it ran on). ``placement`` is the request's placement receipt:
    given as it is, or as ``receipt``, which builds it when it is first read (a request
    whose receipt nobody reads does not build it).
    """

    __slots__ = ("_acked", "_placement", "_receipt", "_release", "final", "latencies")

    def __init__(self, final: StageResult | GatheredResult, latencies: Mapping[str, float],
                 release: Callable[[], None],
                 placement: Sequence[Mapping[str, Any]] = (), *,
                 receipt: Callable[[], Sequence[Mapping[str, Any]]] | None = None) -> None:
        self.final = final
        self.latencies = dict(latencies)
        self._placement: list[dict[str, Any]] | None = (
            None if receipt is not None else [dict(stage) for stage in placement])
        self._receipt = receipt
        self._release = release
        self._acked = False

    @property
    def placement(self) -> list[dict[str, Any]]:
        """The placement receipt (:meth:`~edge_core.runtime.serving_lineup.Serving.receipt`).

        Per stage the backend and execution provider that served this request, its
        candidate, the worker generation and where the decision came from.
        """
        if self._placement is None:
            assert self._receipt is not None  # one of the two is always given
            self._placement = [dict(stage) for stage in self._receipt()]
        return self._placement

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
