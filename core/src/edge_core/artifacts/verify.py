"""Verification of an artifact bundle before any worker starts: :func:`verify_bundle`.

In order, cheapest refusals first:

1. the manifest: a regular file (not a symlink) at the bundle root, at most
   ``MAX_MANIFEST_BYTES``, JSON without duplicate keys, schema version 1, member paths
   relative and clean (no ``..``, absolute, backslash, colon), graph / example inputs /
   expected outputs among the members, not listing itself;
2. every member resolved on disk (all symlinks, parent directories included) inside
   the bundle, present and a regular file — before a single byte is hashed;
3. every member read once through a checked descriptor, hashed, compared with the
   manifest — and, in staged mode, copied from the same buffer into a private 0700
   directory;
4. references, on the verified bytes: ONNX external-data locations in the verified set,
   ``.npz`` archives loadable with ``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_contracts.jsonvalues import strict_loads
from edge_contracts.manifest import MANIFEST_FILENAME, ArtifactManifest
from edge_core.artifacts.bundle import VerifiedBundle
from edge_core.artifacts.errors import (
    DigestMismatch,
    ManifestSchemaInvalid,
    MemberMissing,
    MemberPathRefused,
    ReferenceRefused,
)
from edge_core.artifacts.hashing import HashedMember, hash_member
from edge_core.artifacts.members import (
    Fingerprint,
    bundle_root,
    check_member_path,
    fingerprint,
    list_bundle_files,
    member_field,
    resolve_member,
)
from edge_core.artifacts.pins import observe
from edge_core.artifacts.references import check_references, expected_outputs_path
from edge_core.host.leftovers import tagged_prefix
from edge_core.progress import Progress

__all__ = ["MAX_MANIFEST_BYTES", "parse_manifest", "read_manifest", "verify_bundle"]

MAX_MANIFEST_BYTES = 8 << 20
"""Largest manifest file read, in bytes."""

_MANIFEST_FLAGS = (
    os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
)


def _precheck(data: object) -> None:
    """Refuse unsafe member paths and unlisted references with the specific error types."""
    if not isinstance(data, Mapping):
        return
    files = data.get("files")
    if not isinstance(files, Mapping):
        return
    for path in files:
        if isinstance(path, str):
            check_member_path(path, member_field(path))
    if MANIFEST_FILENAME in files:
        raise ManifestSchemaInvalid(member_field(MANIFEST_FILENAME),
                                    "the manifest cannot list itself", MANIFEST_FILENAME)
    metadata = data.get("metadata")
    if not isinstance(metadata, Mapping):
        return
    for name in ("graph", "example_inputs"):
        value = metadata.get(name)
        if isinstance(value, str) and value not in files:
            check_member_path(value, f"manifest.metadata.{name}")
            raise ReferenceRefused(f"manifest.metadata.{name}",
                                   "must be a key of files (not in the verified set)", value)


def parse_manifest(raw: bytes) -> ArtifactManifest:
    """Parse and check manifest bytes (schema, paths, references among the members)."""
    try:
        data = strict_loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ManifestSchemaInvalid("manifest", f"must be valid JSON ({exc})",
                                    MANIFEST_FILENAME) from None
    _precheck(data)
    try:
        manifest = ArtifactManifest.from_json(raw)
    except InvalidValue as exc:
        raise ManifestSchemaInvalid(exc.field, exc.reason, exc.value) from None
    expected_outputs_path(manifest)
    return manifest


def read_manifest(root: Path) -> tuple[ArtifactManifest, bytes, Fingerprint]:
    """Read, bound and parse the manifest of the bundle at ``root`` (never via a symlink)."""
    path = root / MANIFEST_FILENAME
    try:
        fd = os.open(path, _MANIFEST_FLAGS)
    except FileNotFoundError:
        raise ManifestSchemaInvalid("manifest", f"bundle has no {MANIFEST_FILENAME}",
                                    str(root)) from None
    except OSError as exc:
        raise MemberPathRefused("manifest", f"cannot be opened safely ({exc.strerror})",
                                str(path)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MemberPathRefused("manifest", "must be a regular file", str(path))
        if info.st_size > MAX_MANIFEST_BYTES:
            raise ManifestSchemaInvalid("manifest", f"must be <= {MAX_MANIFEST_BYTES} bytes",
                                        info.st_size)
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) != info.st_size:
        raise ManifestSchemaInvalid("manifest", "changed while it was read", str(path))
    return parse_manifest(raw), raw, fingerprint(info)


def _preflight(root: Path, manifest: ArtifactManifest) -> int:
    """Resolve every member before hashing any; return the total size in bytes."""
    total = 0
    for path in manifest.files:
        field = member_field(path)
        resolved = resolve_member(root, path, field)
        try:
            info = os.stat(resolved)
        except FileNotFoundError:
            raise MemberMissing(field, "listed in the manifest but not in the bundle",
                                path) from None
        except OSError as exc:
            raise MemberPathRefused(field, f"cannot be read ({exc.strerror})", path) from None
        if not stat.S_ISREG(info.st_mode):
            raise MemberPathRefused(field, "must be a regular file", path)
        total += info.st_size
    return total


def _staging_path(staging: Path, member: str) -> Path:
    target = staging.joinpath(*member.split("/"))
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return target


def _write_private(path: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o400)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def verify_bundle(
    directory: str | os.PathLike[str],
    *,
    stage: bool = True,
    staging_root: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> VerifiedBundle:
    """Verify the bundle at ``directory``; return what a worker loads, or refuse.

    Args:
        directory: the bundle (a directory with ``edge-manifest.json`` at its root).
        stage: copy the verified bytes into a private directory that the worker loads
            from (the default; costs the bundle's size in disk and one write of it).
            ``False`` verifies in place: no copy, and the worker loads the bundle itself.
        staging_root: where the private directory is made (default: the system
            temporary directory, where the copy of an owner that died without
            cleaning up is removed by the next edge-core process: see
            :mod:`edge_core.host.leftovers`).
        progress: a reporter advanced by every byte hashed (its total is set here).

    Raises:
        ManifestInvalid: one of its subclasses in ``edge_core.artifacts.errors``, naming
            the field, the reason and the value. Nothing is left on disk.
        BundleChanged: inside a stage's load (:mod:`edge_core.artifacts.pins`), the
            manifest's sha256 is not the one the stage opened with.

    """
    root = bundle_root(directory)
    manifest, raw, manifest_fp = read_manifest(root)
    total = _preflight(root, manifest)
    if progress is not None:
        progress.set_total(total)
    staging: Path | None = None
    try:
        if stage:
            # tagged with this process's identity: a dead owner's copy is swept
            staging = Path(tempfile.mkdtemp(prefix=tagged_prefix("bundle"), dir=staging_root))
        members = [_verify_member(root, path, digest, staging, progress)
                   for path, digest in sorted(manifest.files.items())]
        loaded_from = staging if staging is not None else root
        references = check_references(loaded_from, manifest, {m.path: m.size for m in members})
        if staging is not None:
            _write_private(staging / MANIFEST_FILENAME, raw)
        listed = set(manifest.files)
        unlisted = tuple(p for p in list_bundle_files(root, strict=False) if p not in listed)
        values: dict[str, Any] = {
            "source": root, "directory": loaded_from, "staged": staging is not None,
            "manifest": manifest, "manifest_sha256": hashlib.sha256(raw).hexdigest(),
            "manifest_fingerprint": manifest_fp, "members": tuple(members),
            "references": references, "unlisted": unlisted,
        }
        bundle = VerifiedBundle.create(**values)
        try:
            observe(bundle)  # a stage's restart: the manifest it opened with, or refused
        except BaseException:
            bundle.cleanup()
            raise
        return bundle
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise


def _verify_member(
    root: Path, path: str, digest: str, staging: Path | None, progress: Progress | None
) -> HashedMember:
    copy_to = None if staging is None else _staging_path(staging, path)
    member = hash_member(root, path, copy_to=copy_to, progress=progress)
    if member.sha256 != digest:
        raise DigestMismatch(member_field(path),
                             f"sha256 differs from the manifest's {digest}", member.sha256)
    return member
