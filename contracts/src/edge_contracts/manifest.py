"""Artifact manifests: what files make up a model artifact, with their sha256 digests.

This module holds the data and its syntactic rules only (relative POSIX paths without
``..``, lowercase hex digests, metadata that points at listed files). Reading files,
hashing them and refusing symlink escapes is done by edge-core.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_contracts.jsonvalues import JSONObject, freeze_object, strict_loads, thaw_json
from edge_contracts.validation import (
    check_keys,
    rebase,
    require_id,
    require_int,
    require_mapping,
    require_optional_str,
)

__all__ = [
    "MANIFEST_FILENAME",
    "MANIFEST_SCHEMA_VERSION",
    "MAX_FILES",
    "MAX_PATH_LENGTH",
    "ArtifactManifest",
    "ArtifactMetadata",
    "validate_relative_path",
    "validate_sha256",
]

MANIFEST_FILENAME = "edge-manifest.json"
"""The file name of a manifest at the root of an artifact bundle."""

MANIFEST_SCHEMA_VERSION = 1
"""The manifest schema version this implementation reads and writes."""

MAX_FILES = 4096
"""Most files one manifest may list."""

MAX_PATH_LENGTH = 1024
"""Longest relative path in a manifest, in characters."""

_SHA256 = re.compile(r"[0-9a-f]{64}")
_TEXT_MAX = 256


def validate_relative_path(path: object, field: str) -> str:
    """Return ``path`` if it is a normalised relative POSIX path inside the bundle.

    Refused: empty, longer than 1024 characters, a leading ``/``, a backslash, a colon,
    a control character, and empty, ``.`` or ``..`` segments.
    """
    if not isinstance(path, str) or not path:
        raise InvalidValue(field, path, "must be a non-empty relative path")
    if len(path) > MAX_PATH_LENGTH:
        raise InvalidValue(field, path, f"must be <= {MAX_PATH_LENGTH} characters")
    if path.startswith("/"):
        raise InvalidValue(field, path, "must be relative (no leading /)")
    if "\\" in path:
        raise InvalidValue(field, path, "must use / as separator (no backslash)")
    if ":" in path:
        raise InvalidValue(field, path, "must not contain a colon (drive or stream)")
    if not path.isprintable():
        raise InvalidValue(field, path, "must contain printable characters only")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidValue(field, path, "must not have empty, '.' or '..' segments")
    return path


def validate_sha256(digest: object, field: str) -> str:
    """Return ``digest`` if it is 64 lowercase hexadecimal characters."""
    if not isinstance(digest, str) or _SHA256.fullmatch(digest) is None:
        raise InvalidValue(field, digest, "must be a sha256 digest of 64 lowercase hex characters")
    return digest


@dataclass(frozen=True, slots=True)
class ArtifactMetadata:
    """Facts about an artifact that placement, validation and reports rely on.

    Attributes:
        graph: path (a key of the manifest's files) of the model graph.
        example_inputs: path of the example-inputs file used by warm-up, if any.
        checkpoint_revision: revision of the source checkpoint, if known.
        precision: numeric precision of the weights (e.g. ``float16``, ``int8-qdq``).
        layout: tensor layout convention of the graph (e.g. ``NCHW``).
        exporter: tool and version that produced the graph.
        calibration: JSON data describing quantisation calibration, if any.
        validation: JSON data describing how the artifact was validated, if any.

    """

    graph: str
    example_inputs: str | None = None
    checkpoint_revision: str | None = None
    precision: str | None = None
    layout: str | None = None
    exporter: str | None = None
    calibration: Mapping[str, Any] | None = None
    validation: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        validate_relative_path(self.graph, "metadata.graph")
        if self.example_inputs is not None:
            validate_relative_path(self.example_inputs, "metadata.example_inputs")
        for name in ("checkpoint_revision", "precision", "layout", "exporter"):
            require_optional_str(getattr(self, name), f"metadata.{name}", max_length=_TEXT_MAX)
        for name in ("calibration", "validation"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, freeze_object(value, f"metadata.{name}"))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "graph": self.graph,
            "example_inputs": self.example_inputs,
            "checkpoint_revision": self.checkpoint_revision,
            "precision": self.precision,
            "layout": self.layout,
            "exporter": self.exporter,
            "calibration": None if self.calibration is None else _thaw(self.calibration),
            "validation": None if self.validation is None else _thaw(self.validation),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "metadata") -> ArtifactMetadata:
        """Build from the JSON form; every key but ``graph`` may be omitted."""
        mapping: Any = check_keys(data, field, ("graph",), _METADATA_OPTIONAL)
        try:
            return cls(**mapping)
        except InvalidValue as exc:
            raise rebase(exc, "metadata", field) from None


_METADATA_OPTIONAL = frozenset(
    {
        "example_inputs",
        "checkpoint_revision",
        "precision",
        "layout",
        "exporter",
        "calibration",
        "validation",
    }
)


def _thaw(value: Mapping[str, Any]) -> object:
    return thaw_json(value) if isinstance(value, JSONObject) else dict(value)


@dataclass(frozen=True, slots=True)
class ArtifactManifest:
    """The manifest of an artifact bundle: its files with digests, and its metadata.

    Attributes:
        schema_version: manifest schema version (must be 1).
        component: name of the component the artifact implements (e.g. ``ocr-det``).
        files: relative path -> lowercase sha256 hex digest; non-empty, frozen.
        metadata: facts about the artifact; its ``graph`` and ``example_inputs`` must be
            keys of ``files``.

    """

    schema_version: int
    component: str
    files: Mapping[str, str]
    metadata: ArtifactMetadata

    def __post_init__(self) -> None:
        require_int(self.schema_version, "manifest.schema_version")
        if self.schema_version != MANIFEST_SCHEMA_VERSION:
            raise InvalidValue(
                "manifest.schema_version",
                self.schema_version,
                f"unsupported (this implementation reads {MANIFEST_SCHEMA_VERSION})",
            )
        require_id(self.component, "manifest.component")
        files = require_mapping(self.files, "manifest.files")
        if not files:
            raise InvalidValue("manifest.files", {}, "must list at least one file")
        if len(files) > MAX_FILES:
            raise InvalidValue("manifest.files", len(files), f"must list <= {MAX_FILES} files")
        checked: dict[str, str] = {}
        for path in sorted(files):
            where = f"manifest.files[{json.dumps(path)}]"
            validate_relative_path(path, where)
            checked[path] = validate_sha256(files[path], where)
        object.__setattr__(self, "files", JSONObject(checked))
        if not isinstance(self.metadata, ArtifactMetadata):
            raise InvalidValue("manifest.metadata", self.metadata, "must be an ArtifactMetadata")
        for name in ("graph", "example_inputs"):
            path = getattr(self.metadata, name)
            if path is not None and path not in checked:
                raise InvalidValue(f"manifest.metadata.{name}", path, "must be a key of files")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "schema_version": self.schema_version,
            "component": self.component,
            "files": dict(self.files),
            "metadata": self.metadata.to_dict(),
        }

    def to_json(self) -> str:
        """Return the canonical JSON text (sorted keys, two-space indent, final newline)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "manifest") -> ArtifactManifest:
        """Build from the JSON form; every key is required."""
        mapping: Any = check_keys(data, field, _MANIFEST_KEYS)
        try:
            values = dict(mapping)
            values["metadata"] = ArtifactMetadata.from_dict(values["metadata"], "manifest.metadata")
            return cls(**values)
        except InvalidValue as exc:
            raise rebase(exc, "manifest", field) from None

    @classmethod
    def from_json(cls, text: str | bytes, field: str = "manifest") -> ArtifactManifest:
        """Parse manifest JSON text (e.g. the content of ``edge-manifest.json``)."""
        try:
            data = strict_loads(text)
        except (ValueError, RecursionError) as exc:
            raise InvalidValue(field, str(exc), "must be valid JSON") from None
        return cls.from_dict(data, field)


_MANIFEST_KEYS = frozenset({"schema_version", "component", "files", "metadata"})

