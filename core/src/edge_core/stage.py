"""What a backend plugin sees of a stage, and what it hands back after loading one.

The runtime resolves a stage's configuration into a :class:`StageContext` before it calls
the owning plugin's lifecycle hooks, so plugins never parse pipeline files. ``edge_load``
returns an object satisfying :class:`LoadedStage`; the runtime passes that same object to
the stage's later hooks (warm-up, call, cancel, retire).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from edge_core.placement import PlacementPolicy

__all__ = ["FAILED_STAGE_ATTR", "RETIRE_OUTCOME_ATTR", "LoadedStage", "RetainedOutputs",
           "StageContext"]

#: The attribute a load error carries when the plugin retired the stage's worker while
#: failing: the retire outcome, which decides the reservation's fate (released when the
#: worker is verified gone, quarantined otherwise). Without it the runtime assumes no
#: worker was left.
RETIRE_OUTCOME_ATTR = "retire_outcome"

#: The attribute the opener sets on an error a stage's load or load gate raised: where it
#: happened (``stages[classify] on ort-cpu, bundle /path``), for a message about a file
#: or a check (a tampered bundle member, say) that does not name its stage itself.
FAILED_STAGE_ATTR = "edge_failed_stage"


@attrs.frozen
class StageContext:
    """A stage as the owning plugin sees it.

    Attributes:
        pipeline: Name of the pipeline the stage belongs to.
        stage_id: The stage's id, unique within its pipeline.
        backend: The backend name (one the plugin declared in ``edge_backends``).
        options: The backend section as returned by the plugin's own ``edge_validate_stage``.
        manifest_dir: The artifact bundle directory, or ``None`` for stages without one.
        route: The worker route (an ``edge_core.host.routes.Route``), or ``None`` when the
            backend's default route applies.
        max_io_bytes: Upper bound on the bytes of one call's inputs or outputs.
        placement: The placement policy the warm-up gate will apply.
        declared_demands: Pool name to bytes, as the user declared them (may be empty).
        generation: The worker generation this load will run under; a restart bumps it.
        replica: Which of the stage's ``replicas`` this is (0 for the first or only one).
        shapes: Names of the bundle's shape-set entries the stage serves (empty: all of
            them); see :func:`edge_core.shapes.select`.
        gate_points: Which examples of each dynamic shape-set entry the load gate warms
            up: ``all`` (its minimum, its maximum and a shape between), or one point name
            (``min``) when a full gate of the same stack passed before
            (:mod:`edge_core.selection.gates`); static buckets are always warmed up. A
            plugin that warms up more than asked is still gated on what it reports.

    """

    pipeline: str
    stage_id: str
    backend: str
    options: Any = None
    manifest_dir: Path | None = None
    route: Any = None
    max_io_bytes: int = 64 * 1024 * 1024
    placement: PlacementPolicy = attrs.field(factory=PlacementPolicy)
    declared_demands: Mapping[str, int] = attrs.field(factory=dict)
    generation: int = 1
    replica: int = 0
    shapes: tuple[str, ...] = ()
    gate_points: str = "all"


@runtime_checkable
class LoadedStage(Protocol):
    """The handle ``edge_load`` returns; later hooks of the same stage receive it.

    A plugin keeps whatever it needs on its own class (the worker client, the verified
    manifest); the runtime relies only on these members, plus optional ones:
    ``max_in_flight`` (an int) lowers the stage's in-flight limit below the backend's
    declared ``max_concurrency`` (a generate stage configured for fewer sequences, say);
    ``on_lost(listener)`` registers ``listener(error)`` to be called once when the worker
    dies or stops answering, so that the stage turns ``failed`` at once (contract 1.1);
    ``health()`` returns the worker's health (an object with ``to_dict()``, or a mapping)
    for :meth:`Pipeline.health`. :class:`edge_core.workerstage.WorkerStage` has all three.
    ``check_params(params)`` raises the request's own fault (an error declaring
    ``request_fault``, :mod:`edge_contracts.request_faults`) for parameters the stage can
    refuse without running them; :meth:`Pipeline.check_params` calls it before admission
    where the caller's parameters reach the stage unchanged (a one-stage pipeline). It may
    ask the stage's worker (a ``query``, :meth:`edge_core.workerstage.WorkerStage.query`,
    answered by the handler's ``query`` without taking a slot) — a generate stage counts
    a text prompt's tokens with its own tokenizer so — so it may block for that round
    trip: an event loop calls it from a thread.
    """

    @property
    def context(self) -> StageContext:
        """The context the stage was loaded with."""
        ...

    def describe(self) -> Mapping[str, object]:
        """JSON-ready facts for the execution plan: worker identity, route, runtime versions."""
        ...

    def observed_memory(self) -> Mapping[str, int]:
        """Peak bytes observed so far per pool.

        ``machine:ram`` holds a worker tree's peak resident memory; the runtime refuses a
        stage whose observation exceeds its demand.
        """
        ...


class RetainedOutputs(dict[str, Any]):
    """An event's output arrays that are views of a worker's memory, not copies.

    A loaded stage's call may yield this mapping instead of a plain ``dict`` for an
    event's tensors. The runtime keeps :attr:`release` with the request and calls it
    once the result is acknowledged (or the request ends undelivered): the worker may
    then reuse the memory. ``release()`` returns True when some view was still referenced
    at that moment, in which case the memory must have been kept for it (never reused).

    Attributes:
        release: gives the memory back; returns whether views were still alive.
    """

    __slots__ = ("release",)

    def __init__(self, arrays: Mapping[str, Any], release: Callable[[], bool]) -> None:
        super().__init__(arrays)
        self.release = release

