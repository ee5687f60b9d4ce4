"""Errors of the host layer, each a subclass of the core hierarchy in :mod:`edge_core.errors`.

Every message reads ``field: reason: value`` and the three parts are kept as attributes.
"""

from __future__ import annotations

from edge_contracts.error_details import ErrorDetail
from edge_core.errors import ConfigError, ResourceUnavailable, WorkerError, WorkerLost

__all__ = [
    "BootstrapRefused",
    "DeviceLockTimeout",
    "InputBufferBusy",
    "ProtocolViolation",
    "RemoteError",
    "RouteRefused",
    "TransportCapExceeded",
    "WorkerGone",
    "WorkerUnresponsive",
]


class RouteRefused(ConfigError):
    """A route cannot be used: missing or non-executable interpreter, bad entry, bad domain."""


def _message(field: str, reason: str, value: object) -> str:
    """The message of every error here: ``field: reason: value`` (the value's ``repr``)."""
    return f"{field}: {reason}: {value!r}"


class BootstrapRefused(WorkerError):
    """The worker's hello was refused (token, protocol version, features, identity) or late."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field, self.reason, self.value = field, reason, value
        super().__init__(_message(field, reason, value))


class ProtocolViolation(WorkerError):
    """The worker wrote something that is not a valid frame, or an op out of protocol."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field, self.reason, self.value = field, reason, value
        super().__init__(_message(field, reason, value))


class RemoteError(WorkerError):
    """The worker's handler failed; ``remote_type`` is the name of the exception it raised.

    ``remote_detail`` is that exception's own field, reason and value as the worker sent
    them (:class:`~edge_contracts.error_details.ErrorDetail`), or None when it had none
    that fit: read what a worker's error names there, never out of its message.
    """

    def __init__(self, field: str, remote_type: str, message: str,
                 detail: ErrorDetail | None = None) -> None:
        self.remote_type = remote_type
        self.remote_detail = detail
        self.field, self.reason, self.value = field, f"{remote_type} in worker", message
        super().__init__(_message(field, self.reason, message))


class WorkerGone(WorkerLost):
    """The worker died or its channel closed while work was in flight (a :class:`WorkerLost`)."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field, self.reason, self.value = field, reason, value
        super().__init__(_message(field, reason, value))


class WorkerUnresponsive(WorkerGone):
    """The worker process stopped answering while work was outstanding (stopped, hung).

    Raised by the liveness monitor (:mod:`edge_core.host.liveness`), which watches the
    worker from its own thread, never from the thread that waits for the call; the
    worker is treated as lost (a :class:`WorkerGone`) and must be retired.
    """


class TransportCapExceeded(ResourceUnavailable):
    """Shared-memory retention would exceed a producer's cap on bytes or buffers.

    ``clears`` is True when calls in flight on the channel held shared memory when it
    was refused: their ends give it back, so the same request may fit once they end (a
    replica set waits for that, bounded by the request's deadline). False when nothing
    in flight would free any: what fills the cap is held by the caller (input buffers,
    unacknowledged results) or the request alone needs more than the cap.
    """

    def __init__(self, field: str, reason: str, value: object, *, clears: bool = False) -> None:
        self.field, self.reason, self.value = field, reason, value
        super().__init__(_message(field, reason, value))
        self.clears = clears


class InputBufferBusy(ResourceUnavailable):
    """An input buffer was sent again while the worker still holds it (request in flight)."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field, self.reason, self.value = field, reason, value
        super().__init__(_message(field, reason, value))


class DeviceLockTimeout(ResourceUnavailable):
    """A device-initialisation lock was not acquired in time; ``holder_pid`` when known."""

    def __init__(self, field: str, reason: str, value: object, holder_pid: int | None) -> None:
        self.holder_pid = holder_pid
        self.field, self.reason, self.value = field, reason, value
        super().__init__(_message(field, reason, value))
