"""``edge derive qnn-static|qnn-qdq BUNDLE --bucket ... --out DIR``: derived bundles for QNN.

Registered by the qnn plugin through ``edge_register_commands``; registration imports
nothing heavy (onnx and onnxruntime are imported when the command runs). Progress goes to
stderr, the result to stdout (``--json``: one JSON document).

Exit codes: 0 the bundle was written and verified; 1 the derivation was refused (a static
copy differs from the source, a QDQ copy exceeds its bound, ONNX Runtime failed); 2 bad
input (a bucket spec, a bundle that does not verify or whose graph is not ONNX, an
existing ``--out``, calibration data). Nothing is left at ``--out`` unless the exit code
is 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Literal

__all__ = ["NAME", "register", "run"]

NAME = "derive"

_BUCKET_HELP = ("a static bucket: [NAME:]DIMS for a one-input graph (b0:1x3x48x192) or "
                "[NAME:]INPUT=DIMS[,INPUT=DIMS]; repeat for several buckets")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, metavar="BUNDLE",
                        help="the source bundle (fp32, may be dynamic)")
    parser.add_argument("--bucket", action="append", default=[], required=True,
                        metavar="BUCKET", help=_BUCKET_HELP)
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the derived bundle's directory (must not exist)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def register(subparsers: Any) -> None:
    """Add ``edge derive`` and its subcommands."""
    from edge_core.cli.common import add_command

    parser = add_command(
        subparsers, NAME, "derive a bundle for a device: static-shape copies per bucket, "
        "QDQ quantisation (written and verified like any bundle)",
        "Derive a new artifact bundle from an fp32 one, for a device that needs it: "
        "'qnn-static' writes one static-shape copy of the graph per bucket, 'qnn-qdq' also "
        "quantises them. The derived bundle is written, hashed and verified like any other, "
        "its outputs checked against the source graph's. Exit 0 written, 1 refused, 2 bad "
        "arguments.",
        "edge derive qnn-static build/ocr/classify --bucket 4x3x48x192 "
        "--out build/ocr/classify-qnn")
    commands = parser.add_subparsers(dest="derive_command", required=True, metavar="KIND",
                                     title="kinds")
    static = add_command(
        commands, "qnn-static", "one static copy of the graph per bucket (QNN compiles "
        "fixed shapes only); outputs checked against the source graph",
        "Write one static-shape copy of the source graph per --bucket; each copy's outputs "
        "on the bucket's example are checked against the source graph's.",
        "edge derive qnn-static build/ocr/classify --bucket 4x3x48x192 "
        "--out build/ocr/classify-qnn")
    _common(static)
    qdq = add_command(
        commands, "qnn-qdq", "static copies per bucket, QDQ-quantised (uint8) with "
        "calibration data; its error against the fp32 reference is recorded as its bound",
        "Write one static, QDQ-quantised (uint8) copy of the source graph per --bucket, "
        "calibrated on --calibration data; the error against the fp32 reference becomes "
        "the bundle's numerics bound.",
        "edge derive qnn-qdq build/ocr/classify --bucket 4x3x48x192 --out classify-qdq")
    _common(qdq)
    qdq.add_argument("--calibration", type=Path, action="append", default=[], metavar="PATH",
                     help=".npz files (arrays named like the graph's inputs), images, or "
                     "directories of them (default: the bundle's own examples)")
    qdq.add_argument("--preprocess", default=None, metavar="MODULE:FUNCTION",
                     help="turns an HxWx3 uint8 image into {input: array} (needed for "
                     "images; default: none)")
    qdq.add_argument("--bound", default=None, metavar="BOUND",
                     help="max_abs_error=X[,normalised_error=Y] against the fp32 reference "
                     "(default: twice the largest error measured, at least 0.001)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run one ``edge derive`` command; 0 written, 1 refused, 2 bad input."""
    from edge_core.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, print_json
    from edge_core.errors import ConfigError, EdgeError, ManifestInvalid
    from edge_ort.derive.specs import DeriveFailed, parse_bound, parse_bucket

    def say(text: str) -> None:
        if not args.quiet:
            print(f"edge derive: {text}", file=sys.stderr, flush=True)

    kind: Literal["static", "qdq"] = "qdq" if args.derive_command == "qnn-qdq" else "static"
    try:
        buckets = [parse_bucket(text, i) for i, text in enumerate(args.bucket)]
        bound = parse_bound(getattr(args, "bound", None))
        from edge_ort.derive.build import derive_bundle

        derived = derive_bundle(args.bundle, args.out, buckets, kind=kind,
                                calibration=list(getattr(args, "calibration", [])),
                                preprocess=getattr(args, "preprocess", None), bound=bound,
                                say=say)
    except (ConfigError, ManifestInvalid, OSError) as exc:
        return _failed(args, exc, EXIT_USAGE)
    except (DeriveFailed, EdgeError) as exc:
        return _failed(args, exc, EXIT_FAILED)
    if args.json:
        print_json({"ok": True, **derived.to_json()})
    else:
        print(f"{derived.out}: {derived.component} ({derived.kind}), manifest sha256 "
              f"{derived.manifest_sha256}")
        for bucket in derived.buckets:
            dims = ", ".join(f"{n}: {'x'.join(map(str, d))}" for n, d in bucket.shapes.items())
            line = (f"  {bucket.name}{{{dims}}}: {bucket.graph}, static vs source max_abs_error "
                    f"{bucket.static_check['max_abs_error']:.3g}")
            if bucket.qdq_check is not None:
                line += f", QDQ vs fp32 max_abs_error {bucket.qdq_check['max_abs_error']:.3g}"
            print(line)
        if derived.bound:
            print(f"  bound (validation.bound): {derived.bound}")
    return EXIT_OK


def _failed(args: argparse.Namespace, exc: BaseException, code: int) -> int:
    from edge_core.cli.common import print_json

    message = f"{type(exc).__name__}: {exc}"
    if args.json:
        print_json({"ok": False, "error": message, "exit_code": code})
    else:
        print(f"edge derive: {message}", file=sys.stderr)
    return code
