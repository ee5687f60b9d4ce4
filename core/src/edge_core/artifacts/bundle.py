"""A verified artifact bundle: where a worker loads from, and the proof it is unchanged.

:func:`~edge_core.artifacts.verify.verify_bundle` returns a :class:`VerifiedBundle`. In
staged mode (the default) its ``directory`` is a private copy (mode 0700, files 0400)
written from the very bytes that were hashed; the worker loads from there, so changes to
the bundle after verification cannot reach it. Right before the load the runtime calls
:meth:`VerifiedBundle.ensure_unchanged`, which refuses with ``BundleChanged`` when the
bundle on disk or the staged copy changed since verification (cheap: a ``stat`` per file;
``rehash=True`` re-reads every byte as well). :meth:`VerifiedBundle.cleanup` (or leaving
the ``with`` block) removes the copy; it also runs at garbage collection or exit.

A stage keeps a handle on its staged copy for its whole life
(:mod:`edge_core.artifacts.pins`): a restart loads from :meth:`VerifiedBundle.reissue`,
the same bytes again (their sha256 checked once more), whatever the bundle on disk holds
by then.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import weakref
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

from edge_contracts.manifest import MANIFEST_FILENAME, ArtifactManifest
from edge_core.artifacts.errors import BundleChanged, MemberPathRefused
from edge_core.artifacts.hashing import HashedMember, hash_member, sha256_path
from edge_core.artifacts.members import Fingerprint, fingerprint, member_field, resolve_member
from edge_core.artifacts.references import References, load_npz

if TYPE_CHECKING:
    import numpy.typing as npt

    from edge_core.shapes import ShapeSet, WarmupCase

__all__ = ["VerifiedBundle"]


def _remove_tree(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


class _StagedCopy:
    """A staged directory and how many :class:`VerifiedBundle` handles still use it."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.users = 1
        self.lock = threading.Lock()

    def acquire(self) -> bool:
        """Count one more user; False once the directory is gone (nobody held it)."""
        with self.lock:
            if self.users == 0:
                return False
            self.users += 1
            return True

    def release(self) -> None:
        """Count one user fewer; the last one removes the directory."""
        with self.lock:
            self.users -= 1
            last = self.users == 0
        if last:
            _remove_tree(self.directory)


def _stat_fingerprint(path: Path) -> Fingerprint | None:
    try:
        return fingerprint(os.stat(path, follow_symlinks=False))
    except OSError:
        return None


@attrs.frozen(eq=False)
class VerifiedBundle:
    """An artifact bundle that passed verification, and what a worker needs to load it.

    Attributes:
        source: the bundle's resolved directory.
        directory: where the worker loads from: the private staged copy, or ``source``
            when verified in place.
        staged: whether ``directory`` is a private copy owned by this object.
        manifest: the verified manifest.
        manifest_sha256: sha256 of the manifest file's bytes (the identity recorded in
            execution plans; equals ``sha256sum edge-manifest.json``).
        members: every listed file with its digest, size and fingerprints.
        references: external-data files per ONNX member, expected outputs, array names.
        unlisted: files present in the bundle but not listed (never copied; reported).
        detached: a handle from :meth:`reissue`: it stands for the bytes verified earlier
            (in the staged copy), not for the bundle on disk, which may have been
            rewritten since; :meth:`ensure_unchanged` checks the staged copy alone.

    """

    source: Path
    directory: Path
    staged: bool
    manifest: ArtifactManifest
    manifest_sha256: str
    manifest_fingerprint: Fingerprint
    members: tuple[HashedMember, ...]
    references: References
    unlisted: tuple[str, ...] = ()
    detached: bool = False
    _finalizer: weakref.finalize[Any, Any] | None = attrs.field(default=None, repr=False)
    _copy: _StagedCopy | None = attrs.field(default=None, repr=False)

    @classmethod
    def create(cls, **values: Any) -> VerifiedBundle:
        """Build one; a staged directory is removed at cleanup, collection or exit."""
        bundle = cls(**values)
        if bundle.staged:
            copy = _StagedCopy(str(bundle.directory))
            object.__setattr__(bundle, "_copy", copy)
            object.__setattr__(bundle, "_finalizer", weakref.finalize(bundle, copy.release))
        return bundle

    def share(self) -> VerifiedBundle | None:
        """Another handle on this verification (for another replica of the same bundle).

        The handle has the same verified manifest, members, references and directory; a
        staged directory is removed when the last handle is cleaned up (or collected),
        so each user cleans up its own handle as before. ``None`` when this handle's
        staged copy is already gone: the caller verifies afresh.
        """
        if self.staged and (self._copy is None or not self._copy.acquire()):
            return None
        handle = attrs.evolve(self, finalizer=None)
        if self._copy is not None:
            object.__setattr__(handle, "_finalizer",
                               weakref.finalize(handle, self._copy.release))
        return handle

    def reissue(self) -> VerifiedBundle | None:
        """A handle on the staged copy alone, for a restart: the bytes verified earlier.

        The copy is checked first, every byte hashed again (the manifest's and each
        member's sha256 against the verification's): what the new worker loads is what
        was verified, whatever the bundle on disk holds now. The handle is
        :attr:`detached` (its :meth:`ensure_unchanged` does not look at the bundle on
        disk) and is cleaned up like one from :meth:`share`.

        Returns:
            ``None`` when this bundle was verified in place (there is no copy), or the
            copy is gone or no longer holds the verified bytes: the caller verifies
            afresh.
        """
        if not self.staged:
            return None
        try:
            self._check_copy(rehash=True)
        except (BundleChanged, OSError):
            return None
        handle = self.share()
        if handle is not None:
            object.__setattr__(handle, "detached", True)
        return handle

    @property
    def component(self) -> str:
        """The component the artifact implements."""
        return self.manifest.component

    def path(self, member: str) -> Path:
        """Where the worker finds ``member`` (which must be a listed file)."""
        if member not in self.manifest.files:
            raise MemberPathRefused(member_field(member), "is not a verified member", member)
        return self.directory.joinpath(*member.split("/"))

    @property
    def graph(self) -> Path:
        """The graph file to load."""
        return self.path(self.manifest.metadata.graph)

    @property
    def example_inputs(self) -> Path | None:
        """The ``.npz`` of example inputs (the warm-up bucket), if the bundle has one."""
        member = self.manifest.metadata.example_inputs
        return None if member is None else self.path(member)

    @property
    def expected_outputs(self) -> Path | None:
        """The ``.npz`` of reference outputs for the warm-up numerical check, if any."""
        member = self.references.expected_outputs
        return None if member is None else self.path(member)

    @property
    def shapes(self) -> ShapeSet | None:
        """The shape set the bundle serves (:mod:`edge_core.shapes`), if it has examples."""
        return self.references.shapes

    @property
    def warmup_cases(self) -> tuple[WarmupCase, ...]:
        """Every example the load gate runs: one per static bucket, three or more per range."""
        return self.references.warmup_cases

    @property
    def total_bytes(self) -> int:
        """Bytes in all members."""
        return sum(m.size for m in self.members)

    def load_example_inputs(self) -> dict[str, npt.NDArray[Any]]:
        """The example inputs by name, loaded with pickle disabled (empty if none)."""
        path = self.example_inputs
        return {} if path is None else load_npz(path, "manifest.metadata.example_inputs")

    def load_expected_outputs(self) -> dict[str, npt.NDArray[Any]]:
        """The expected outputs by name, loaded with pickle disabled (empty if none)."""
        path = self.expected_outputs
        field = "manifest.metadata.validation.expected_outputs"
        return {} if path is None else load_npz(path, field)

    def ensure_unchanged(self, *, rehash: bool = False) -> None:
        """Refuse with ``BundleChanged`` if anything changed since verification.

        Checks the manifest file and every member of the bundle on disk by fingerprint
        (device, inode, size, mtime and ctime in ns; a write always moves ctime), and the
        staged copy by fingerprint too. With ``rehash`` every byte is hashed again: the
        bundle's, and the staged copy's (twice the read cost). Only a rehash sees a change
        that keeps the fingerprint: a same-size rewrite stamped within the same tick of the
        file system's timestamp clock as the file's last change before verification, or
        stores through a writable ``mmap`` of it (docs/artifacts.md, "What a file-status
        check sees"); in staged mode such a change cannot reach the worker in any case.
        A :attr:`detached` handle checks the staged copy alone (the bundle on disk is not
        what it loads).
        """
        if not self.detached:
            self._check_source(rehash=rehash)
        if self.staged:
            self._check_copy(rehash=rehash)

    def _check_source(self, *, rehash: bool) -> None:
        """Refuse when the bundle on disk changed since verification."""
        if _stat_fingerprint(self.source / MANIFEST_FILENAME) != self.manifest_fingerprint:
            raise BundleChanged("manifest", "changed after verification",
                                str(self.source / MANIFEST_FILENAME))
        for member in self.members:
            field = member_field(member.path)
            resolved = resolve_member(self.source, member.path, field)
            if _stat_fingerprint(resolved) != member.source:
                raise BundleChanged(field, "changed in the bundle after verification",
                                    member.path)
            if rehash:
                again = hash_member(self.source, member.path)
                if (again.sha256, again.source) != (member.sha256, member.source):
                    raise BundleChanged(field, "sha256 changed in the bundle after verification",
                                        member.path)

    def _check_copy(self, *, rehash: bool) -> None:
        """Refuse when the staged copy changed since verification (or is gone)."""
        staged = self.directory / MANIFEST_FILENAME
        try:
            digest = hashlib.sha256(staged.read_bytes()).hexdigest()
        except OSError:
            digest = ""
        if digest != self.manifest_sha256:
            raise BundleChanged("manifest", "staged copy changed after verification",
                                str(staged))
        for member in self.members:
            field = member_field(member.path)
            copy = self.path(member.path)
            if _stat_fingerprint(copy) != member.copy:
                raise BundleChanged(field, "staged copy changed after verification",
                                    str(copy))
            if rehash and sha256_path(copy) != member.sha256:
                raise BundleChanged(field, "staged copy's sha256 changed", str(copy))

    def describe(self) -> dict[str, object]:
        """The JSON-ready identity of the bundle, for execution plans and ``--json``."""
        return {
            "component": self.component,
            "manifest_sha256": self.manifest_sha256,
            "source": str(self.source),
            "directory": str(self.directory),
            "staged": self.staged,
            "graph": self.manifest.metadata.graph,
            "example_inputs": self.manifest.metadata.example_inputs,
            "expected_outputs": self.references.expected_outputs,
            "shapes": (self.references.shapes.to_json()
                       if self.references.shapes is not None else None),
            "files": len(self.members),
            "bytes": self.total_bytes,
            "external_data": {k: list(v) for k, v in self.references.external_data.items()},
            "unlisted": list(self.unlisted),
        }

    def cleanup(self) -> None:
        """Release this handle's staged copy (idempotent; nothing to do in place).

        The copy is removed when no other handle from :meth:`share` still uses it.
        """
        if self._finalizer is not None:
            self._finalizer()

    @property
    def cleaned_up(self) -> bool:
        """True once this handle's staged copy was released (always False in place)."""
        return self._finalizer is not None and not self._finalizer.alive

    def __enter__(self) -> VerifiedBundle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

