"""``edge manifest create|verify``: write an artifact bundle's manifest, or verify a bundle.

Exit codes: 0 ok; 1 ``verify`` refused the bundle (the message names field, reason and
value); 2 bad input: DIR is not a directory, ``--calibration``/``--validation`` is not a
JSON object, a file argument that names no file inside DIR (the option, DIR's files and
the closest one named), or ``create`` refused the bundle it was given (a manifest already there
without ``--force``, a file named ``.onnx`` that is not an ONNX model, or any other
refusal, named as ``verify`` names it). Hashing shows a progress line on stderr for
bundles of at least 8 MiB when stderr is a terminal (``EDGE_PROGRESS=1`` forces it);
never under ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from edge_core.progress import Progress

NAME = "manifest"

PROGRESS_MIN_BYTES = 8 << 20
"""Bundles smaller than this hash without a progress line."""


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``manifest`` command with its ``create`` and ``verify`` subcommands."""
    parser = common.add_command(
        sub, NAME, "create or verify an artifact bundle's manifest",
        "An artifact bundle is a folder with a model graph, example inputs and a manifest "
        "of every file's SHA-256; a stage loads only a bundle that verifies. 'create' "
        "writes the manifest, 'verify' checks a folder against it. Exit 1 when 'verify' "
        "refuses a bundle (the message names the field, the reason and the value), 2 for a "
        "usage or input problem, which includes every bundle 'create' refuses (one that "
        "already has a manifest without --force, a file named .onnx that is not an ONNX "
        "model).",
        "edge manifest create models/net --example-inputs x.npz",
        "edge manifest verify models/net")
    actions = parser.add_subparsers(dest="manifest_action", metavar="ACTION", required=True,
                                    title="actions")

    create = common.add_command(
        actions, "create", "hash every file of DIR and write DIR/edge-manifest.json",
        "Hash every file of DIR and write DIR/edge-manifest.json. File arguments are paths "
        "inside DIR (relative to DIR, or to the working directory). The ONNX Runtime "
        "backends load a bundle only with example inputs, which their warm-up gate runs "
        "(another backend decides for itself): give --example-inputs (and "
        "--expected-outputs to compare its outputs too). The graph may be any file (a "
        "backend that does not run ONNX reads its own format), but every file named .onnx "
        "(any case), the graph or not, must be an ONNX model with a graph that has an input "
        "and an output. Exit 2, writing "
        "nothing, for a refused bundle or when DIR already has a manifest (--force replaces "
        "it).",
        "edge manifest create models/net --example-inputs x.npz",
        "edge manifest create models/net --example-inputs x.npz --expected-outputs y.npz "
        "--precision float32")
    create.add_argument("directory", metavar="DIR", help="the bundle directory")
    create.add_argument("--component", metavar="NAME",
                        help="the bundle's component name (default: the name of DIR)")
    create.add_argument("--graph", metavar="FILE",
                        help="the model graph (default: the only file in DIR named .onnx, "
                        "in any case): any file, but every file named .onnx must be an ONNX "
                        "model")
    create.add_argument("--example-inputs", metavar="FILE",
                        help=".npz of example inputs, by input name: what the warm-up gate "
                        "runs (the ONNX Runtime backends refuse a bundle without them)")
    create.add_argument("--expected-outputs", metavar="FILE",
                        help=".npz of reference outputs for the example inputs (recorded in "
                        "validation; the gate compares against them)")
    for name in ("checkpoint-revision", "precision", "layout", "exporter"):
        create.add_argument(f"--{name}", metavar="TEXT",
                            help=f"recorded as the manifest's {name.replace('-', '_')}")
    create.add_argument("--calibration", metavar="JSON",
                        help="a JSON object recorded as the calibration")
    create.add_argument("--validation", metavar="JSON",
                        help="a JSON object recorded as the validation")
    create.add_argument("--force", action="store_true",
                        help="replace DIR's manifest if it has one (without it, an existing "
                        "manifest is refused, exit 2)")
    common.add_json_flag(create)
    create.set_defaults(func=run)

    verify = common.add_command(
        actions, "verify", "verify DIR against its manifest (hashes, paths, references)",
        "Check every file of DIR against DIR/edge-manifest.json: hashes, paths inside the "
        "folder (no symbolic link escapes), the members the metadata references. Files not "
        "listed are named (they are never loaded).",
        "edge manifest verify build/ocr/detect")
    verify.add_argument("directory", metavar="DIR", help="the bundle directory")
    common.add_json_flag(verify)
    verify.set_defaults(func=run)


def _json_object(text: str | None, option: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise common.CommandFailed(common.EXIT_USAGE,
                                   f"{option}: must be a JSON object ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise common.CommandFailed(common.EXIT_USAGE,
                                   f"{option}: must be a JSON object: {text!r}")
    return value


def _progress(args: argparse.Namespace, label: str) -> Progress:
    from edge_core.progress import Progress

    enabled = False if args.json else None
    return Progress(label, stream=sys.stderr, enabled=enabled, min_total=PROGRESS_MIN_BYTES)


def run(args: argparse.Namespace) -> int:
    """Create or verify a manifest: a refused ``verify`` exits 1, a refused ``create`` 2."""
    from edge_core.artifacts.errors import BundleRefused, ManifestExists

    if not os.path.isdir(args.directory):
        raise common.CommandFailed(common.EXIT_USAGE,
                                   f"DIR: must be an existing directory: {args.directory!r}")
    creating = args.manifest_action == "create"
    try:
        result = _create(args) if creating else _verify(args)
    except ManifestExists as exc:
        raise common.CommandFailed(
            common.EXIT_USAGE,
            "DIR: already has a manifest; pass --force to replace it (nothing was "
            f"written): {exc.value!r}",
            {"refusal": exc.to_dict()},
        ) from exc
    except BundleRefused as exc:
        # what create is given is its input (exit 2); what verify answers is a check (1)
        code = common.EXIT_USAGE if creating else common.EXIT_FAILED
        raise common.CommandFailed(code, str(exc), {"refusal": exc.to_dict()}) from exc
    if args.json:
        common.print_json({"ok": True, **result})
    else:
        _print_human(args.manifest_action, result)
    return common.EXIT_OK


def _create(args: argparse.Namespace) -> dict[str, object]:
    from pathlib import Path

    from edge_core.artifacts.create import create_manifest, member_argument

    root = Path(os.path.realpath(args.directory))
    calibration = _json_object(args.calibration, "--calibration")
    validation = _json_object(args.validation, "--validation")

    def member(text: str | None, option: str) -> str | None:
        if text is None:
            return None
        found = member_argument(root, text)
        inside = not Path(found).is_absolute() and ".." not in Path(found).parts
        if not inside or not (root / found).is_file():
            raise common.CommandFailed(common.EXIT_USAGE,
                                       _not_a_member(root, args.directory, option, text),
                                       {"field": option, "value": text})
        return found

    with _progress(args, "hashing") as progress:
        created = create_manifest(
            root,
            overwrite=args.force,
            component=args.component,
            graph=member(args.graph, "--graph"),
            example_inputs=member(args.example_inputs, "--example-inputs"),
            expected_outputs=member(args.expected_outputs, "--expected-outputs"),
            checkpoint_revision=args.checkpoint_revision,
            precision=args.precision,
            layout=args.layout,
            exporter=args.exporter,
            calibration=calibration,
            validation=validation,
            progress=progress,
        )
    return created.describe()


MAX_NAMED_FILES = 12
"""How many of the bundle's files a refused file argument lists."""


def _not_a_member(root: Path, directory: str, option: str, text: str) -> str:
    """Why a file argument names no file of the bundle: the closest files, and the rule."""
    import difflib

    from edge_core.artifacts.members import list_bundle_files

    if os.path.exists(text) and not os.path.isdir(text):
        return (f"{option}: not a file inside {directory} (file arguments are paths inside "
                f"the bundle folder: copy the file there, or name it relative to the "
                f"folder): {text!r}")
    files = list_bundle_files(root, strict=False)
    close = difflib.get_close_matches(text, files, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = ", ".join(files[:MAX_NAMED_FILES]) + (", ..." if len(files) > MAX_NAMED_FILES
                                                   else "")
    return (f"{option}: no such file in {directory} ({hint}its files: {shown or 'none'}): "
            f"{text!r}")


def _verify(args: argparse.Namespace) -> dict[str, object]:
    from edge_core.artifacts.verify import verify_bundle

    with _progress(args, "verifying") as progress:
        bundle = verify_bundle(args.directory, stage=False, progress=progress)
    summary = bundle.describe()
    del summary["directory"], summary["staged"]
    return summary


def _print_human(action: str, result: dict[str, Any]) -> None:
    size = result["bytes"] / 2**20
    if action == "create":
        print(f"wrote {result['manifest']}")
    else:
        print(f"verified {result['source']}")
    print(f"  component {result['component']}: {result['files']} files, {size:.1f} MiB")
    print(f"  graph {result['graph']}")
    for key in ("example_inputs", "expected_outputs"):
        if result.get(key):
            print(f"  {key.replace('_', ' ')} {result[key]}")
    for graph, files in result.get("external_data", {}).items():
        print(f"  external data of {graph}: {', '.join(files)}")
    print(f"  manifest sha256 {result['manifest_sha256']}")
    for path in result.get("unlisted", []):  # a name with a newline shown quoted, on one line
        shown = path if path.isprintable() else repr(path)
        print(f"  note: not listed in the manifest (never loaded): {shown}")
    if action == "create" and not result.get("example_inputs"):
        print("  note: no example inputs: the ONNX Runtime backends refuse to load this "
              "bundle until its manifest names them (edge manifest create DIR "
              "--example-inputs FILE --force); another backend decides for itself")
