"""The loaded ORT stage on the controller side: bundle, worker, bucket, warm-up report.

Imported lazily by :mod:`edge_ort.plugin_base` hooks; never imports ``onnxruntime``.
Options and demands live in :mod:`edge_ort.options` (no numpy there, so probes and
option validation stay light); their names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from numpy import ndarray

from edge_contracts.errors import InvalidValue
from edge_contracts.heap import eager_process_environment
from edge_contracts.requests import StageEvent, StageRequest
from edge_contracts.shapesets import ShapeSet
from edge_core.artifacts import BundleChanged, VerifiedBundle, verify_once
from edge_core.artifacts.pins import check_loaded, member_changed
from edge_core.errors import ConfigError, ManifestInvalid
from edge_core.host.errors import RemoteError
from edge_core.host.retire import RetireOutcome
from edge_core.placement import (
    BucketWarmup,
    PlacementRefusal,
    PlacementReport,
    ProviderShare,
    WarmupReport,
)
from edge_core.shapes import select
from edge_core.stage import StageContext
from edge_core.workerstage import RETIRE_OUTCOME_ATTR, WorkerStage
from edge_ort.bucket import LoneAccepted, spec_of
from edge_ort.element_types import ElementTypeRefused
from edge_ort.epcontext import discard_written
from edge_ort.npz import ArchiveChanged
from edge_ort.options import (
    BASE_RAM_BYTES,
    BUNDLE_RAM_FACTOR,
    CPU,
    WORKER_ENTRY,
    OrtOptions,
    base_load_config,
    estimate_demands,
)
from edge_ort.preload import WORKER_PRELOAD

__all__ = [
    "BASE_RAM_BYTES",
    "BUNDLE_RAM_FACTOR",
    "CPU",
    "WORKER_ENTRY",
    "OrtOptions",
    "OrtStage",
    "archive_refusal",
    "base_load_config",
    "bucket_graphs",
    "element_type_refusal",
    "estimate_demands",
]

def _shares(providers: Mapping[str, Any]) -> dict[str, ProviderShare]:
    return {name: ProviderShare(nodes=int(v["nodes"]), op_types=dict(v["op_types"]),
                                node_names=list(v["node_names"]))
            for name, v in providers.items()}


def bucket_graphs(bundle: VerifiedBundle, served: ShapeSet | None,
                  stage_id: str) -> dict[str, str]:
    """Served static entry -> the path of its own graph (``validation.bucket_graphs``).

    A derived bundle (``edge derive``) holds a static copy of the graph per bucket; the
    worker loads each bucket's session from its copy. Each named graph must be a
    verified member and name a static entry of the shape set.

    Raises:
        ManifestInvalid: ``bucket_graphs`` is not a mapping, names an unknown entry, or a
            file that is not a verified member.
    """
    declared = (bundle.manifest.metadata.validation or {}).get("bucket_graphs")
    if declared is None:
        return {}
    field = f"stages[{stage_id}].manifest.metadata.validation.bucket_graphs"
    if not isinstance(declared, Mapping) or served is None:
        raise ManifestInvalid(f"{field}: must map static shape-set entries to graph "
                              f"members: {declared!r}")
    static = {entry.name for entry in served.entries if entry.static}
    known = {entry.name for entry in bundle.shapes.entries} if bundle.shapes else set()
    found: dict[str, str] = {}
    for name, member in declared.items():
        if name not in known:
            raise ManifestInvalid(f"{field}.{name}: names no entry of the shape set: {name!r}")
        if name not in static:
            continue  # the stage selected a subset of the shape set
        found[str(name)] = str(bundle.path(str(member)))
    return found


def warmup_reads(bundle: VerifiedBundle, member: str | None,
                 key: str) -> dict[str, str | None]:
    """``{key: path, key_sha256: sha256}`` of a member the worker reads at its warm-up.

    The sha256 is the one the verified manifest gives ``member``: the worker hashes the
    bytes it reads and parses only those (:func:`edge_ort.npz.load_npz`), so that a file
    rewritten since the verification (a bundle verified in place) is refused, never run.
    """
    if member is None:
        return {key: None, f"{key}_sha256": None}
    return {key: str(bundle.path(member)), f"{key}_sha256": bundle.manifest.files[member]}


def archive_refusal(bundle: VerifiedBundle, read_at_warmup: Mapping[str, str], stage_id: str,
                    error: RemoteError) -> BundleChanged:
    """The refusal of the file a worker's ``ArchiveChanged`` (``error``) names.

    Read from the error's fields as the worker sent them (``error.remote_detail``: the
    file's path and the sha256 of the bytes it read), never out of its message:
    :func:`~edge_core.artifacts.pins.member_changed` of the member at that path
    (``read_at_warmup``: path → member), naming the manifest and both its sha256s when
    the bundle was rewritten, else the file. An error without those fields, or naming a
    file the warm-up does not read, is refused naming the stage's manifest, with the
    worker's message as the value.
    """
    detail = error.remote_detail
    member = read_at_warmup.get(detail.field) if detail is not None else None
    if detail is not None and member is not None and isinstance(detail.value, str):
        return member_changed(bundle, member, detail.value)
    return BundleChanged(f"stages[{stage_id}].manifest",
                         "a file the warm-up read is not the one verified", str(error.value))


def element_type_refusal(error: RemoteError, stage_id: str) -> ElementTypeRefused | None:
    """The stage's refusal of what a worker's ``ElementTypeRefused`` (``error``) names.

    Read from the error's fields as the worker sent them (``error.remote_detail``), never
    out of its message: the same type, its field under the stage's manifest
    (``stages[s].manifest.metadata.graph.inputs.x``,
    ``stages[s].manifest.metadata.example_inputs.x``,
    ``stages[s].manifest.metadata.validation.shapes.<entry>.example_inputs.x``), the same
    type refused and reason.
    None for any other error, or one without those fields.
    """
    detail = error.remote_detail
    if error.remote_type != ElementTypeRefused.__name__ or detail is None:
        return None
    return ElementTypeRefused(f"stages[{stage_id}].manifest.metadata.{detail.field}",
                              detail.value, detail.reason)


class OrtStage(WorkerStage):
    """A loaded ORT stage: the worker, the verified bundle and the shapes it serves."""

    worker_preload = WORKER_PRELOAD  # its zygote's import (telemetry off), not each worker's

    bundle: VerifiedBundle
    shapes: ShapeSet | None = None
    read_at_warmup: Mapping[str, str] = {}
    """Path the worker reads at its warm-up → its member (for a refusal)."""
    numerics_bound: Mapping[str, float] = {}
    gate_timeout_s: float | None = None
    _accepted: LoneAccepted | None = None
    """The last lone input :attr:`shapes` accepted (what :meth:`run` accepts again)."""

    @classmethod
    def open(cls, stage: StageContext, load_config: Mapping[str, Any],
             device_id: str | None) -> OrtStage:
        """Verify the bundle, start the worker and load; refuse an absent target provider.

        Raises:
            ElementTypeRefused: an input or output of the graph has a tensor type the
                stage does not carry (:mod:`edge_ort.element_types`): the worker is
                retired; the field names it under the stage's manifest.
            BundleChanged: the bundle, verified in place, changed before the worker's load
                of it ended (:func:`edge_core.artifacts.pins.check_loaded`): the worker is
                retired, and the EP-context cache entries its load wrote are removed
                (keyed by the sha256s verified, compiled from what the worker read).
        """
        if stage.manifest_dir is None:
            raise ManifestInvalid(f"stages[{stage.stage_id}].manifest: an ONNX Runtime stage "
                                  "needs an artifact bundle: None")
        options: OrtOptions = stage.options or OrtOptions()
        # shared by the stage's replicas while the pipeline opens (verify_once)
        bundle = verify_once(stage.manifest_dir, stage=options.stage_bundle)
        try:
            served, cases = (bundle.shapes, bundle.warmup_cases)
            if served is not None:
                served, cases = select(served, cases, stage.shapes,
                                       f"stages[{stage.stage_id}].shapes")
            elif stage.shapes:
                raise ConfigError(f"stages[{stage.stage_id}].shapes",
                                  "the bundle declares no shape set to choose from",
                                  list(stage.shapes))
            validation = bundle.manifest.metadata.validation or {}
            bound = {**dict(validation.get("bound") or {}), **options.numerics_bound}
            config = {
                **load_config,
                "graph": str(bundle.graph),
                # the EP-context key reads each file's sha256 from the verified manifest
                **({"bundle_manifest": {"directory": str(bundle.directory),
                                        "sha256": bundle.manifest_sha256}}
                   if load_config.get("ep_context") else {}),
                **warmup_reads(bundle, bundle.manifest.metadata.example_inputs,
                               "example_inputs"),
                **warmup_reads(bundle, bundle.references.expected_outputs,
                               "expected_outputs"),
                "numerics_bound": bound,
                "shape_set": served.to_json() if served is not None else None,
                "bucket_graphs": bucket_graphs(bundle, served, stage.stage_id),
                "warmup_cases": [
                    {"entry": case.entry, "point": case.point, "field": case.field,
                     **warmup_reads(bundle, case.example_inputs, "example_inputs"),
                     **warmup_reads(bundle, case.expected_outputs, "expected_outputs")}
                    for case in cases
                    if stage.gate_points == "all" or case.point in ("static",
                                                                     stage.gate_points)
                ],
            }
            read = {str(bundle.path(member)): member for member in (
                bundle.manifest.metadata.example_inputs, bundle.references.expected_outputs,
                *(m for c in cases for m in (c.example_inputs, c.expected_outputs)))
                if member is not None}
            if config["example_inputs"] is None:
                raise ManifestInvalid(
                    f"stages[{stage.stage_id}].manifest.metadata.example_inputs: the bundle "
                    "names no example inputs, which the warm-up gate runs (give them: edge "
                    "manifest create DIR --example-inputs FILE --force): None")
            bundle.ensure_unchanged()
            loaded = cls.start(stage, default_entry=WORKER_ENTRY, load_config=config,
                               stage_packages=("edge_ort",), device_id=device_id,
                               env=eager_process_environment(),
                               manifest=bundle.describe(),
                               load_timeout_s=options.gate_timeout_s or 600.0)
            loaded.gate_timeout_s = options.gate_timeout_s
            loaded.read_at_warmup = read
        except RemoteError as error:  # the worker is retired (WorkerStage.start)
            bundle.cleanup()
            refused = element_type_refusal(error, stage.stage_id)
            if refused is None:
                raise
            raise refused from error
        except BaseException:
            bundle.cleanup()
            raise
        loaded.bundle = bundle
        try:  # in place: what the worker opened is what was verified (a stat per file)
            check_loaded(bundle)
        except BundleChanged as changed:
            outcome = loaded.retire()  # and the bundle's handle with it
            changed.add_note(f"refused once the worker had loaded; worker retired: "
                             f"verified={outcome.verified}")
            # compiled from what the worker read, keyed by what was verified: never reused
            removed = discard_written(loaded.load_report)
            if removed:
                changed.add_note(f"EP-context cache entries it wrote removed: {removed}")
            setattr(changed, RETIRE_OUTCOME_ATTR, outcome)
            raise
        report = loaded.load_report
        if not report.get("target_available", False):
            placement = PlacementReport(
                target=str(report.get("target")),
                available_providers=list(report.get("available_providers", [])),
                providers={}, method="load",
            )
            outcome = loaded.retire()
            refusal = PlacementRefusal(
                stage.stage_id,
                f"requested provider {placement.target!r} is not available in this "
                f"onnxruntime build (available: {list(placement.available_providers)}); "
                "ONNX Runtime would only warn and run on CPU",
                placement,
            )
            refusal.add_note(f"worker retired: verified={outcome.verified}")
            setattr(refusal, RETIRE_OUTCOME_ATTR, outcome)
            raise refusal
        return loaded

    def warm_up(self) -> WarmupReport:
        """Run every bucket of the shape set in the worker; build the report core gates on.

        Raises:
            ElementTypeRefused: an example array's dtype is not its graph input's (field
                ``stages[s].manifest.metadata.example_inputs.<name>``, or a declared
                case's ``...metadata.validation.shapes.<entry>.example_inputs.<name>``).
            BundleChanged: an example or expected-outputs file the worker read is not the
                one verified (a bundle verified in place, rewritten since): naming the
                manifest and both its sha256s when it was rewritten, else the file.
        """
        try:
            answer = self.warmup(timeout_s=self.gate_timeout_s or 600.0)
        except RemoteError as error:
            refused = element_type_refusal(error, self.context.stage_id)
            if refused is not None:
                raise refused from error
            if error.remote_type != ArchiveChanged.__name__:
                raise
            raise archive_refusal(self.bundle, self.read_at_warmup,
                                  self.context.stage_id, error) from error
        placement = answer["placement"]
        notes = list(self.load_report.get("warnings", []))

        def report_of(providers: Mapping[str, Any]) -> PlacementReport:
            return PlacementReport(
                target=str(placement["target"]),
                available_providers=list(placement["available_providers"]),
                providers=_shares(providers), method=str(placement["method"]), notes=notes)

        self.shapes = ShapeSet.from_json(answer["shape_set"])
        buckets = tuple(
            BucketWarmup(entry=str(b["entry"]), point=str(b["point"]),
                         shapes={n: tuple(s) for n, s in b["shapes"].items()},
                         placement=report_of(answer["placements"][b["session"]]),
                         numerics=b["numerics"],
                         warmup_ms=float(b["warmup_ms"]))
            for b in answer["buckets"]
        )
        first = answer["buckets"][0]
        extra = {"bucket": {n: {"shape": s} for n, s in first["shapes"].items()},
                 "buckets": len(buckets), "warmup_ms": answer["warmup_ms"],
                 "session_providers": placement["session_providers"],
                 "bucket_sessions": self.load_report.get("bucket_sessions"),
                 "load_ms": self.load_report.get("load_ms")}
        return WarmupReport(placement=report_of(placement["providers"]),
                            numerics=answer["numerics"], extra=extra, buckets=buckets,
                            shapes=self.shapes)

    def run(self, request: StageRequest,
            inputs: Mapping[str, Any]) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
        """Refuse inputs outside every served shape before anything is sent.

        A lone array whose name, dtype and shape are the last lone array's that
        :attr:`shapes` accepted is accepted again without matching (:class:`LoneAccepted`).
        """
        shapes = self.shapes
        if shapes is not None:
            accepted = self._accepted
            if len(inputs) == 1:
                ((name, array),) = inputs.items()
                if (accepted is not None and type(array) is ndarray
                        and accepted.shapes is shapes and accepted.name == name
                        and array.shape == accepted.shape and array.dtype == accepted.dtype):
                    return self.call(request, inputs)
            specs = {}
            for name, array in inputs.items():  # a loop, not a comprehension: no call on 3.11
                try:
                    specs[name] = spec_of(array)
                except InvalidValue as exc:  # a dtype the wire does not carry: name the input
                    raise InvalidValue(f"inputs.{name}.{exc.field}", exc.value,
                                       exc.reason) from None
            entry = shapes.match(specs)
            if len(specs) == 1 and type(array) is ndarray:
                self._accepted = LoneAccepted(shapes, name, array, entry)
        return self.call(request, inputs)

    def retire(self, deadline_s: float = 5.0) -> RetireOutcome:
        """Retire the worker, then remove the staged copy of the bundle."""
        try:
            return super().retire(deadline_s)
        finally:
            bundle = getattr(self, "bundle", None)
            if bundle is not None:
                bundle.cleanup()
