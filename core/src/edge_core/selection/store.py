"""Stored placement decisions: one JSON file per key in the user's cache directory.

The directory is ``$EDGE_PLACEMENT_CACHE`` when set, else
``$XDG_CACHE_HOME/edge/placement`` (``~/.cache/edge/placement``). A file is named for its
key's digest and holds::

    {"format": "edge-placement-decision/1", "key": "<sha256>", "parts": {...},
     "pipeline": "<name>", "measured_at": "<UTC ISO 8601>", "decision": {...},
     "digest": "<sha256 of everything above>"}

A file that cannot be read, is not JSON, has another format, names another key, fails
its digest or holds a decision that does not fit the pipeline (a stage it does not have,
a candidate index out of range, another backend at that index) is not used: the caller
measures again, and a :class:`DecisionCacheWarning` says why — never an exception.
Files are written atomically (a private temporary file, then a rename) with mode 0600;
at most :data:`KEEP_PER_PIPELINE` decisions are kept per pipeline name, the newest. The
previous decision a lookup names (to say which key part changed, and to order a
first-ready open) is the one whose key differs in the fewest parts, the newest among
those — and only ever one of this format whose digest verifies: a file another
edge version wrote, or one edited by hand, is neither read for it nor pruned.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from edge_core.config.model import PipelineConfig
from edge_core.identity import identity_digest
from edge_core.selection.key import DecisionKey

__all__ = ["CACHE_ENV", "FORMAT", "KEEP_PER_PIPELINE", "DecisionCacheWarning",
           "DecisionStore", "Lookup", "StoredDecision", "check_decision", "default_cache_dir",
           "make_private_directory"]

CACHE_ENV = "EDGE_PLACEMENT_CACHE"
"""Environment variable naming the decisions' directory (tests point it at a temporary one)."""

FORMAT = "edge-placement-decision/1"
"""The ``format`` of a stored decision file."""

KEEP_PER_PIPELINE = 8
"""Stored decisions kept per pipeline name (older ones are removed on save)."""

_SUFFIX = ".json"


class DecisionCacheWarning(UserWarning):
    """A stored decision could not be used (unreadable, corrupt, not verifiable)."""


def make_private_directory(directory: Path) -> None:
    """Create ``directory`` and each missing folder above it, each mode 0700.

    ``Path.mkdir(parents=True, mode=...)`` gives the mode to the last folder only: the
    placement directory, made as the parent of the gates' on a first save of a gate, was
    0755 (world-readable) against the documented 0700.
    """
    missing = []
    folder = directory
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    directory.mkdir(mode=0o700, exist_ok=True)  # a file in its place: FileExistsError


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$EDGE_PLACEMENT_CACHE``, else ``$XDG_CACHE_HOME/edge/placement`` (or ~/.cache)."""
    env = os.environ if env is None else env
    configured = env.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge" / "placement"


@attrs.frozen
class StoredDecision:
    """A decision read back from the store, verified."""

    key: str
    """The key's digest."""
    parts: Mapping[str, str]
    """The key's parts' digests when it was stored."""
    pipeline: str
    """The pipeline's name."""
    measured_at: str
    """When it was measured (UTC, ISO 8601)."""
    decision: Mapping[str, Any]
    """What was decided, as the runtime wrote it (``stages`` → ``{choice, backend, ...}``)."""
    path: Path
    """The file it came from."""


@attrs.frozen
class Lookup:
    """What the store found for a key."""

    found: StoredDecision | None
    """The verified decision, or ``None``."""
    warning: str | None = None
    """Why a file for this key was not used (also issued as a warning)."""
    previous: StoredDecision | None = None
    """Without a decision for this key: the stored one of the same pipeline whose key
    differs in the fewest parts (the newest among those), to say which part changed."""

    def changed(self, key: DecisionKey) -> list[str]:
        """The key parts that differ from :attr:`previous`'s (empty without one)."""
        return key.changed(self.previous.parts) if self.previous is not None else []


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _digest(document: Mapping[str, Any]) -> str:
    return identity_digest({k: v for k, v in document.items() if k != "digest"})


def check_decision(decision: object, config: PipelineConfig) -> str | None:
    """Why ``decision`` does not fit ``config`` (``None``: it fits).

    Every stage of the pipeline must be there with a ``choice`` index in range whose
    ``backend`` is that candidate's.
    """
    if not isinstance(decision, Mapping) or not isinstance(decision.get("stages"), Mapping):
        return "the decision has no stages table"
    stages = decision["stages"]
    for stage in config.stages:
        entry = stages.get(stage.id)
        if not isinstance(entry, Mapping):
            return f"stage {stage.id!r} is missing"
        choices = stage.choices()
        choice = entry.get("choice")
        if isinstance(choice, bool) or not isinstance(choice, int) \
                or not 0 <= choice < len(choices):
            return f"stage {stage.id!r}: candidate index out of range: {choice!r}"
        if entry.get("backend") != choices[choice].backend.name:
            return (f"stage {stage.id!r}: candidate {choice} is "
                    f"{choices[choice].backend.name!r}, not {entry.get('backend')!r}")
    extra = sorted(set(stages) - {stage.id for stage in config.stages})
    if extra:
        return f"stages the pipeline does not have: {extra}"
    return None


class DecisionStore:
    """The decisions in one directory (created on first save, mode 0700)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        """Use ``directory``, or :func:`default_cache_dir`."""
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    def path(self, key: DecisionKey | str) -> Path:
        """The file a key's decision lives in."""
        digest = key.digest if isinstance(key, DecisionKey) else key
        return self.directory / f"{digest}{_SUFFIX}"

    def load(self, key: DecisionKey, config: PipelineConfig) -> Lookup:
        """The verified decision stored under ``key`` for ``config``, if any.

        Never raises for what it reads: an unusable file gives ``found=None`` and a
        :class:`DecisionCacheWarning` naming the file and the reason.
        """
        path = self.path(key)
        if not path.exists():
            return Lookup(found=None, previous=self._nearest(key, config.name))
        try:
            stored = self._read(path, key.digest, config)
        except _Unusable as problem:
            message = f"stored placement decision {path}: {problem}; measuring again"
            warnings.warn(message, DecisionCacheWarning, stacklevel=2)
            return Lookup(found=None, warning=message, previous=self._nearest(key, config.name))
        return Lookup(found=stored)

    def save(self, key: DecisionKey, config: PipelineConfig,
             decision: Mapping[str, Any]) -> StoredDecision:
        """Store ``decision`` under ``key``; returns what a later :meth:`load` gives.

        Raises:
            ValueError: ``decision`` does not fit ``config`` (a bug in the caller).
            OSError: the directory cannot be written.

        """
        problem = check_decision(decision, config)
        if problem is not None:
            raise ValueError(f"decision: {problem}")
        document: dict[str, Any] = {"format": FORMAT, "key": key.digest,
                                    "parts": dict(key.parts), "pipeline": config.name,
                                    "measured_at": _now(),
                                    "decision": json.loads(json.dumps(decision, default=str))}
        document["digest"] = _digest(document)
        make_private_directory(self.directory)
        path = self.path(key)
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".decision.",
                                         suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=1, sort_keys=True)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        self._prune(config.name, keep=path)
        return StoredDecision(key=key.digest, parts=dict(key.parts), pipeline=config.name,
                              measured_at=document["measured_at"],
                              decision=document["decision"], path=path)

    def forget(self, key: DecisionKey) -> bool:
        """Remove the decision stored under ``key``; True if there was one."""
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    # -- reading ---------------------------------------------------------------------------

    def _read(self, path: Path, digest: str, config: PipelineConfig) -> StoredDecision:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _Unusable(f"cannot be read ({exc})") from None
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise _Unusable(f"not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise _Unusable("not a JSON object")
        if document.get("format") != FORMAT:
            raise _Unusable(f"format {document.get('format')!r}, expected {FORMAT!r}")
        if document.get("key") != digest:
            raise _Unusable("it names another key")
        if document.get("digest") != _digest(document):
            raise _Unusable("its digest does not verify (changed after it was written)")
        if document.get("pipeline") != config.name:
            raise _Unusable(f"it is pipeline {document.get('pipeline')!r}'s")
        parts, measured_at = document.get("parts"), document.get("measured_at")
        if not isinstance(parts, dict) or not isinstance(measured_at, str):
            raise _Unusable("parts or measured_at missing")
        problem = check_decision(document.get("decision"), config)
        if problem is not None:
            raise _Unusable(f"it does not fit the pipeline: {problem}")
        return StoredDecision(key=digest, parts=parts, pipeline=config.name,
                              measured_at=measured_at, decision=document["decision"],
                              path=path)

    def _headers(self, pipeline: str, *, verified: bool = False
                 ) -> list[tuple[str, Path, dict[str, Any]]]:
        """(measured_at, path, document) of every readable decision of ``pipeline``.

        Only files of this :data:`FORMAT` count (another version's files are left alone);
        with ``verified``, only those whose digest verifies and whose decision is a table.
        """
        found = []
        try:
            entries = list(self.directory.glob(f"*{_SUFFIX}"))
        except OSError:
            return []
        for path in entries:
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                continue
            if (isinstance(document, dict) and document.get("format") == FORMAT
                    and document.get("pipeline") == pipeline
                    and isinstance(document.get("measured_at"), str)
                    and isinstance(document.get("parts"), dict)
                    and (not verified or (document.get("digest") == _digest(document)
                                          and isinstance(document.get("decision"), dict)))):
                found.append((document["measured_at"], path, document))
        return sorted(found, key=lambda item: (item[0], str(item[1])))

    def _nearest(self, key: DecisionKey, pipeline: str) -> StoredDecision | None:
        """The stored decision of ``pipeline`` nearest ``key``: what changed is said against it.

        The nearest is the one whose key differs in the fewest parts, the newest among those.
        """
        headers = self._headers(pipeline, verified=True)
        if not headers:
            return None
        measured_at, path, document = min(
            reversed(headers), key=lambda header: len(key.changed(header[2]["parts"])))
        return StoredDecision(key=str(document.get("key")), parts=document["parts"],
                              pipeline=pipeline, measured_at=measured_at,
                              decision=document["decision"], path=path)

    def _prune(self, pipeline: str, keep: Path) -> None:
        headers = [h for h in self._headers(pipeline) if h[1] != keep]
        for _, path, _ in headers[:max(0, len(headers) - (KEEP_PER_PIPELINE - 1))]:
            with contextlib.suppress(OSError):
                path.unlink()


class _Unusable(Exception):
    """Why a stored decision file is not used."""
