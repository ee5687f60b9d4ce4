"""Write a derived bundle: static copies of a graph per bucket, optionally QDQ-quantised.

For every bucket the source graph (fp32, dynamic) is copied with each input's shape
fixed (``onnxruntime.tools.onnx_model_utils.make_input_shape_fixed``, then
``fix_output_shapes``: the functions behind ``python -m
onnxruntime.tools.make_dynamic_shape_fixed``). Its example is one of the source bundle's
examples (cut or edge-padded to the bucket), its expected outputs are the source graph's
own on the CPU (the fp32 reference). The static copy must reproduce them within the
default bound before anything is kept. For ``qdq`` each static copy is then quantised
(QNN's QDQ configuration: uint8 activations and weights, MinMax calibration) and its
error against the fp32 reference is measured and recorded; the bundle's bound is the one
given, else twice the largest measured error (at least 1e-3), and the derivation is
refused when a measurement exceeds it.

Everything is written into a private directory beside ``out``, hashed into a manifest
(:func:`edge_core.artifacts.create_manifest`), verified like any bundle, then renamed to
``out``; on any failure the private directory is removed and ``out`` never appears.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edge_core.artifacts import VerifiedBundle, create_manifest, verify_bundle
from edge_core.progress import Progress
from edge_ort.derive.data import Sample, bundle_samples, calibration_samples, fit_sample
from edge_ort.derive.specs import BucketSpec, DeriveFailed, DeriveInputError, check_buckets
from edge_ort.numerics import DEFAULT_BOUND, compare_outputs

__all__ = ["CPU", "Derived", "DerivedBucket", "derive_bundle"]

CPU = "CPUExecutionProvider"
Kind = Literal["static", "qdq"]
_BOUND_FLOOR = 1e-3


@dataclass(frozen=True)
class DerivedBucket:
    """One bucket of a derived bundle, as recorded in its manifest."""

    name: str
    shapes: Mapping[str, tuple[int, ...]]
    graph: str
    example_source: str
    static_check: Mapping[str, Any]
    qdq_check: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``validation.derived.buckets[i]``)."""
        return {"name": self.name, "graph": self.graph,
                "shapes": {n: list(s) for n, s in self.shapes.items()},
                "example_from": self.example_source,
                "static_vs_source": dict(self.static_check),
                "qdq_vs_fp32": dict(self.qdq_check) if self.qdq_check is not None else None}


@dataclass(frozen=True)
class Derived:
    """What :func:`derive_bundle` wrote."""

    out: Path
    kind: str
    component: str
    manifest_sha256: str
    buckets: tuple[DerivedBucket, ...]
    bound: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``edge derive --json``."""
        return {"out": str(self.out), "kind": self.kind, "component": self.component,
                "manifest_sha256": self.manifest_sha256, "bound": dict(self.bound),
                "buckets": [b.to_json() for b in self.buckets]}


def _cpu_session(graph: Path | bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    source = graph if isinstance(graph, bytes) else str(graph)
    return ort.InferenceSession(source, options, providers=[CPU])


def _run(session: Any, sample: Sample) -> Sample:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, sample), strict=True))


def _graph_inputs(model: Any) -> dict[str, list[int | str | None]]:
    initializers = {i.name for i in model.graph.initializer}
    found: dict[str, list[int | str | None]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims: list[int | str | None] = []
        for dim in value.type.tensor_type.shape.dim:
            dims.append(dim.dim_value if dim.dim_value > 0 else (dim.dim_param or None))
        found[value.name] = dims
    return found


def _static_copy(model: Any, bucket: BucketSpec) -> Any:
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes, make_input_shape_fixed

    copy = type(model)()
    copy.CopyFrom(model)
    # A symbolic name several axes of different sizes share (PaddlePaddle exports call
    # every such axis "?") cannot be fixed by name: the input's own axes get unique
    # names first (labels only; other tensors keep theirs).
    for value in copy.graph.input:
        if value.name in bucket.shapes:
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.dim_value <= 0:
                    dim.dim_param = f"edge_derive_{value.name}_{axis}"
    for name, shape in bucket.shapes.items():
        make_input_shape_fixed(copy.graph, name, list(shape))
    fix_output_shapes(copy)
    return copy


def _example_for(bucket: BucketSpec, samples: Sequence[tuple[str, Sample]]) -> tuple[str, Sample]:
    for member, sample in samples:
        if all(n in sample and tuple(sample[n].shape) == s for n, s in bucket.shapes.items()):
            return member, fit_sample(sample, bucket.shapes)
    member, sample = samples[0]
    return f"{member} (cut or edge-padded to the bucket)", fit_sample(sample, bucket.shapes)


def _quantise(fp32: Path, target: Path, calibration: list[Sample]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._batches: Iterator[Sample] = iter(calibration)

        def get_next(self) -> Sample | None:
            return next(self._batches, None)

    config = get_qnn_qdq_config(str(fp32), _Reader(), activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QUInt8)
    quantize(str(fp32), str(target), config)


def _onnx_graph(onnx: Any, bundle: VerifiedBundle) -> Any:
    """The bundle's graph as an ONNX model; one that is not ONNX is refused naming it.

    A bundle may name any file as its graph (a backend that does not run ONNX); only an
    ONNX graph with inputs can be derived from.
    """
    import importlib

    # what onnx.load raises on bytes that are not a model: protobuf's, onnx's dependency
    # (imported by name: it ships no type stubs)
    decode_error = importlib.import_module("google.protobuf.message").DecodeError
    where = "BUNDLE: metadata.graph"
    try:
        model = onnx.load(str(bundle.graph))
    except decode_error as exc:
        raise DeriveInputError(where, f"not an ONNX model, which edge derive needs ({exc})",
                               str(bundle.graph)) from None
    if not model.HasField("graph") or not model.graph.input:
        raise DeriveInputError(where, "not an ONNX model with a graph and its inputs, which "
                               "edge derive needs", str(bundle.graph))
    return model


def _check_out(out: Path) -> None:
    if os.path.lexists(out):
        raise DeriveInputError("--out", "already exists; a derived bundle is never written "
                               "over anything", str(out))
    if not out.parent.is_dir():
        raise DeriveInputError("--out", "its parent directory does not exist", str(out))


def _bound_for(kind: Kind, given: Mapping[str, float],
               checks: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    if kind == "static":
        return dict(given)
    if given:
        return dict(given)
    worst = {key: max(float(c[key]) for c in checks) for key in DEFAULT_BOUND}
    return {key: max(_BOUND_FLOOR, 2.0 * value) for key, value in worst.items()}


def derive_bundle(
    source: Path,
    out: Path,
    buckets: Sequence[BucketSpec],
    *,
    kind: Kind = "static",
    calibration: Sequence[Path] = (),
    preprocess: str | None = None,
    bound: Mapping[str, float] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Derived:
    """Derive a bundle from ``source`` into ``out`` (which must not exist).

    Raises:
        DeriveInputError: a bad bucket, ``out`` exists or has no parent, the bundle's
            graph is not an ONNX model, unusable calibration data.
        ManifestInvalid: ``source`` is not a verified bundle (a ``BundleRefused``).
        DeriveFailed: a static copy differs from the source graph, a QDQ copy exceeds
            the bound, or ONNX Runtime cannot fix or quantise the graph.
    """
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as exc:  # the derive extra, or the backend's onnxruntime, is missing
        raise DeriveInputError(
            "environment", "edge derive needs this module: install the backend's derive "
            "extra (for example 'edge-qnn[derive]')", exc.name) from None

    _check_out(out)
    bundle = verify_bundle(source, stage=False)
    say(f"verified {bundle.component} ({bundle.total_bytes} bytes)")
    model = _onnx_graph(onnx, bundle)
    resolved = check_buckets(buckets, _graph_inputs(model))
    samples = bundle_samples(bundle)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.derive-", dir=out.parent))
    work = Path(tempfile.mkdtemp(prefix="edge-derive-"))
    try:
        derived = _derive_into(staging, work, bundle, model, resolved, samples, kind,
                               calibration, preprocess, dict(bound or {}), say)
        create_manifest(staging, **derived.pop("manifest"),
                        progress=Progress("hashing", min_total=32 * 1024**2))
        verified = verify_bundle(staging, stage=False)
        digest = verified.manifest_sha256
        verified.cleanup()
        staging.chmod(0o755)  # mkdtemp made it private; a bundle is read by others
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"wrote {out} (onnxruntime {ort.__version__})")
    return Derived(out=out, kind=kind, component=verified.component, manifest_sha256=digest,
                   buckets=derived["buckets"], bound=derived["bound"])


def _derive_into(staging: Path, work: Path, bundle: VerifiedBundle, model: Any,
                 buckets: list[BucketSpec], samples: list[tuple[str, Sample]], kind: Kind,
                 calibration: Sequence[Path], preprocess: str | None,
                 given: dict[str, float], say: Callable[[str], None]) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    reference = _cpu_session(bundle.graph)
    calibration_set = (list(calibration_samples(list(calibration), preprocess))
                       if calibration else [s for _, s in samples])
    (staging / "buckets").mkdir()
    (staging / "examples").mkdir()
    done: list[DerivedBucket] = []
    shapes: list[dict[str, Any]] = []
    qdq_checks: list[Mapping[str, Any]] = []
    for number, bucket in enumerate(buckets, 1):
        say(f"[{number}/{len(buckets)}] bucket {bucket.text()}: fixing shapes")
        member = f"buckets/{bucket.name}.onnx"
        fp32 = (staging if kind == "static" else work) / member
        fp32.parent.mkdir(parents=True, exist_ok=True)
        try:
            onnx.save(_static_copy(model, bucket), str(fp32))
            static = _cpu_session(fp32)
        except (ValueError, RuntimeError, onnx.checker.ValidationError) as exc:
            raise DeriveFailed(f"bucket {bucket.text()}: the static copy cannot be made or "
                               f"loaded: {type(exc).__name__}: {exc}") from exc
        origin, example = _example_for(bucket, samples)
        expected = _run(reference, example)
        static_check = compare_outputs(_run(static, example), expected, DEFAULT_BOUND)
        if not static_check["passed"]:
            raise DeriveFailed(f"bucket {bucket.text()}: the static copy's outputs differ "
                               f"from the source graph's beyond {DEFAULT_BOUND}: "
                               f"max_abs_error {static_check['max_abs_error']}")
        qdq_check = None
        if kind == "qdq":
            say(f"[{number}/{len(buckets)}] bucket {bucket.name}: quantising (QDQ uint8, "
                f"{len(calibration_set)} calibration batch(es))")
            fitted = [fit_sample(s, bucket.shapes) for s in calibration_set]
            try:
                _quantise(fp32, staging / member, fitted)
            except (ValueError, RuntimeError, KeyError) as exc:
                raise DeriveFailed(f"bucket {bucket.text()}: quantisation failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
            qdq = _cpu_session(staging / member)
            qdq_check = compare_outputs(_run(qdq, example), expected, {
                "max_abs_error": float("inf"), "normalised_error": float("inf")})
            if not qdq_check["passed"]:
                raise DeriveFailed(f"bucket {bucket.text()}: the QDQ graph's outputs do not "
                                   f"match the fp32 reference's names, shapes or NaNs: "
                                   f"{qdq_check['outputs']}")
            qdq_checks.append(qdq_check)
        stem = f"examples/{bucket.name}"
        np.savez(staging / f"{stem}.npz", **example)  # type: ignore[arg-type]
        np.savez(staging / f"{stem}.expected.npz", **expected)  # type: ignore[arg-type]
        shapes.append({"name": bucket.name, "inputs": {
            n: {"dtype": str(example[n].dtype), "dims": list(s)}
            for n, s in bucket.shapes.items()},
            "examples": [{"example_inputs": f"{stem}.npz",
                          "expected_outputs": f"{stem}.expected.npz"}]})
        done.append(DerivedBucket(bucket.name, bucket.shapes, member, origin,
                                  _brief(static_check), _brief(qdq_check)
                                  if qdq_check is not None else None))
    bound = _bound_for(kind, given, qdq_checks)
    for made in done:
        if made.qdq_check is not None and any(
                float(made.qdq_check[k]) > bound[k] for k in bound):
            raise DeriveFailed(f"bucket {made.name}: the QDQ graph's error against the "
                               f"fp32 reference {dict(made.qdq_check)} exceeds the bound "
                               f"{bound}")
    source_manifest = bundle.source / "edge-manifest.json"
    validation: dict[str, Any] = {
        "shapes": shapes,
        "bucket_graphs": {b.name: b.graph for b in done},
        "reference": f"onnxruntime {ort.__version__} {CPU}: the source graph (fp32, dynamic)",
        "derived": {
            "kind": kind,
            "tool": "edge derive (onnxruntime.tools.onnx_model_utils"
                    + (", onnxruntime.quantization QNN QDQ config" if kind == "qdq" else "")
                    + ")",
            "source": {"component": bundle.component,
                       "manifest_sha256": hashlib.sha256(
                           source_manifest.read_bytes()).hexdigest(),
                       "graph": bundle.manifest.metadata.graph},
            "buckets": [b.to_json() for b in done],
        },
    }
    if bound:
        validation["bound"] = bound
    first = shapes[0]["examples"][0]
    metadata = bundle.manifest.metadata
    manifest = {
        "component": f"{bundle.component}-{'qnn-qdq' if kind == 'qdq' else 'qnn-static'}",
        "graph": done[0].graph,
        "example_inputs": first["example_inputs"],
        "expected_outputs": first["expected_outputs"],
        "checkpoint_revision": metadata.checkpoint_revision,
        "precision": "uint8 QDQ (activations and weights)" if kind == "qdq" else "float32",
        "layout": metadata.layout,
        "exporter": f"edge derive {kind} from {bundle.component} (onnxruntime "
                    f"{ort.__version__}, onnx {onnx.__version__})",
        "calibration": ({"method": "MinMax", "batches": len(calibration_set),
                         "data": "given files" if calibration else "the source's examples"}
                        if kind == "qdq" else None),
        "validation": validation,
    }
    return {"manifest": manifest, "buckets": tuple(done), "bound": bound}


def _brief(check: Mapping[str, Any]) -> dict[str, Any]:
    return {"max_abs_error": check["max_abs_error"],
            "normalised_error": check["normalised_error"]}
