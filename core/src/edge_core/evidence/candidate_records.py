"""One qualification record per (stage, tried candidate) of a profile with candidate backends.

A pipeline whose stages list ``candidates`` is not one cell: each candidate tried at open
is a cell of its own — model ``<pipeline>/<stage>``, device that candidate's (the devices
its backend's probe reported, on this host), configuration ``<backend> (candidate N)``
— so the matrix shows every refusal with its layer next to the candidate that served:

* a refused candidate: FAILED, REJECTED or BLOCKED as its layer says
  (:func:`~edge_core.evidence.status.classify_layer`), with the refusal's reason;
* the chosen candidate: that stage's functional verdict with the run's quality,
  performance and reliability verdicts (PASS, MET_AS_JUDGED, PARTIAL, COMPONENT,
  PROFILE_ONLY, or FAILED on a failed verdict), or the run's failure when the profile
  failed after it was chosen;
* a candidate that passed every gate but was not chosen by a measured selection:
  PROFILE_ONLY (measured, never served: its verdicts are unjudged), its own measured
  figures as its performance and why it lost in the notes.

Every candidate's record carries the whole comparison the choice was made on
(``performance["comparison"]``: the objective, where the decision came from, each
candidate's figures, and for a split single-backend against split-serial against
split-overlapped), so the matrix shows why a cell was kept or refused.

A profile without candidates is one cell, as before (:func:`records_from_profile`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from edge_core.evidence.qualify import record_from_profile
from edge_core.evidence.records import Cell, Failure, QualificationRecord
from edge_core.evidence.status import Status, classify_layer
from edge_core.evidence.verdicts import UNJUDGED, decide, functional_verdict

__all__ = ["candidate_device", "comparison", "records_from_profile"]


def _host_label(host: Mapping[str, Any]) -> str:
    return (f"{host.get('cpu_model', 'unknown')} ({host.get('os', '?')} "
            f"{host.get('machine', '?')})")


def candidate_device(backend: str, profile: Mapping[str, Any]) -> str:
    """The device label of a candidate: its backend's probed devices on this host."""
    host = _host_label(profile.get("host") or {})
    reports = [r for r in profile.get("probes") or []
               if isinstance(r, Mapping) and r.get("backend") == backend]
    devices = [f"{d.get('kind')} {d.get('name')}" for r in reports
               for d in r.get("devices") or [] if isinstance(d, Mapping)]
    if devices:
        return f"{', '.join(devices)} via {backend} on {host}"
    return f"{backend} on {host}"


def _has_candidates(profile: Mapping[str, Any]) -> bool:
    stages = (profile.get("config") or {}).get("stages") or []
    return any(stage.get("candidates") for stage in stages if isinstance(stage, Mapping))


def _refused(base: QualificationRecord, entry: Mapping[str, Any]) -> QualificationRecord:
    found = classify_layer(entry.get("layer"))
    reason = str(entry.get("reason") or "-")
    error_type = reason.split(":", 1)[0] if ":" in reason else None
    failure = Failure(layer=found.layer, reason=reason, next_step=found.next_step,
                      step="open", error_type=error_type)
    functional, _ = functional_verdict({}, failure)
    unjudged = {"verdict": UNJUDGED, "basis": "the candidate was refused when the pipeline "
                "opened: it served nothing"}
    kept = {k: v for k, v in base.performance.items() if k == "comparison"}
    return attrs.evolve(base, status=found.status, failure=failure, performance=kept,
                        functional={"candidate": dict(entry), "complete_model": False},
                        verdicts={"functional": functional, "quality": unjudged,
                                  "performance": unjudged, "reliability": unjudged},
                        notes=(f"candidate refused at {entry.get('layer')} when the "
                               "pipeline opened; the next candidate was tried",))


def _chosen(base: QualificationRecord, whole: QualificationRecord,
            stage_id: str) -> QualificationRecord:
    stages = (whole.functional.get("stages") or {})
    mine = stages.get(stage_id)
    if (whole.failure is not None and whole.failure.step not in (
            "quality", "performance", "reliability")) or mine is None:
        failure = whole.failure or Failure(
            layer="unknown", reason="the profile has no functional outcome for this stage",
            next_step="rerun the recorded command")
        status = whole.status if whole.status.needs_failure else Status.FAILED
        return attrs.evolve(base, status=status, failure=failure, notes=(
            "the candidate passed its gate; the profiled run then failed "
            f"({failure.layer}: {failure.step or 'run'})",))
    functional = {"stages": {stage_id: mine},
                  "complete_model": mine.get("evidence") == "complete-model"}
    verdict, functional_status = functional_verdict(functional, None)
    verdicts = {**whole.verdicts, "functional": verdict}
    status, judged_failure, notes = decide(verdicts, functional_status, None)
    return attrs.evolve(base, status=status, failure=judged_failure, functional=functional,
                        verdicts=verdicts,
                        notes=(*notes, "performance figures are the whole pipeline's"))


def comparison(profile: Mapping[str, Any], stage_id: str) -> dict[str, Any] | None:
    """The measured comparison behind a stage's choice, from a profile (None: none made)."""
    selection = (profile.get("plan") or {}).get("selection") or {}
    if selection.get("decision") not in ("measured", "reused"):
        return None
    entries = (profile.get("candidates") or {}).get(stage_id) or []
    return {
        "objective": selection.get("objective"), "decision": selection.get("decision"),
        "measured_at": selection.get("measured_at"), "note": selection.get("note"),
        "workload": selection.get("workload"), "schedule": selection.get("schedule"),
        "candidates": [{"candidate": e.get("candidate"), "backend": e.get("backend"),
                        "outcome": e.get("outcome"), "measured": e.get("measured")}
                       for e in entries if isinstance(e, Mapping)],
        "split": selection.get("split"),
    }


def _passed(base: QualificationRecord, entry: Mapping[str, Any]) -> QualificationRecord:
    measured = entry.get("measured") or {}
    figures = {key: measured.get(key) for key in ("p50_s", "p95_s", "p50_low_s",
                                                  "p50_high_s", "samples", "stopped",
                                                  "relative")}
    unjudged = {"verdict": UNJUDGED, "basis": "the candidate passed every gate and was "
                "measured when the pipeline opened, but another was chosen: it served "
                "none of the profiled requests"}
    kept = {k: v for k, v in base.performance.items() if k == "comparison"}
    return attrs.evolve(base, status=Status.PROFILE_ONLY, failure=None,
                        performance={**kept, "candidate": figures},
                        functional={"candidate": dict(entry), "complete_model": False},
                        verdicts={name: dict(unjudged) for name in
                                  ("functional", "quality", "performance", "reliability")},
                        notes=(str(entry.get("reason") or "passed every gate; not chosen"),
                               "measured inside the whole chain when the pipeline opened; "
                               "it did not serve the profiled run"))


def records_from_profile(profile: Mapping[str, Any], *, profile_path: str | None = None,
                         labels: Mapping[str, str | None] | None = None,
                         targets: Sequence[str] | None = None,
                         targets_origin: str | None = None) -> list[QualificationRecord]:
    """Every record a profile yields: one per (stage, tried candidate), or the one cell.

    ``labels``: ``device`` overrides every candidate's device label; ``model`` replaces
    the pipeline's name in ``<model>/<stage>``; ``configuration`` prefixes each
    candidate's configuration. ``targets``: product targets instead of the profile's.

    Raises:
        RecordInvalid: not a profile, or one without an outcome.
    """
    whole = record_from_profile(profile, profile_path=profile_path, labels=labels,
                                targets=targets, targets_origin=targets_origin)
    if not _has_candidates(profile):
        return [whole]
    given = {k: v for k, v in (labels or {}).items() if v}
    plan = profile.get("plan") or {}
    model = given.get("model") or plan.get("pipeline") or whole.cell.model
    tried = profile.get("candidates") or {}
    records = []
    for stage_id, entries in tried.items():
        for number, entry in enumerate(entries):
            backend = str(entry.get("backend"))
            configuration = f"{backend} (candidate {number})"
            if given.get("configuration"):
                configuration = f"{given['configuration']}: {configuration}"
            cell = Cell(device=given.get("device") or candidate_device(backend, profile),
                        model=f"{model}/{stage_id}", configuration=configuration)
            compared = comparison(profile, stage_id)
            base = attrs.evolve(
                whole, cell=cell,
                source={**whole.source, "stage": stage_id, "candidate": number},
                backend={stage_id: {"backend": backend, "outcome": entry.get("outcome")}}
                if entry.get("outcome") != "chosen" else whole.backend,
                performance={**whole.performance,
                             **({"comparison": compared} if compared is not None else {})})
            outcome = entry.get("outcome")
            if outcome == "chosen":
                records.append(_chosen(base, whole, stage_id))
            elif outcome == "passed":
                records.append(_passed(base, entry))
            else:
                records.append(_refused(base, entry))
    return records or [whole]
