"""The evidence label of a stage in the execution plan, decided by core, not by the plugin.

``complete-model`` says that the whole model's outputs were checked, on **every** bucket
the stage serves, against a reference the backend could not have chosen: the bundle's
expected outputs, members of the manifest's hashed ``files`` (named by
``metadata.validation.expected_outputs`` for a single example, or by each example of
``metadata.validation.shapes``), whose bytes core hashes again here. Anything else — a
numerical check against a run the backend made itself (``cpu-run`` in the backend's own
worker), a label the plugin made up, a failed or missing check, a stage without a bundle,
a bucket whose example has no expected outputs — is ``backend-execution``: the stage ran
on its backend, and that is all the plan claims. The manifest judged is the one the stage
verified when it loaded (its bundle pin keeps it: the execution plan passes it), not one
rewritten on disk since; its expected outputs are hashed where the stage loaded them
from (the kept copy, or the bundle itself when verified in place, where one rewritten
since is not counted).

The plan also says how many buckets were compared (:class:`BucketCounts`): a declared
entry of the shape set (the stage's selection of it) counts as compared only when every
one of its examples names hashed expected outputs and the warm-up reported a passing
``expected-outputs`` comparison for each of its runs. A bucket without expected outputs
is never counted, whatever the backend's own summary says.

Or a run on an independent runtime in a worker that core starts: a stage that names
``reference_backend`` has the bundle's example inputs run on that backend too, and the
outputs compared within the stage's bound (:mod:`edge_core.runtime.reference_run`; core
itself never imports a runtime). ``complete-model`` then only when that comparison was
made and passed and the stage serves a single bucket (the run covers the example
inputs alone, so it counts as that one bucket compared); the basis names the reference
(``independent-run:<backend>``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge_contracts.manifest import ArtifactManifest
from edge_core.artifacts.hashing import sha256_path
from edge_core.artifacts.references import expected_outputs_path
from edge_core.artifacts.verify import read_manifest
from edge_core.errors import EdgeError
from edge_core.placement import BucketWarmup
from edge_core.shapes import SHAPES_KEY

__all__ = ["BACKEND_EXECUTION", "COMPLETE_MODEL", "EXPECTED_OUTPUTS", "BucketCounts",
           "Evidence", "evidence_label", "evidence_of"]

COMPLETE_MODEL = "complete-model"
BACKEND_EXECUTION = "backend-execution"
#: The numerics ``reference`` that names the bundle's expected outputs.
EXPECTED_OUTPUTS = "expected-outputs"
#: The entry name of a bundle's single example (no ``shapes`` declared).
SINGLE_ENTRY = "example"


@attrs.frozen
class BucketCounts:
    """How many declared buckets were compared against the bundle's expected outputs.

    Attributes:
        compared: Entries of the shape set whose every warm-up run passed a comparison
            with hashed expected outputs.
        declared: Entries the stage serves (the bundle's shape set, or the stage's
            selection of it; one for a bundle with a single example).
        runs_compared: Warm-up runs (examples) compared with hashed expected outputs.
        runs: Examples declared for those entries.
        not_compared: Entry name → why it is not counted.
    """

    compared: int = 0
    declared: int = 0
    runs_compared: int = 0
    runs: int = 0
    not_compared: Mapping[str, str] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The plan's ``evidence_buckets`` record."""
        return {"compared": self.compared, "declared": self.declared,
                "runs_compared": self.runs_compared, "runs": self.runs,
                "not_compared": dict(self.not_compared)}


@attrs.frozen
class Evidence:
    """A stage's evidence: the label, the reason for it and the bucket counts."""

    label: str
    basis: str
    buckets: BucketCounts


@attrs.frozen
class _Entry:
    name: str
    expected: tuple[str | None, ...]  # one per example: its expected-outputs member


def _declared(manifest: ArtifactManifest, selected: Sequence[str]) -> list[_Entry]:
    """The entries the stage serves and each example's expected-outputs member (or None)."""
    validation = manifest.metadata.validation or {}
    shapes = validation.get(SHAPES_KEY)
    if shapes is None:
        if manifest.metadata.example_inputs is None:
            return []
        entries = [_Entry(SINGLE_ENTRY, (expected_outputs_path(manifest),))]
    else:
        if not isinstance(shapes, Sequence) or isinstance(shapes, str):
            raise ValueError(f"metadata.validation.{SHAPES_KEY}: not a list")
        entries = []
        for raw in shapes:
            if not isinstance(raw, Mapping):
                raise ValueError(f"metadata.validation.{SHAPES_KEY}: an entry is not a mapping")
            examples = raw.get("examples") or []
            expected = tuple(
                e.get("expected_outputs") if isinstance(e, Mapping)
                and isinstance(e.get("expected_outputs"), str) else None
                for e in examples)
            entries.append(_Entry(str(raw.get("name")), expected))
    if selected:
        entries = [e for e in entries if e.name in selected]
    return entries


def _count(entries: list[_Entry], manifest: ArtifactManifest, manifest_dir: Path,
           buckets: Sequence[BucketWarmup], numerics: Mapping[str, Any] | None,
           ) -> tuple[BucketCounts, list[str]]:
    """Count the compared entries; also return the members compared (for the basis)."""
    digests: dict[str, bool] = {}

    def hashed(member: str) -> bool:
        if member not in digests:
            digests[member] = (member in manifest.files and sha256_path(
                manifest_dir.joinpath(*member.split("/"))) == manifest.files[member])
        return digests[member]

    whole_passed = numerics is not None and (
        numerics.get("passed") is True and numerics.get("reference") == EXPECTED_OUTPUTS)
    compared = runs_compared = runs = 0
    members: list[str] = []
    why: dict[str, str] = {}
    for entry in entries:
        runs += len(entry.expected)
        passed = sum(1 for b in buckets if b.entry == entry.name and b.numerics is not None
                     and b.numerics.get("passed") is True
                     and b.numerics.get("reference") == EXPECTED_OUTPUTS)
        if not buckets and len(entries) == 1 and len(entry.expected) == 1 and whole_passed:
            passed = 1  # one example and no per-bucket report: the whole check is its check
        with_expected = [m for m in entry.expected if m is not None]
        if not entry.expected:
            why[entry.name] = "no example declared"
            continue
        if not all(hashed(m) for m in with_expected):
            bad = sorted(m for m in with_expected if not hashed(m))
            why[entry.name] = f"{', '.join(bad)}: sha256 differs from the manifest"
            continue
        runs_compared += min(passed, len(with_expected))
        if len(with_expected) < len(entry.expected):
            missing = len(entry.expected) - len(with_expected)
            why[entry.name] = (f"{missing} of {len(entry.expected)} example(s) name no "
                               "expected outputs")
        elif passed < len(entry.expected):
            why[entry.name] = (f"{passed} of {len(entry.expected)} warm-up run(s) passed a "
                               f"comparison with {EXPECTED_OUTPUTS}"
                               + ("" if buckets else " (the backend gave no per-bucket report)"))
        else:
            compared += 1
            members.extend(m for m in with_expected if m not in members)
    return BucketCounts(compared, len(entries), runs_compared, runs, why), members


def evidence_of(numerics: Mapping[str, Any] | None, manifest_dir: Path | None,
                buckets: Sequence[BucketWarmup] = (),
                selected: Sequence[str] = (),
                reference: Mapping[str, Any] | None = None, *,
                manifest: ArtifactManifest | None = None) -> Evidence:
    """The stage's evidence from the warm-up's numerics, its per-bucket records and the bundle.

    Args:
        numerics: The warm-up's overall numerics (``WarmupReport.numerics``).
        manifest_dir: The stage's bundle (None: no bundle): where the expected outputs
            are hashed again.
        buckets: The warm-up's per-bucket records (``WarmupReport.buckets``); a backend
            that reports none is judged on ``numerics`` alone, and only for a bundle
            that declares a single example.
        selected: The shape-set entries the stage serves (``StageContext.shapes``;
            empty: all the bundle declares).
        reference: The record of an independent reference run
            (:func:`edge_core.runtime.reference_run.reference_run`), when the stage asked
            for one: the bundle's hashed expected outputs are looked at first, then that run.
        manifest: The manifest the stage verified when it loaded (its bundle pin's:
            :meth:`~edge_core.artifacts.pins.BundleIdentities.manifest`); the expected
            outputs it names are hashed in ``manifest_dir`` against its sha256s, and one
            that differs — a bundle verified in place and rewritten since — is not
            counted. None: the manifest in ``manifest_dir`` is read.
    """
    found = _from_bundle(numerics, manifest_dir, buckets, selected, manifest)
    if found.label == COMPLETE_MODEL or reference is None:
        return found
    name = reference.get("reference")
    if reference.get("passed") is not True or not str(name).startswith("independent-run:"):
        return attrs.evolve(found, basis=f"{found.basis}; {name}: not compared or no match: "
                                         f"{reference.get('reason')}")
    if found.buckets.declared > 1:
        return attrs.evolve(found, basis=(
            f"{found.basis}; {name} compared the bundle's example inputs only, not each of "
            f"the {found.buckets.declared} declared buckets"))
    counts = BucketCounts(1, 1, 1, 1)
    return Evidence(COMPLETE_MODEL, (f"compared with {name}, a run of the bundle's example "
                                     "inputs on an independent runtime in a worker core "
                                     f"started, within the bound {reference.get('bound')}"),
                    counts)


def _from_bundle(numerics: Mapping[str, Any] | None, manifest_dir: Path | None,
                 buckets: Sequence[BucketWarmup], selected: Sequence[str],
                 verified: ArtifactManifest | None) -> Evidence:
    """The evidence from the warm-up's numerics and the bundle's hashed expected outputs."""
    # The counts come from the bundle whenever it can be read, whatever the label.
    counts = BucketCounts(0, len({b.entry for b in buckets}), 0, len(buckets))
    entries: list[_Entry] = []
    members: list[str] = []
    unreadable: str | None = None
    if manifest_dir is not None:
        try:
            manifest = verified if verified is not None else read_manifest(manifest_dir)[0]
            entries = _declared(manifest, selected)
            counts, members = _count(entries, manifest, manifest_dir, buckets, numerics)
        except (EdgeError, OSError, ValueError) as exc:
            unreadable = f"the bundle's expected outputs cannot be checked: {exc}"
    if not numerics or numerics.get("passed") is not True:
        return Evidence(BACKEND_EXECUTION, "no passing numerical check of the example bucket",
                        counts)
    reference = numerics.get("reference")
    if reference != EXPECTED_OUTPUTS:
        return Evidence(BACKEND_EXECUTION, f"the reference {reference!r} is not the bundle's "
                        "hashed expected outputs", counts)
    if manifest_dir is None:
        return Evidence(BACKEND_EXECUTION,
                        "expected outputs claimed, but the stage has no bundle", counts)
    if unreadable is not None:
        return Evidence(BACKEND_EXECUTION, unreadable, counts)
    if not any(m is not None for e in entries for m in e.expected):
        return Evidence(BACKEND_EXECUTION, "expected outputs claimed, but the manifest names "
                        "none (metadata.validation.expected_outputs or an example's "
                        "expected_outputs)", counts)
    tally = f"{counts.compared} of {counts.declared} declared bucket(s) compared"
    if counts.compared < counts.declared or counts.declared == 0:
        reasons = "; ".join(f"{name}: {why}" for name, why in counts.not_compared.items())
        return Evidence(BACKEND_EXECUTION, f"{tally}; not compared: {reasons}", counts)
    shown = ", ".join(members[:3]) + (f" and {len(members) - 3} more" if len(members) > 3
                                      else "")
    return Evidence(COMPLETE_MODEL, f"{tally} with {shown}, hashed member(s) of the "
                    "verified bundle", counts)


def evidence_label(numerics: Mapping[str, Any] | None, manifest_dir: Path | None,
                   reference: Mapping[str, Any] | None = None,
                   buckets: Sequence[BucketWarmup] = (),
                   selected: Sequence[str] = ()) -> tuple[str, str]:
    """The label and the reason for it (see :func:`evidence_of`)."""
    found = evidence_of(numerics, manifest_dir, buckets, selected, reference)
    return found.label, found.basis
