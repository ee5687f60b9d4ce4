"""A cache of EP-context models: graphs an execution provider compiled once, reused after.

Worker side: imports only the standard library. Execution providers that compile a graph
ahead of running it (QNN, and others) can write the compiled form as an "EP context"
model (``ep.context_enable``); loading that model skips the compilation.

An entry is keyed by sha256 over the artifact (every file under the graph's directory:
its name and the sha256 of its bytes), the caller's key material (provider options,
session settings) and the versions of the runtime pieces (onnxruntime, the EP library).
A changed artifact, option or runtime gives another key and therefore a fresh
compilation; nothing is ever overwritten in place. An entry appears atomically: it is
written into a private temporary directory and renamed to its key once the session that
wrote it exists.

A file's sha256 is read from the bundle's verified manifest where it lists the file
(:func:`verified_sha256s`: the controller hashed those bytes when it verified the bundle,
and the worker loads them, a staged copy or the bundle checked in place), so a load reads
none of the bundle's bytes for its key; only a file the manifest does not list (an
unlisted file beside a bundle verified in place) is read and hashed, once per load
(:class:`ArtifactDigests`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CONTEXT_MODEL", "ArtifactDigests", "ContextEntry", "artifact_digest",
           "context_key", "discard_written", "verified_sha256s"]

#: The file name of the EP-context model inside an entry.
CONTEXT_MODEL = "model_ctx.onnx"
#: The manifest's file name in a bundle (``edge_contracts.manifest.MANIFEST_FILENAME``).
_MANIFEST = "edge-manifest.json"
_CHUNK = 1 << 20


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verified_sha256s(directory: str, manifest_sha256: str) -> dict[Path, str]:
    """Resolved path → sha256 of every file the bundle's verified manifest lists.

    ``directory`` is the bundle the worker loads (a staged copy, or the bundle verified in
    place) and ``manifest_sha256`` the sha256 of the manifest the controller verified.
    The manifest is read once; when its bytes are not those (rewritten since, unreadable)
    nothing is taken from it (an empty mapping: every file is then read and hashed). The
    manifest's own path maps to ``manifest_sha256``.
    """
    root = Path(directory).resolve()
    path = root / _MANIFEST
    try:
        raw = path.read_bytes()
    except OSError:
        return {}
    if hashlib.sha256(raw).hexdigest() != manifest_sha256:
        return {}
    files = json.loads(raw).get("files")
    if not isinstance(files, dict):
        return {}
    found = {root / str(name): str(sha256) for name, sha256 in files.items()}
    found[path] = manifest_sha256
    return found


def artifact_digest(graph: str, verified: Mapping[Path, str] | None = None) -> str:
    """sha256 over every regular file under the graph's directory: its name and sha256.

    A file's sha256 is ``verified``'s (resolved path → sha256: :func:`verified_sha256s`)
    where it has one; any other file's bytes are read and hashed.
    """
    root = Path(graph).resolve().parent
    known = verified or {}
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        sha256 = known.get(path) or _sha256_file(path)
        digest.update(path.relative_to(root).as_posix().encode() + b"\0"
                      + sha256.encode() + b"\0")
    return digest.hexdigest()


class ArtifactDigests:
    """The artifact digest of each graph directory, worked out once per load.

    Every EP-context entry of a load (the plain session's, each bucket's) keys on its
    graph's directory: a load with several entries reads no file twice.

    Args:
        verified: Resolved path → sha256 of the files already verified
            (:func:`verified_sha256s`); their bytes are never read.
    """

    def __init__(self, verified: Mapping[Path, str] | None = None) -> None:
        self._verified = dict(verified or {})
        self._found: dict[Path, str] = {}

    def of(self, graph: str) -> str:
        """The :func:`artifact_digest` of ``graph``'s directory."""
        root = Path(graph).resolve().parent
        if root not in self._found:
            self._found[root] = artifact_digest(graph, self._verified)
        return self._found[root]


def context_key(artifact: str, material: Mapping[str, Any], versions: Mapping[str, str]) -> str:
    """The cache key: sha256 of the artifact digest, the key material and the versions."""
    blob = json.dumps({"artifact": artifact, "material": material, "versions": versions},
                      sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class ContextEntry:
    """One cache entry: reuse it when present, else have the session write it.

    Args:
        directory: The cache directory (created when missing).
        key: The entry's key (:func:`context_key`).
    """

    def __init__(self, directory: str, key: str) -> None:
        self.root = Path(directory)
        self.key = key
        self.path = self.root / key
        self._pending: Path | None = None

    @property
    def model(self) -> Path:
        """The EP-context model of a completed entry."""
        return self.path / CONTEXT_MODEL

    @property
    def present(self) -> bool:
        """True when a completed entry exists for this key."""
        return self.model.is_file()

    def session_entries(self) -> dict[str, str]:
        """Session config entries that make the next session write a fresh entry."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._pending = Path(tempfile.mkdtemp(prefix=".pending-", dir=self.root))
        return {"ep.context_enable": "1",
                "ep.context_file_path": str(self._pending / CONTEXT_MODEL)}

    def commit(self) -> bool:
        """Publish the written entry under its key; False when nothing was written.

        When another process published the same key first, its entry is kept.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        try:
            if not (pending / CONTEXT_MODEL).is_file():
                return False
            try:
                os.rename(pending, self.path)
            except OSError:
                return self.present
            return True
        finally:
            shutil.rmtree(pending, ignore_errors=True)

    def abandon(self) -> None:
        """Remove a pending entry after a failed session creation."""
        pending, self._pending = self._pending, None
        if pending is not None:
            shutil.rmtree(pending, ignore_errors=True)


def discard_written(report: Mapping[str, Any]) -> list[str]:
    """Remove the entries a load wrote, as its ``report`` names them; return their paths.

    For a load refused after the fact (a bundle verified in place that changed before the
    worker's load of it ended): the entries it wrote are keyed by the sha256s verified,
    but were compiled from what the worker read, so they must not be reused. ``report``
    is the worker's load reply: its ``ep_context`` and each of its ``bucket_sessions``'.
    """
    written = [report.get("ep_context")]
    written += [bucket.get("ep_context") for bucket in
                dict(report.get("bucket_sessions") or {}).values()]
    removed: list[str] = []
    for entry in written:
        if isinstance(entry, Mapping) and entry.get("written") and entry.get("path"):
            shutil.rmtree(str(entry["path"]), ignore_errors=True)
            removed.append(str(entry["path"]))
    return removed
