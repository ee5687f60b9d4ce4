"""One qualification record per (stage, tried candidate) of a profile with candidate backends.

A pipeline whose stages list ``candidates`` is not one cell: each candidate tried at open
is a cell of its own — model ``<pipeline>/<stage>``, device that candidate's (the devices
its backend's probe reported, on this host), configuration ``<backend> (candidate N)``
— so the matrix shows every refusal with its layer next to the candidate that served:

* a refused candidate: FAILED, REJECTED or BLOCKED as its layer says
  (:func:`~edge_core.evidence.status.classify_layer`), with the refusal's reason;
* the chosen candidate: that stage's functional outcome of the run (PASS, PARTIAL,
  COMPONENT, PROFILE_ONLY) with the run's performance, or the run's failure when the
  profile failed after it was chosen.

A profile without candidates is one cell, as before (:func:`records_from_profile`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from edge_core.evidence.qualify import record_from_profile
from edge_core.evidence.records import Cell, Failure, QualificationRecord
from edge_core.evidence.status import Status, classify_layer

__all__ = ["candidate_device", "records_from_profile"]


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
    return attrs.evolve(base, status=found.status, failure=failure, performance={},
                        functional={"candidate": dict(entry), "complete_model": False},
                        notes=(f"candidate refused at {entry.get('layer')} when the "
                               "pipeline opened; the next candidate was tried",))


def _chosen(base: QualificationRecord, whole: QualificationRecord,
            stage_id: str) -> QualificationRecord:
    stages = (whole.functional.get("stages") or {})
    mine = stages.get(stage_id)
    if whole.failure is not None or mine is None:
        failure = whole.failure or Failure(
            layer="unknown", reason="the profile has no functional outcome for this stage",
            next_step="rerun the recorded command")
        status = whole.status if whole.status.needs_failure else Status.FAILED
        return attrs.evolve(base, status=status, failure=failure, notes=(
            "the candidate passed its gate; the profiled run then failed "
            f"({failure.layer}: {failure.step or 'run'})",))
    checked = mine.get("evidence") == "complete-model"
    if not checked:
        status, notes = Status.PROFILE_ONLY, ["the stage was not compared against a reference"]
    elif not mine.get("on_target"):
        status, notes = Status.PARTIAL, ["part of the stage ran off-target"]
    else:
        status, notes = Status.PASS, []
    return attrs.evolve(base, status=status, failure=None,
                        functional={"stages": {stage_id: mine},
                                    "complete_model": checked},
                        notes=(*notes, "performance figures are the whole pipeline's"))


def records_from_profile(profile: Mapping[str, Any], *, profile_path: str | None = None,
                         labels: Mapping[str, str | None] | None = None,
                         ) -> list[QualificationRecord]:
    """Every record a profile yields: one per (stage, tried candidate), or the one cell.

    ``labels``: ``device`` overrides every candidate's device label; ``model`` replaces
    the pipeline's name in ``<model>/<stage>``; ``configuration`` prefixes each
    candidate's configuration.

    Raises:
        RecordInvalid: not a profile, or one without an outcome.
    """
    whole = record_from_profile(profile, profile_path=profile_path, labels=labels)
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
            base = attrs.evolve(
                whole, cell=cell,
                source={**whole.source, "stage": stage_id, "candidate": number},
                backend={stage_id: {"backend": backend, "outcome": entry.get("outcome")}}
                if entry.get("outcome") != "chosen" else whole.backend)
            records.append(_chosen(base, whole, stage_id) if entry.get("outcome") == "chosen"
                           else _refused(base, entry))
    return records or [whole]
