"""Creating a manifest for a bundle directory: :func:`create_manifest`.

Every file of the directory is listed and hashed (symlinks only when they stay inside the
bundle; symlinked directories and special files are refused), the metadata is checked
by ``ArtifactManifest``, and the same reference checks as verification run (every file
named ``.onnx`` an ONNX model with a graph, ONNX external data among the files, ``.npz``
archives loadable without pickle) before the
manifest is written — atomically, through a temporary file and a rename — so a created
manifest always verifies.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from edge_contracts.errors import InvalidValue
from edge_contracts.manifest import (
    MANIFEST_FILENAME,
    MANIFEST_SCHEMA_VERSION,
    ArtifactManifest,
    ArtifactMetadata,
)
from edge_contracts.validation import rebase
from edge_core.artifacts.errors import ManifestExists, ManifestSchemaInvalid, ReferenceRefused
from edge_core.artifacts.hashing import hash_member
from edge_core.artifacts.members import bundle_root, list_bundle_files, resolve_member
from edge_core.artifacts.references import (
    EXPECTED_OUTPUTS_KEY,
    GRAPH_FIELD,
    References,
    check_references,
    named_onnx,
)
from edge_core.progress import Progress

__all__ = ["CreatedManifest", "build_manifest", "create_manifest", "member_argument"]


@attrs.frozen
class CreatedManifest:
    """A manifest built (and, by :func:`create_manifest`, written) for a bundle.

    Attributes:
        path: where the manifest is (or would be) written.
        manifest: the manifest.
        manifest_sha256: sha256 of its canonical JSON bytes, as written.
        total_bytes: bytes in all listed files.
        references: what the files refer to (external data, expected outputs, arrays).

    """

    path: Path
    manifest: ArtifactManifest
    manifest_sha256: str
    total_bytes: int
    references: References

    def describe(self) -> dict[str, object]:
        """The JSON-ready summary printed by ``edge manifest create --json``."""
        metadata = self.manifest.metadata
        return {
            "manifest": str(self.path),
            "manifest_sha256": self.manifest_sha256,
            "component": self.manifest.component,
            "graph": metadata.graph,
            "example_inputs": metadata.example_inputs,
            "expected_outputs": self.references.expected_outputs,
            "files": len(self.manifest.files),
            "bytes": self.total_bytes,
            "external_data": {k: list(v) for k, v in self.references.external_data.items()},
        }


def member_argument(root: Path, text: str) -> str:
    """A member path from a command-line argument.

    The argument is taken relative to the bundle when that exists (and it does not climb
    with ``..``); otherwise a path (relative to the working directory, or absolute) that
    lies inside the bundle is turned into its member path.
    """
    candidate = Path(text)
    if (not candidate.is_absolute() and ".." not in candidate.parts
            and (root / candidate).exists()):
        return candidate.as_posix()
    if candidate.exists():
        absolute = os.path.abspath(candidate)
        full = Path(os.path.realpath(os.path.dirname(absolute))) / os.path.basename(absolute)
        if full.is_relative_to(root):
            return full.relative_to(root).as_posix()
    return candidate.as_posix()


def _default_graph(files: list[str]) -> str:
    # The same names the checks hold to ONNX's rule (references.named_onnx: any case), so
    # MODEL.ONNX is a default graph, and model.onnx beside MODEL.ONNX is two candidates.
    graphs = [f for f in files if named_onnx(f)]
    if len(graphs) != 1:
        raise ReferenceRefused(
            GRAPH_FIELD, "must be given: the bundle does not hold exactly one file "
            "named .onnx (in any case)", graphs,
        )
    return graphs[0]


def _validation(
    validation: Mapping[str, Any] | None, expected_outputs: str | None
) -> dict[str, Any] | None:
    merged = dict(validation) if validation is not None else {}
    if expected_outputs is not None:
        present = merged.get(EXPECTED_OUTPUTS_KEY)
        if present is not None and present != expected_outputs:
            raise ReferenceRefused(
                f"manifest.metadata.validation.{EXPECTED_OUTPUTS_KEY}",
                f"differs from the expected outputs given ({expected_outputs})", present,
            )
        merged[EXPECTED_OUTPUTS_KEY] = expected_outputs
    return merged or None


def build_manifest(
    directory: str | os.PathLike[str],
    *,
    component: str | None = None,
    graph: str | None = None,
    example_inputs: str | None = None,
    expected_outputs: str | None = None,
    checkpoint_revision: str | None = None,
    precision: str | None = None,
    layout: str | None = None,
    exporter: str | None = None,
    calibration: Mapping[str, Any] | None = None,
    validation: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> CreatedManifest:
    """List, hash and check the bundle at ``directory``; return its manifest unwritten.

    ``component`` defaults to the directory's name; ``graph`` to the only file named
    ``.onnx`` (in any case, in any folder of the bundle); ``expected_outputs`` is recorded
    as ``metadata.validation.expected_outputs``.

    Raises:
        ManifestInvalid: a subclass naming the field, the reason and the value.

    """
    root = bundle_root(directory)
    files = list_bundle_files(root, strict=True)
    if not files:
        raise ManifestSchemaInvalid("manifest.files", "the bundle holds no files", str(root))
    if progress is not None:
        progress.set_total(sum(resolve_member(root, f, f).stat().st_size for f in files))
    hashed = [hash_member(root, path, progress=progress) for path in files]
    try:
        metadata = ArtifactMetadata(
            graph=graph if graph is not None else _default_graph(files),
            example_inputs=example_inputs,
            checkpoint_revision=checkpoint_revision,
            precision=precision,
            layout=layout,
            exporter=exporter,
            calibration=calibration,
            validation=_validation(validation, expected_outputs),
        )
        manifest = ArtifactManifest(
            schema_version=MANIFEST_SCHEMA_VERSION,
            component=component if component is not None else root.name,
            files={m.path: m.sha256 for m in hashed},
            metadata=metadata,
        )
    except InvalidValue as exc:
        # The metadata checks name ``metadata.*``; every other refusal of the manifest,
        # here and at verification, names ``manifest.metadata.*``.
        moved = rebase(exc, "metadata", "manifest.metadata")
        error = ReferenceRefused if moved.reason.startswith("must be a key") else (
            ManifestSchemaInvalid)
        raise error(moved.field, moved.reason, moved.value) from None
    references = check_references(root, manifest, {m.path: m.size for m in hashed})
    text = manifest.to_json().encode("utf-8")
    return CreatedManifest(
        path=root / MANIFEST_FILENAME,
        manifest=manifest,
        manifest_sha256=hashlib.sha256(text).hexdigest(),
        total_bytes=sum(m.size for m in hashed),
        references=references,
    )


def create_manifest(
    directory: str | os.PathLike[str], *, overwrite: bool = False, **options: Any
) -> CreatedManifest:
    """Build the manifest of the bundle at ``directory`` and write it there.

    ``options`` are those of :func:`build_manifest`. An existing manifest is refused
    unless ``overwrite``, before anything is hashed; the write is atomic (temporary file,
    fsync, rename).

    Raises:
        ManifestExists: the bundle has a manifest (or anything by its name) and
            ``overwrite`` is false; nothing was written.
        ManifestSchemaInvalid: with ``overwrite``, a directory has the manifest's name
            (nothing is replaced: a directory is not a manifest).
        ManifestInvalid: another subclass, from :func:`build_manifest`.

    """
    root = bundle_root(directory)
    target = root / MANIFEST_FILENAME
    if not overwrite and os.path.lexists(target):
        raise ManifestExists("manifest", "already exists (overwrite=True, or edge manifest "
                             "create --force, replaces it)", str(target))
    if os.path.isdir(target) and not os.path.islink(target):  # a rename cannot replace it
        raise ManifestSchemaInvalid("manifest", "is a directory: only a manifest file is "
                                    "replaced (remove the directory)", str(target))
    created = build_manifest(root, **options)
    fd, temporary = tempfile.mkstemp(dir=root, prefix=".edge-manifest.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(created.manifest.to_json().encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return created
