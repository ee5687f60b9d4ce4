"""A cache of EP-context models: graphs an execution provider compiled once, reused after.

Worker side: imports only the standard library. Execution providers that compile a graph
ahead of running it (QNN, and others) can write the compiled form as an "EP context"
model (``ep.context_enable``); loading that model skips the compilation.

An entry is keyed by sha256 over the artifact's bytes (every file under the graph's
directory), the caller's key material (provider options, session settings) and the
versions of the runtime pieces (onnxruntime, the EP library). A changed artifact, option
or runtime gives another key and therefore a fresh compilation; nothing is ever
overwritten in place. An entry appears atomically: it is written into a private temporary
directory and renamed to its key once the session that wrote it exists.
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

__all__ = ["CONTEXT_MODEL", "ContextEntry", "artifact_digest", "context_key"]

#: The file name of the EP-context model inside an entry.
CONTEXT_MODEL = "model_ctx.onnx"
_CHUNK = 1 << 20


def artifact_digest(graph: str) -> str:
    """sha256 over every regular file under the graph's directory (names and bytes)."""
    root = Path(graph).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


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
