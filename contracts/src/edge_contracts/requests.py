"""Stage requests and the events that answer them.

A :class:`StageRequest` asks one stage for one operation under an epoch and a worker
generation; the worker answers with :class:`StageEvent` values numbered by ``seq``.
Exactly one terminal event (DONE, ERROR or CANCELLED) ends a request; ERROR and
CANCELLED events carry no outputs, because cancelled or failed work never produces
output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_contracts.buffers import BufferDescriptor
from edge_contracts.drafts import draft_class
from edge_contracts.error_details import ErrorDetail
from edge_contracts.errors import InvalidValue
from edge_contracts.events import TERMINAL_KINDS, EventKind, Operation
from edge_contracts.jsonvalues import EMPTY_OBJECT, JSONObject, freeze_object, thaw_json
from edge_contracts.request_faults import RequestFault
from edge_contracts.validation import (
    INT64_MAX,
    MAX_ID_LENGTH,
    check_keys,
    parse_enum,
    rebase,
    require_bool,
    require_id,
    require_int,
    require_list,
    require_str,
)

__all__ = [
    "MAX_BUFFERS",
    "MAX_ERROR_MESSAGE",
    "ErrorInfo",
    "EventKind",
    "Operation",
    "StageEvent",
    "StageRequest",
    "prechecked_event",
    "prechecked_request",
]

MAX_BUFFERS = 1024
"""Most input buffers of a request, or output buffers of an event."""

MAX_ERROR_MESSAGE = 8192
"""Longest error message carried by an event, in characters."""




def _buffers(values: object, field: str) -> tuple[BufferDescriptor, ...]:
    items = require_list(values, field, max_length=MAX_BUFFERS)
    out = []
    for index, item in enumerate(items):
        if not isinstance(item, BufferDescriptor):
            raise InvalidValue(f"{field}[{index}]", item, "must be a BufferDescriptor")
        if not item.ready:  # nothing on either side waits for a buffer to become ready
            raise InvalidValue(
                f"{field}[{index}].ready", item.ready, "must be true (buffers travel complete)"
            )
        out.append(item)
    return tuple(out)


def _parse_buffers(values: object, field: str) -> list[BufferDescriptor]:
    items = require_list(values, field, max_length=MAX_BUFFERS)
    return [
        BufferDescriptor.from_dict(item, f"{field}[{index}]")  # type: ignore[arg-type]
        for index, item in enumerate(items)
    ]


@dataclass(frozen=True, slots=True)
class StageRequest:
    """One request to one stage.

    Attributes:
        request_id: unique id of the request (non-empty, printable, <= 128 characters).
        stage_id: id of the stage the request is for.
        epoch: the stage's epoch when the request was issued; a cancel bumps it, and
            work of an older epoch must produce no output.
        generation: the worker generation the request is addressed to.
        operation: what is asked (``run`` or ``generate``).
        inputs: descriptors of the input buffers, in the stage's input order.
        params: JSON-compatible operation parameters (frozen).
        deadline_ns: absolute monotonic deadline in nanoseconds, or ``None``.

    """

    request_id: str
    stage_id: str
    epoch: int
    generation: int
    operation: Operation
    inputs: tuple[BufferDescriptor, ...] = ()
    params: Mapping[str, Any] = EMPTY_OBJECT
    deadline_ns: int | None = None

    def __post_init__(self) -> None:
        # Each check is inlined for the common valid value (a request is built per
        # call) and falls back to the validator, which raises, otherwise.
        value: Any = self.request_id
        if not (type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()):
            require_id(value, "request.request_id")
        value = self.stage_id
        if not (type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()):
            require_id(value, "request.stage_id")
        epoch, generation = self.epoch, self.generation
        if not (type(epoch) is int and 0 <= epoch <= INT64_MAX):
            require_int(epoch, "request.epoch")
        if not (type(generation) is int and 0 <= generation <= INT64_MAX):
            require_int(generation, "request.generation")
        set_ = object.__setattr__
        if type(self.operation) is not Operation:
            set_(self, "operation", parse_enum(Operation, self.operation, "request.operation"))
        if not (type(self.inputs) is tuple and not self.inputs):
            set_(self, "inputs", _buffers(self.inputs, "request.inputs"))
        set_(self, "params", freeze_object(self.params, "request.params"))
        if self.deadline_ns is not None:
            require_int(self.deadline_ns, "request.deadline_ns")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "request_id": self.request_id,
            "stage_id": self.stage_id,
            "epoch": self.epoch,
            "generation": self.generation,
            "operation": self.operation.value,
            "inputs": [buffer.to_dict() for buffer in self.inputs],
            "params": thaw_json(self.params),  # type: ignore[arg-type]
            "deadline_ns": self.deadline_ns,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "request") -> StageRequest:
        """Build from the JSON form; keys with a default may be omitted."""
        mapping: Any = check_keys(data, field, _REQUEST_REQUIRED, _REQUEST_OPTIONAL)
        try:
            values = dict(mapping)
            if "inputs" in values:
                values["inputs"] = _parse_buffers(values["inputs"], "request.inputs")
            return cls(**values)
        except InvalidValue as exc:
            raise rebase(exc, "request", field) from None


_REQUEST_REQUIRED = frozenset({"request_id", "stage_id", "epoch", "generation", "operation"})
_REQUEST_OPTIONAL = frozenset({"inputs", "params", "deadline_ns"})


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a request failed: an error type name and a human-readable message.

    Attributes:
        type: the error's class or category name (non-empty, printable, <= 128).
        message: the message, at most 8192 characters (may be empty).
        traceback: the worker's formatted traceback, its last 8192 characters (optional).
        fault: present when the error declared itself the request's own fault (a client
            error): its code word and the request field at fault
            (:mod:`edge_contracts.request_faults`); absent for a server error.
        detail: the error's own field, reason and value as data, when it has them and
            they fit (:mod:`edge_contracts.error_details`); absent otherwise.

    """

    type: str
    message: str
    traceback: str | None = None
    fault: RequestFault | None = None
    detail: ErrorDetail | None = None

    def __post_init__(self) -> None:
        require_id(self.type, "error.type")
        require_str(self.message, "error.message", max_length=MAX_ERROR_MESSAGE, allow_empty=True)
        if self.traceback is not None:
            require_str(self.traceback, "error.traceback", max_length=MAX_ERROR_MESSAGE,
                        allow_empty=True)
        if self.fault is not None and not isinstance(self.fault, RequestFault):
            raise InvalidValue("error.fault", self.fault, "must be a RequestFault or None")
        if self.detail is not None and not isinstance(self.detail, ErrorDetail):
            raise InvalidValue("error.detail", self.detail, "must be an ErrorDetail or None")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (``traceback``, ``fault``, ``detail`` only when set)."""
        data: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.traceback is not None:
            data["traceback"] = self.traceback
        if self.fault is not None:
            data["fault"] = self.fault.to_dict()
        if self.detail is not None:
            data["detail"] = self.detail.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "error") -> ErrorInfo:
        """Build from the JSON form; ``type`` and ``message`` are required."""
        mapping: Any = check_keys(data, field, ("type", "message"),
                                  ("traceback", "fault", "detail"))
        if mapping.get("fault") is not None:
            mapping = {**mapping, "fault": RequestFault.from_dict(mapping["fault"],
                                                                  f"{field}.fault")}
        if mapping.get("detail") is not None:
            mapping = {**mapping, "detail": ErrorDetail.from_dict(mapping["detail"],
                                                                  f"{field}.detail")}
        try:
            return cls(**mapping)
        except InvalidValue as exc:
            raise rebase(exc, "error", field) from None


@dataclass(frozen=True, slots=True)
class StageEvent:
    """One event answering a request.

    Attributes:
        request_id: the request answered.
        stage_id: the stage that answers.
        epoch: the epoch of the request; consumers drop events of a stale epoch.
        generation: the generation of the worker that produced the event.
        seq: position in the request's event stream, from 0.
        kind: what the event is.
        terminal: ``True`` exactly when ``kind`` is DONE, ERROR or CANCELLED.
        error: present exactly when ``kind`` is ERROR.
        outputs: output buffer descriptors (never on ERROR or CANCELLED).
        data: JSON-compatible event data, e.g. token text (frozen).
        created_ns: creation time, nanoseconds of the producer's monotonic clock.

    """

    request_id: str
    stage_id: str
    epoch: int
    generation: int
    seq: int
    kind: EventKind
    terminal: bool
    error: ErrorInfo | None = None
    outputs: tuple[BufferDescriptor, ...] = ()
    data: Mapping[str, Any] = EMPTY_OBJECT
    created_ns: int = 0

    def __post_init__(self) -> None:
        # Inlined for the common valid value, as in StageRequest (one event per output).
        value: Any = self.request_id
        if not (type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()):
            require_id(value, "event.request_id")
        value = self.stage_id
        if not (type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()):
            require_id(value, "event.stage_id")
        epoch, generation, seq = self.epoch, self.generation, self.seq
        if not (type(epoch) is int and 0 <= epoch <= INT64_MAX):
            require_int(epoch, "event.epoch")
        if not (type(generation) is int and 0 <= generation <= INT64_MAX):
            require_int(generation, "event.generation")
        if not (type(seq) is int and 0 <= seq <= INT64_MAX):
            require_int(seq, "event.seq")
        kind = self.kind
        if type(kind) is not EventKind:
            kind = parse_enum(EventKind, kind, "event.kind")
            object.__setattr__(self, "kind", kind)
        flag: object = self.terminal
        if type(flag) is not bool:
            require_bool(flag, "event.terminal")
        terminal = kind in TERMINAL_KINDS
        if self.terminal != terminal:
            raise InvalidValue(
                "event.terminal", self.terminal, f"must be {terminal} for kind {kind.value}"
            )
        if kind is EventKind.ERROR:
            if not isinstance(self.error, ErrorInfo):
                raise InvalidValue("event.error", self.error, "kind error needs an ErrorInfo")
        elif self.error is not None:
            raise InvalidValue("event.error", self.error, f"must be null for kind {kind.value}")
        outputs = self.outputs
        if not (type(outputs) is tuple and not outputs):
            outputs = _buffers(outputs, "event.outputs")
        if outputs and kind in (EventKind.ERROR, EventKind.CANCELLED):
            raise InvalidValue(
                "event.outputs", len(outputs), f"must be empty for kind {kind.value}"
            )
        object.__setattr__(self, "outputs", outputs)
        object.__setattr__(self, "data", freeze_object(self.data, "event.data"))
        created_ns = self.created_ns
        if not (type(created_ns) is int and 0 <= created_ns <= INT64_MAX):
            require_int(created_ns, "event.created_ns")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "request_id": self.request_id,
            "stage_id": self.stage_id,
            "epoch": self.epoch,
            "generation": self.generation,
            "seq": self.seq,
            "kind": self.kind.value,
            "terminal": self.terminal,
            "error": None if self.error is None else self.error.to_dict(),
            "outputs": [buffer.to_dict() for buffer in self.outputs],
            "data": thaw_json(self.data),  # type: ignore[arg-type]
            "created_ns": self.created_ns,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "event") -> StageEvent:
        """Build from the JSON form; keys with a default may be omitted."""
        mapping: Any = check_keys(data, field, _EVENT_REQUIRED, _EVENT_OPTIONAL)
        try:
            values = dict(mapping)
            if values.get("error") is not None:
                values["error"] = ErrorInfo.from_dict(values["error"], "event.error")
            if "outputs" in values:
                values["outputs"] = _parse_buffers(values["outputs"], "event.outputs")
            return cls(**values)
        except InvalidValue as exc:
            raise rebase(exc, "event", field) from None


_EVENT_REQUIRED = frozenset(
    {"request_id", "stage_id", "epoch", "generation", "seq", "kind", "terminal"}
)
_EVENT_OPTIONAL = frozenset({"error", "outputs", "data", "created_ns"})


# Drafts of the two classes (edge_contracts.drafts): the prechecked builders below set each
# field by a plain attribute store, then make the draft the frozen class's instance.
_RequestDraft = draft_class(StageRequest)
_EventDraft = draft_class(StageEvent)


def prechecked_request(
    request_id: str, stage_id: str, epoch: int, generation: int, operation: Operation,
    params: Mapping[str, Any] | None,
) -> StageRequest:
    """Build a :class:`StageRequest` whose ids and integers were checked once already.

    For a runtime's per-call path only: ``request_id`` is one it generated (or checked as
    :func:`~edge_contracts.validation.require_id` does), ``stage_id`` its checked
    configuration's, ``epoch`` and ``generation`` its own counters and
    ``operation`` an :class:`Operation`. ``params`` come from the caller and are still
    checked and frozen here. A caller holding anything else must build ``StageRequest``.
    """
    request = _RequestDraft()
    request.request_id = request_id
    request.stage_id = stage_id
    request.epoch = epoch
    request.generation = generation
    request.operation = operation
    request.inputs = ()
    request.params = freeze_object(params, "request.params") if params else EMPTY_OBJECT
    request.deadline_ns = None
    request.__class__ = StageRequest
    return request  # type: ignore[no-any-return]  # (a StageRequest now: no cast call)


def prechecked_event(
    request_id: str, stage_id: str, epoch: int, generation: int, seq: int, kind: EventKind,
    error: ErrorInfo | None, outputs: tuple[BufferDescriptor, ...], data: Mapping[str, Any],
    created_ns: int,
) -> StageEvent:
    """Build a :class:`StageEvent` from fields a parsed frame header checked already.

    For a controller's per-event path only: ``request_id`` is the id of a request in
    flight, ``stage_id`` non-empty and both ids checked by the header parser, the four
    integers in ``0..INT64_MAX`` (the binary ``event-fields`` block checks ``seq`` and
    ``created_ns``), ``kind`` an :class:`EventKind` and ``outputs`` ready
    :class:`BufferDescriptor` objects. What depends on the event itself is still checked:
    ``error`` against ``kind``, ``outputs`` against ``kind``, ``data`` frozen; anything
    wrong there goes through ``StageEvent``, which raises the same error as always.
    """
    failed = kind is EventKind.ERROR or kind is EventKind.CANCELLED
    if (error is not None) != (kind is EventKind.ERROR) or (outputs and failed) or not stage_id:
        return StageEvent(request_id, stage_id, epoch, generation, seq, kind,
                          kind in TERMINAL_KINDS, error, outputs, data, created_ns)
    event = _EventDraft()
    event.request_id = request_id
    event.stage_id = stage_id
    event.epoch = epoch
    event.generation = generation
    event.seq = seq
    event.kind = kind
    event.terminal = kind in TERMINAL_KINDS
    event.error = error
    event.outputs = outputs
    event.data = data if type(data) is JSONObject else freeze_object(data, "event.data")
    event.created_ns = created_ns
    event.__class__ = StageEvent
    return event  # type: ignore[no-any-return]  # (a StageEvent now: no cast call)
