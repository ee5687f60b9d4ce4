"""The execution plan of an open pipeline: one JSON report of what was admitted and how.

:meth:`Pipeline.execution_plan <edge_core.runtime.pipeline.Pipeline.execution_plan>`
returns :func:`execution_plan`, over the pipeline's stage slots: per
stage (replica), its identity, backend and plugin, worker and route (``null`` while the
replica has no live worker: failed, restarting or retired), reservation,
warm-up placement, numerics and buckets, how its load gate ran (``gate``: ``full``, or
``reused`` from a stored full gate with the points checked now, or ``failed``: its last
restart failed, before or in its gate), observed memory and
evidence label; then the
configuration and the ledger's snapshot.

A replica whose last restart failed shows no warm-up as current: its ``placement``,
``numerics`` and ``warmup`` are ``null``, its ``buckets`` empty and its evidence judged on
nothing — what ran before was the previous generation's, whose worker is gone; what the
failed attempt's warm-up reported, if it got that far, is in its ``gate`` record, named
by the generation it tried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edge_core import __version__
from edge_core.config.model import PipelineConfig
from edge_core.ledger import ResourceLedger
from edge_core.runtime.candidate_entries import chosen_entry
from edge_core.runtime.evidence import evidence_of
from edge_core.runtime.health import StageState, replica_summary
from edge_core.runtime.memory_check import checked_stage, over_demand
from edge_core.runtime.stage_slot import StageSlot

__all__ = ["execution_plan"]


def execution_plan(config: PipelineConfig, stages: Sequence[StageSlot], opened_at: float,
                   ledger: ResourceLedger,
                   candidates: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                   ) -> dict[str, Any]:
    """The JSON execution plan: identities, route, reservations, placement, numerics.

    ``candidates`` maps a stage id to the candidates tried for it, in order (see
    :mod:`edge_core.runtime.candidate_entries`); a stage without an entry lists its one backend
    as chosen.
    """
    tried = candidates or {}
    states: dict[str, list[StageState]] = {}
    for stage in stages:
        states.setdefault(stage.context.stage_id, []).append(
            stage.runtime.state if stage.runtime is not None else StageState.FAILED)
    entries = []
    for stage in stages:
        runtime = stage.runtime
        # Only a ready replica has a live worker: a failed, restarting or retired one's
        # last worker is gone, and the plan does not show it as if it served.
        live = runtime is not None and runtime.state is StageState.READY
        described = dict(runtime.loaded.describe()) if live and runtime is not None else None
        # a failed restart: the last warm-up is the previous generation's (or the failed
        # attempt's, in its gate record), never shown as the replica's current evidence
        warmup = None if (stage.gate or {}).get("mode") == "failed" else stage.warmup
        numerics = warmup.numerics if warmup is not None else None
        reference = stage.reference
        # the bundle that loaded: the manifest verified then, its expected outputs in the
        # copy kept since the open; in place, on disk (rewritten since: not counted)
        manifest_dir = stage.context.manifest_dir
        verified = None
        if manifest_dir is not None:
            verified = stage.pin.identities.manifest(manifest_dir)
            manifest_dir = stage.pin.directory(manifest_dir) or manifest_dir
        evidence = evidence_of(numerics, manifest_dir,
                               warmup.buckets if warmup is not None else (),
                               stage.context.shapes, reference, manifest=verified)
        entries.append({
            "id": stage.context.stage_id,
            "replica": stage.context.replica,
            "backend": stage.binding.backend.name,
            "plugin": stage.binding.plugin,
            "kind": sorted(k.value for k in stage.binding.backend.kinds),
            "generation": runtime.generation if runtime is not None else None,
            "state": runtime.state.value if runtime is not None else None,
            "state_reason": runtime.closed_reason if runtime is not None else None,
            "restarts": runtime.restarter.restarts if runtime is not None else 0,
            "replicas": replica_summary(states[stage.context.stage_id]),
            "worker": described,
            "route": described.get("route") if described is not None else None,
            "reservation": {"demands": dict(stage.demands),
                            "token": stage.token.to_json() if stage.token else None},
            "placement": warmup.placement.to_json() if warmup is not None else None,
            "numerics": dict(numerics) if numerics is not None else None,
            "warmup": dict(warmup.extra) if warmup is not None else None,
            "buckets": [b.to_json() for b in warmup.buckets] if warmup is not None else [],
            "gate": dict(stage.gate) if stage.gate is not None else None,
            "observed_memory": dict(stage.observed),
            "memory_check": dict(stage.memory_check),
            "memory": checked_stage(stage),  # the peak now, after the requests served
            "evidence": evidence.label,
            "evidence_basis": evidence.basis,
            "evidence_buckets": evidence.buckets.to_json(),
            "reference_run": dict(reference) if reference is not None else None,
            "candidates": [dict(c) for c in tried.get(
                stage.context.stage_id, [chosen_entry(stage.binding.backend.name)])],
        })
    return {
        "pipeline": config.name,
        "edge_core": __version__,
        "opened_at": opened_at,
        "config": config.to_json(),
        "stages": entries,
        "memory_over_demand": over_demand(entries),
        "ledger": ledger.snapshot(),
    }
