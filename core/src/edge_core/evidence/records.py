"""The qualification record of one device x model x configuration cell, and its JSON form.

A record keeps functional outcomes (placement, numerics, answers) and performance
outcomes (latency, start-up, memory) in separate fields, carries the identities needed
to reproduce the cell (device/OS, artifact, backend, command, execution plan) and, for
FAILED, REJECTED and BLOCKED, the failing layer, the observed reason and the smallest
next step.

Schema version 2 (``edge.qualification/2``) adds four separate verdicts (functional,
quality, performance, reliability: :mod:`.verdicts`), the operating conditions the
evidence was taken under, the runtime identity (the one stored placement decisions key
on) with the package inventories and source revision, and the placement comparison of
candidate backends. Version 1 records are still read (and rendered by ``edge matrix``);
they carry none of these, and say so.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.status import Status

__all__ = ["RECORD_SCHEMA", "RECORD_SCHEMAS", "Cell", "Failure", "QualificationRecord",
           "load_record", "write_record"]

RECORD_SCHEMA = "edge.qualification/2"
"""The ``schema`` value of every record written now."""

RECORD_SCHEMA_V1 = "edge.qualification/1"
RECORD_SCHEMAS = (RECORD_SCHEMA_V1, RECORD_SCHEMA)
"""The record schemas read (version 1: before the four verdicts)."""


def _text(field: str) -> Any:
    def check(_: object, __: attrs.Attribute[str], value: str) -> None:
        if not isinstance(value, str) or not value.strip():
            raise RecordInvalid(field, "must be a non-empty string", value)
    return check


@attrs.frozen
class Cell:
    """The matrix coordinates: which device, which model, which configuration."""

    device: str = attrs.field(validator=_text("cell.device"))
    model: str = attrs.field(validator=_text("cell.model"))
    configuration: str = attrs.field(validator=_text("cell.configuration"))

    @property
    def key(self) -> tuple[str, str, str]:
        """``(device, model, configuration)``."""
        return (self.device, self.model, self.configuration)


@attrs.frozen
class Failure:
    """Where a run stopped: the layer, what was observed, and the smallest next step."""

    layer: str = attrs.field(validator=_text("failure.layer"))
    reason: str = attrs.field(validator=_text("failure.reason"))
    next_step: str = attrs.field(validator=_text("failure.next_step"))
    step: str | None = None
    error_type: str | None = None


def _strings(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


def _status(value: object) -> Status:
    try:
        return Status(str(value))
    except ValueError:
        raise RecordInvalid("status", f"must be one of {[s.value for s in Status]}",
                            value) from None


@attrs.frozen
class QualificationRecord:
    """One cell's evidence. Build with :mod:`edge_core.evidence.qualify`.

    Attributes:
        status: the cell's status (see :class:`~edge_core.evidence.status.Status`).
        cell: device, model and configuration labels (the matrix coordinates).
        created_at: ISO-8601 UTC time the evidence was produced.
        source: where the evidence comes from: ``{"kind": "profile" | "ai-hub", ...}``.
        device: the exact device and OS identity.
        artifact: the artifact identity (per stage: component, manifest digest, files).
        backend: the backend identity (names, plugins, runtime versions).
        command: the reproducible command (argv and working directory).
        execution_plan: the execution plan, when a pipeline was opened.
        functional: functional outcomes (placement, numerics, checks) only.
        performance: performance outcomes (latency, start-up, memory) only.
        failure: for FAILED, REJECTED and BLOCKED: layer, reason, next step.
        notes: free remarks (measurement caveats).
        verdicts: functional, quality, performance and reliability, each ``{"verdict":
            "met" | "failed" | "unjudged", "basis": ...}`` (empty in a version 1 record).
        conditions: the operating conditions observed (load, frequency, temperature,
            power, compiled-cache use).
        identity: runtime identity and digest, package inventories, source revision.
        placement: the candidates each stage tried and the comparison that chose one.
        schema: the schema the record was written in.
    """

    status: Status = attrs.field(converter=_status)
    cell: Cell
    created_at: str = attrs.field(validator=_text("created_at"))
    source: Mapping[str, Any]
    device: Mapping[str, Any]
    artifact: Mapping[str, Any]
    backend: Mapping[str, Any]
    command: Mapping[str, Any]
    execution_plan: Mapping[str, Any] | None
    functional: Mapping[str, Any]
    performance: Mapping[str, Any]
    failure: Failure | None = None
    notes: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    verdicts: Mapping[str, Any] = attrs.field(factory=dict)
    conditions: Mapping[str, Any] = attrs.field(factory=dict)
    identity: Mapping[str, Any] = attrs.field(factory=dict)
    placement: Mapping[str, Any] = attrs.field(factory=dict)
    schema: str = RECORD_SCHEMA

    def __attrs_post_init__(self) -> None:
        if self.schema not in RECORD_SCHEMAS:
            raise RecordInvalid("schema", f"must be one of {list(RECORD_SCHEMAS)}", self.schema)
        if self.schema == RECORD_SCHEMA_V1 and not self.status.in_v1:
            raise RecordInvalid("status", f"not a status of {RECORD_SCHEMA_V1}",
                                self.status.value)
        if self.status.needs_failure and self.failure is None:
            raise RecordInvalid("failure", f"required for status {self.status.value}")
        if not self.status.needs_failure and self.failure is not None:
            raise RecordInvalid("failure", f"only FAILED, REJECTED and BLOCKED carry one, "
                                f"not {self.status.value}", self.failure.layer)
        if self.source.get("kind") not in ("profile", "ai-hub"):
            raise RecordInvalid("source.kind", "must be 'profile' or 'ai-hub'",
                                self.source.get("kind"))

    @property
    def record_id(self) -> str:
        """A short stable id: hash of the cell, the source and the creation time."""
        text = json.dumps([list(self.cell.key), self.created_at, dict(self.source)],
                          sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``schema`` first); a version 1 record keeps its own fields."""
        body = attrs.asdict(self, recurse=True,
                            value_serializer=lambda _i, _a, v: v.value
                            if isinstance(v, Status) else v)
        body["notes"] = list(self.notes)
        schema = body.pop("schema")
        if schema == RECORD_SCHEMA_V1:
            for name in ("verdicts", "conditions", "identity", "placement"):
                body.pop(name)
        return {"schema": schema, "record_id": self.record_id, **body}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QualificationRecord:
        """Read a record's JSON form (version 1 or 2).

        Refuses another schema or a missing field.
        """
        if not isinstance(data, Mapping):
            raise RecordInvalid("record", "must be a JSON object", type(data).__name__)
        schema = data.get("schema")
        if schema not in RECORD_SCHEMAS:
            raise RecordInvalid("schema", f"must be one of {list(RECORD_SCHEMAS)}", schema)
        fields = {f.name for f in attrs.fields(cls)} - {"schema"}
        required = {f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING}
        missing = sorted(required - set(data))
        if missing:
            raise RecordInvalid("record", "missing fields", missing)
        values = {k: v for k, v in data.items() if k in fields}
        cell = values["cell"]
        if not isinstance(cell, Mapping):
            raise RecordInvalid("cell", "must be an object", cell)
        values["cell"] = Cell(cell.get("device", ""), cell.get("model", ""),
                              cell.get("configuration", ""))
        failure = values.get("failure")
        if failure is not None:
            if not isinstance(failure, Mapping):
                raise RecordInvalid("failure", "must be an object or null", failure)
            values["failure"] = Failure(failure.get("layer", ""), failure.get("reason", ""),
                                        failure.get("next_step", ""), failure.get("step"),
                                        failure.get("error_type"))
        names = ["source", "device", "artifact", "backend", "command", "functional",
                 "performance"]
        if schema == RECORD_SCHEMA:
            names += ["verdicts", "conditions", "identity", "placement"]
            missing = sorted(set(names) - set(values))
            if missing:
                raise RecordInvalid("record", "missing fields", missing)
        else:
            values = {k: v for k, v in values.items()
                      if k not in ("verdicts", "conditions", "identity", "placement")}
        for name in names:
            if not isinstance(values[name], Mapping):
                raise RecordInvalid(name, "must be an object", values[name])
        return cls(**values, schema=str(schema))


def load_record(path: str | os.PathLike[str]) -> QualificationRecord:
    """Read one record file; errors name the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordInvalid(str(path), f"cannot read a JSON record ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise RecordInvalid(str(path),
                            f"not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        return QualificationRecord.from_json(data)
    except RecordInvalid as exc:
        raise RecordInvalid(f"{path}: {exc.field}", exc.reason, exc.value) from exc


def write_record(record: QualificationRecord, path: str | os.PathLike[str]) -> Path:
    """Write the record as indented JSON (parents created); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record.to_json(), indent=2, default=str) + "\n",
                      encoding="utf-8")
    return target
