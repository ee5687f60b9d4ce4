"""Four verdicts that claim only what was shown, and the status they give a cell together.

Each verdict is ``met``, ``failed`` or ``unjudged``, with its ``basis``:

- **functional**: the complete model on its target within its numerical bound — every
  stage ``complete-model`` and entirely on its target provider. A stage split onto a
  fallback provider is ``failed`` at the placement layer (status PARTIAL); a pipeline
  only partly or not at all compared against a reference is ``unjudged`` (COMPONENT,
  PROFILE_ONLY); a run that failed at a functional layer is ``failed`` there.
- **quality**: the task-level check the pipeline names (``quality``) on the golden set
  it declares (``golden``), judged by the set's pass criteria; none declared:
  ``unjudged``.
- **performance**: the product targets (the pipeline's ``targets`` or a targets file) on
  the measured figures (:mod:`.targets`). No targets: ``unjudged``, never a pass; a
  target the profile did not measure, or a level measured with fewer requests than the
  protocol's 20, leaves it ``unjudged`` (the evaluated targets are still listed); a
  target missed is ``failed``.
- **reliability**: no request errors, every worker's retirement verified at every close,
  and the ledger empty after close (nothing reserved, nothing quarantined). ``unjudged``
  when the run never reached serving.

:func:`decide` turns them into the cell's status: a failed run keeps its failure's
status and layer; then any failed verdict gives FAILED with that verdict's layer
(``quality``, ``performance``, or the error's layer for reliability); then a functional
verdict not met gives PARTIAL, COMPONENT or PROFILE_ONLY; PASS needs all four judged and
met; otherwise MET_AS_JUDGED, whose note names the judged and unjudged verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.records import Failure
from edge_core.evidence.status import Status
from edge_core.evidence.targets import (
    PROTOCOL_MIN_REQUESTS,
    evaluate,
    measured_metrics,
    parse_targets,
)

__all__ = ["FAILED", "MET", "UNJUDGED", "VERDICTS", "decide", "functional_verdict",
           "performance_verdict", "quality_verdict", "reliability_verdict"]

MET, FAILED, UNJUDGED = "met", "failed", "unjudged"
VERDICTS = ("functional", "quality", "performance", "reliability")
"""The four verdicts, in the order reports show them."""


def functional_verdict(functional: Mapping[str, Any],
                       failure: Failure | None) -> tuple[dict[str, Any], Status | None]:
    """The functional verdict and the status it gives when it is not met.

    Returns ``(verdict, status)``: ``status`` is PARTIAL, COMPONENT or PROFILE_ONLY when
    the stages say so, ``None`` when met (or when the run failed: the failure decides).
    """
    stages: Mapping[str, Any] = functional.get("stages") or {}
    if failure is not None and not stages:
        if failure.layer in ("backend", "route", "configuration", "admission", "plugins",
                             "inputs"):
            return {"verdict": UNJUDGED, "basis": f"nothing ran: blocked at {failure.layer}"}, \
                None
        return {"verdict": FAILED, "basis": f"the run failed at {failure.layer}",
                "layer": failure.layer}, None
    checked = sorted(sid for sid, s in stages.items() if s.get("evidence") == "complete-model")
    if not stages or not checked:
        return {"verdict": UNJUDGED,
                "basis": "no stage was compared against a reference"}, Status.PROFILE_ONLY
    if len(checked) < len(stages):
        unchecked = sorted(set(stages) - set(checked))
        return {"verdict": UNJUDGED, "basis": "only components were compared against a "
                f"reference; not compared: {unchecked}"}, Status.COMPONENT
    split = sorted(sid for sid, s in stages.items() if not s.get("on_target"))
    if split:
        return {"verdict": FAILED, "layer": "placement",
                "basis": f"part of the graph ran off-target in stages {split}"}, Status.PARTIAL
    return {"verdict": MET, "basis": "every stage complete-model and entirely on its "
            f"target ({', '.join(checked)})"}, None


def quality_verdict(quality: Mapping[str, Any] | None) -> dict[str, Any]:
    """The quality verdict from the profile's golden-set run (``None``: not reached)."""
    if not quality:
        return {"verdict": UNJUDGED, "basis": "the run did not reach the quality check"}
    if not quality.get("declared"):
        return {"verdict": UNJUDGED, "basis": str(quality.get("reason")
                                                  or "no quality check declared")}
    base = {"function": quality.get("function"), "golden": quality.get("golden"),
            "metrics": quality.get("metrics"), "passes": quality.get("passes")}
    if "error" in quality:
        error = quality["error"]
        return {**base, "verdict": FAILED, "layer": "quality",
                "basis": f"the check could not be scored: {error.get('type')}: "
                f"{error.get('message')}"}
    rows = quality.get("passes") or []
    shown = ", ".join(f"{r['criterion']} (measured {r['value']:.4g})" for r in rows)
    if quality.get("met"):
        return {**base, "verdict": MET, "basis": f"golden set passed: {shown}"}
    missed = ", ".join(f"{r['criterion']} (measured {r['value']:.4g})" for r in rows
                       if not r["met"])
    return {**base, "verdict": FAILED, "layer": "quality", "basis": f"missed: {missed}"}


def _below_protocol(performance: Mapping[str, Any]) -> list[str]:
    below = []
    for part in ("latency", "streams"):
        for scope, row in (performance.get(part) or {}).items():
            n = row.get("n")
            if isinstance(n, int) and n < PROTOCOL_MIN_REQUESTS and row.get("status") in (
                    None, "measured", "failed"):
                below.append(f"{scope} (n={n})")
    return sorted(set(below))


def performance_verdict(performance: Mapping[str, Any], targets: Sequence[str],
                        origin: str) -> dict[str, Any]:
    """The performance verdict: the targets on the record's measured figures.

    Raises:
        RecordInvalid: a target that does not parse (naming it).
    """
    below = _below_protocol(performance)
    if not targets:
        return {"verdict": UNJUDGED, "basis": "no product targets declared (the pipeline's "
                "`targets`, or --targets FILE)", "targets": [], "below_protocol": below}
    parsed = parse_targets(list(targets), f"targets ({origin})")
    rows = evaluate(parsed, measured_metrics(performance))
    base = {"targets": rows, "origin": origin, "below_protocol": below,
            "protocol_min_requests": PROTOCOL_MIN_REQUESTS}
    failed = [r["target"] for r in rows if r["outcome"] == "failed"]
    unmeasured = [r["target"] for r in rows if r["outcome"] == "unmeasured"]
    if below:
        return {**base, "verdict": UNJUDGED,
                "basis": f"fewer than the protocol's {PROTOCOL_MIN_REQUESTS} requests at "
                f"{below}" + (f"; targets missed there: {failed}" if failed else "")}
    if failed:
        return {**base, "verdict": FAILED, "layer": "performance",
                "basis": f"targets missed: {failed}"}
    if unmeasured:
        return {**base, "verdict": UNJUDGED,
                "basis": f"targets the profile did not measure: {unmeasured}"}
    return {**base, "verdict": MET, "basis": f"every target met: {[r['target'] for r in rows]}"}


def _closed_runs(profile: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    runs = [r for r in profile.get("runs") or [] if isinstance(r, Mapping)]
    if not runs:  # a version 1 profile: the traced run and the baseline
        runs = [r for r in (profile.get("traced"), profile.get("baseline"))
                if isinstance(r, Mapping)]
    baseline = profile.get("baseline")
    if isinstance(baseline, Mapping) and baseline not in runs:
        runs.append(baseline)
    return [r for r in runs if "closed" in r]


def reliability_verdict(profile: Mapping[str, Any]) -> dict[str, Any]:
    """Request errors, verified retirement at every close, an empty ledger after close."""
    baseline = profile.get("baseline") or {}
    if "groups" not in baseline:
        return {"verdict": UNJUDGED, "basis": "the run did not reach serving"}
    errors = [e for g in baseline.get("groups") or [] for lvl in g.get("levels") or []
              for e in lvl.get("errors") or []]
    cases = baseline.get("stream_cases") or {}
    for case in cases.values():
        if isinstance(case, Mapping) and isinstance(case.get("error"), Mapping):
            errors.append(case["error"])
    unverified = []
    leftover = []
    for run in _closed_runs(profile):
        for stage, closed in (run.get("closed") or {}).items():
            retire = (closed or {}).get("retire") or {}
            if not (isinstance(retire, Mapping) and retire.get("verified") is True):
                unverified.append(f"run {run.get('index', '?')}: {stage}")
        ledger = run.get("ledger_after_close") or {}
        pools = ledger.get("pools") or {}
        if ledger.get("reservations") or any(
                (p or {}).get("reserved") or (p or {}).get("quarantined")
                for p in pools.values()):
            leftover.append(f"run {run.get('index', '?')}")
    layers: dict[str, int] = {}
    for error in errors:
        layer = str(error.get("layer") or "unknown")
        layers[layer] = layers.get(layer, 0) + 1
    found = {"request_errors": len(errors), "errors_by_layer": layers,
             "first_error": errors[0] if errors else None,
             "unverified_retirements": unverified, "ledger_not_empty_after": leftover}
    if errors:
        first = errors[0]
        return {**found, "verdict": FAILED, "layer": str(first.get("layer") or "unknown"),
                "basis": f"{len(errors)} request error(s), first {first.get('type')}: "
                f"{first.get('message')}"}
    if unverified:
        return {**found, "verdict": FAILED, "layer": "retirement",
                "basis": f"retirement not verified: {unverified}"}
    if leftover:
        return {**found, "verdict": FAILED, "layer": "ledger",
                "basis": f"the ledger was not empty after close: {leftover}"}
    return {**found, "verdict": MET, "basis": "no request error; every worker retired "
            "verified; the ledger empty after every close"}


_NEXT = {
    "quality": "read the golden items' answers in the profile (baseline.quality) and "
               "compare them with the truth; check the export's precision and the "
               "pre/post-processing",
    "performance": "compare the missed figures with the targets on a quiet machine "
                   "(conditions in the record); profile again, or change the configuration",
    "retirement": "`edge cleanup` lists what was left; read the worker's log for why it "
                  "did not exit",
    "ledger": "a reservation outlived its stage: report it with the profile",
}


def decide(verdicts: Mapping[str, Mapping[str, Any]], functional_status: Status | None,
           run_failure: tuple[Status, Failure] | None,
           next_steps: Mapping[str, str] | None = None,
           ) -> tuple[Status, Failure | None, list[str]]:
    """The cell's status, its failure (if any) and notes, from the four verdicts."""
    if run_failure is not None:
        return run_failure[0], run_failure[1], []
    for name in ("quality", "performance", "reliability"):
        verdict = verdicts[name]
        if verdict["verdict"] == FAILED:
            layer = str(verdict.get("layer") or name)
            steps = {**_NEXT, **(next_steps or {})}
            step = steps.get(layer) or steps.get(name) or "rerun the recorded command"
            return Status.FAILED, Failure(layer=layer, reason=str(verdict["basis"]),
                                          next_step=step, step=name,
                                          error_type=None), []
    if functional_status is not None:
        return functional_status, None, [str(verdicts["functional"]["basis"])]
    judged = [n for n in VERDICTS if verdicts[n]["verdict"] != UNJUDGED]
    unjudged = [n for n in VERDICTS if verdicts[n]["verdict"] == UNJUDGED]
    if not unjudged:
        return Status.PASS, None, []
    if verdicts["functional"]["verdict"] != MET:  # pragma: no cover - a status above
        raise RecordInvalid("verdicts.functional", "not met without a status",
                            verdicts["functional"])
    return Status.MET_AS_JUDGED, None, [f"judged and met: {', '.join(judged)}; "
                                        f"unjudged: {', '.join(unjudged)}"]
