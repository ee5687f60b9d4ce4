"""The reference run: ``complete-model`` evidence from a second, independent runtime.

A stage that names ``reference_backend`` (docs/evidence.md) is checked, once it has
opened, against a run of the same bundle on that backend in a worker core starts through
the ordinary plugin hooks (:class:`~edge_core.runtime.opener.StageOpener`): probe, option
defaults and validation, a reservation charged in the pipeline's ledger, load, warm-up.
The bundle's example inputs go through the stage and through the reference; the outputs
are compared by name within the stage's bound (its warm-up bound, else the manifest's
``validation.bound``, else :data:`DEFAULT_BOUND`). The reference worker is then
retired — verified — and its reservation released (quarantined if the retirement is not
verified). Core imports no runtime: both runs happen in workers.

Both run the bundle the stage loaded, never one rewritten on disk since: the example inputs
and the manifest's bound are read as the stage verified them
(:meth:`~edge_core.runtime.stage_slot.StageSlot.example_inputs`), and the reference's load
runs inside the stage's bundle pin (:mod:`edge_core.artifacts.pins`: the copy the stage
keeps, else the bundle on disk only while its manifest is the one the stage opened with,
else ``BundleChanged``, which the record's reason names).

The record (:func:`reference_run`) says what was compared and how it went; the plan's
evidence label (:func:`edge_core.runtime.evidence.evidence_label`) is ``complete-model``
only when the comparison was made and passed. A reference that cannot be started, a
bundle without example inputs, a failed call or a mismatch all leave the stage
``backend-execution``, with the reason; none of them fails the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from edge_core.config.model import BackendSection, ResourceBudget
from edge_core.errors import stage_label
from edge_core.runtime.opener import StageOpener
from edge_core.runtime.stage_slot import StageSlot
from edge_core.stage import RETIRE_OUTCOME_ATTR

__all__ = ["DEFAULT_BOUND", "INDEPENDENT_RUN", "compare_with_reference", "reference_run",
           "run_references"]

INDEPENDENT_RUN = "independent-run"
"""The prefix of an independent reference's name: ``independent-run:<backend>``."""

DEFAULT_BOUND = {"max_abs_error": 1e-4, "normalised_error": 1e-4}
"""The bound when neither the stage's warm-up nor the manifest declares one."""

_CALL_TIMEOUT_S = 120.0


def compare_with_reference(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], bound: Mapping[str, float],
) -> tuple[list[str], float, float]:
    """Problems comparing the stage's outputs with the reference's, and the worst errors.

    Every reference output must be present with the same shape and dtype; floating
    outputs agree within ``bound`` (``max_abs_error``, and ``normalised_error`` =
    L2(a - b) / L2(b)), the others exactly.
    """
    problems: list[str] = []
    worst_abs = worst_norm = 0.0
    for name, want_value in theirs.items():
        if name not in ours:
            problems.append(f"outputs.{name}: missing from the stage's outputs "
                            f"{sorted(ours)}: None")
            continue
        got, want = np.asarray(ours[name]), np.asarray(want_value)
        if got.shape != want.shape or got.dtype != want.dtype:
            problems.append(f"outputs.{name}: the reference gave {want.dtype}{list(want.shape)}"
                            f": {got.dtype}{list(got.shape)}")
            continue
        if not np.issubdtype(want.dtype, np.floating):
            if not np.array_equal(got, want):
                problems.append(f"outputs.{name}: differs from the reference exactly: "
                                f"{got.ravel()[:8].tolist()}")
            continue
        diff = got.astype(np.float64) - want.astype(np.float64)
        if bool(np.any(np.isnan(got) != np.isnan(want))):
            problems.append(f"outputs.{name}: NaN where the reference has none (or the "
                            f"reverse): {int(np.isnan(got).sum())}")
            continue
        diff = np.nan_to_num(diff, nan=0.0)
        max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
        scale = float(np.linalg.norm(np.nan_to_num(want.astype(np.float64))))
        normalised = float(np.linalg.norm(diff)) / scale if scale else max_abs
        worst_abs, worst_norm = max(worst_abs, max_abs), max(worst_norm, normalised)
        limit_abs = float(bound.get("max_abs_error", DEFAULT_BOUND["max_abs_error"]))
        limit_norm = float(bound.get("normalised_error", DEFAULT_BOUND["normalised_error"]))
        if max_abs > limit_abs or normalised > limit_norm:
            problems.append(f"outputs.{name}: beyond the bound {dict(bound)}: "
                            f"max_abs_error={max_abs:.3g}, normalised_error={normalised:.3g}")
    return problems, worst_abs, worst_norm


def _bound(stage: StageSlot, manifest_bound: Mapping[str, Any]) -> dict[str, float]:
    numerics = stage.warmup.numerics if stage.warmup is not None else None
    declared = (numerics or {}).get("bound") or manifest_bound or {}
    return {**DEFAULT_BOUND, **{k: float(v) for k, v in dict(declared).items()}}


def _outputs(runtime: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Run ``inputs`` once on ``runtime``; return private copies of the outputs."""
    result = runtime.submit(dict(inputs), deadline_s=_CALL_TIMEOUT_S).result()
    try:
        return {name: np.array(value, copy=True) for name, value in result.outputs.items()}
    finally:
        result.ack()


def reference_run(opener: StageOpener, stage: StageSlot, index: int) -> dict[str, Any]:
    """Run the stage's example inputs on its ``reference_backend``; compare; clean up.

    Never raises for the reference's faults: the record carries ``passed`` and, when
    false, ``reason``. The reference's reservation is released (or quarantined) before
    this returns.
    """
    backend = str(stage.config.reference_backend)
    record: dict[str, Any] = {"reference": f"{INDEPENDENT_RUN}:{backend}", "backend": backend,
                              "passed": False}
    where = f"stages[{index}].reference_backend{stage_label(stage.context.stage_id)}"
    if stage.context.manifest_dir is None or stage.runtime is None:
        record["reason"] = f"{where}: the stage has no bundle to run on a reference"
        return record
    try:  # as the stage loaded them (BundleChanged for a bundle rewritten since)
        example = stage.example_inputs()
    except Exception as exc:
        record["reason"] = f"{where}: the bundle's example inputs: {type(exc).__name__}: {exc}"
        return record
    manifest = (example.manifest if example is not None
                else stage.pin.identities.manifest(stage.context.manifest_dir))
    inputs = dict(example.arrays) if example is not None else {}
    validation = (manifest.metadata.validation if manifest is not None else None) or {}
    bound = _bound(stage, dict(validation.get("bound") or {}))
    record["bound"] = bound
    if not inputs:
        record["reason"] = f"{where}: the bundle has no example inputs to compare on"
        return record
    config = attrs.evolve(
        stage.config, id=f"{stage.config.id}.reference", backend=BackendSection(name=backend),
        replicas=1, candidates=(), resources=ResourceBudget(), input_transform=None,
        reference_backend=None, restart="never", inputs_from=())
    reference: StageSlot | None = None
    try:
        (reference,) = opener.resolve(index, config, where)
        opener.reserve([reference])
        # inside the stage's pin: the copy it keeps, else the disk with its manifest
        with stage.pin.active(reference.context.manifest_dir):
            loaded = reference.binding.load(reference.context)
        runtime = opener.runtime(reference, loaded)
        try:
            reference.binding.warmup_placement(loaded)
            theirs = _outputs(runtime, inputs)
            ours = _outputs(stage.runtime, inputs)
        finally:
            outcome = runtime.close()
            record["retire"] = outcome.to_dict() if hasattr(outcome, "to_dict") else outcome
            if reference.token is not None:
                reference.settle(opener.ledger, outcome)
            record["release"] = reference.release_outcome
    except Exception as exc:
        if reference is not None and reference.token is not None:
            # a load that fails retires its own worker first and says how (or none ran)
            outcome = getattr(exc, RETIRE_OUTCOME_ATTR, None)
            record["release"] = reference.settle(opener.ledger, outcome)
        record["reason"] = f"{where}: the reference run failed: {type(exc).__name__}: {exc}"
        return record
    problems, max_abs, normalised = compare_with_reference(ours, theirs, bound)
    record.update(max_abs_error=max_abs, normalised_error=normalised,
                  outputs=sorted(theirs), passed=not problems)
    if problems:
        record["reason"] = "; ".join(problems)
    return record


def run_references(opener: StageOpener, stages: Sequence[StageSlot]) -> None:
    """Make the reference run of every opened stage that names ``reference_backend``."""
    ids = [config.id for config in opener.config.stages]
    for stage in stages:
        if stage.config.reference_backend is not None and stage.context.replica == 0:
            index = ids.index(stage.config.id)
            stage.reference = reference_run(opener, stage, index)
