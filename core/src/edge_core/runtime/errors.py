"""Errors raised by the runtime; all subclass :class:`edge_core.errors.EdgeError`."""

from __future__ import annotations

from edge_contracts.request_faults import RequestFault
from edge_core.errors import (
    NO_VALUE,
    ConfigError,
    EdgeError,
    ResourceUnavailable,
    WorkerError,
    field_message,
)

__all__ = [
    "DemandExceeded",
    "DuplicateRequest",
    "NumericsRefused",
    "RequestCancelled",
    "RequestFailed",
    "TopologyRefused",
    "TransformFailed",
    "TransformReturnInvalid",
]


class TopologyRefused(ConfigError):
    """The stages do not form a linear chain (fan-out, a join, several final outputs)."""


class TransformReturnInvalid(EdgeError):
    """A stage's input transform returned no mapping of input names (the pipeline's fault).

    Not a ``ValueError``: the request was well formed, the pipeline's own code was not, so
    ``edge serve`` answers 500 (a server error) and ``edge run`` exits 1, as for a
    transform that raised. The message names the stage's ``input_transform`` (``path``),
    the transform and what was wrong (``reason``), and the offending key or return
    (``value``, shown as :class:`~edge_core.errors.ConfigError` shows values).
    """

    def __init__(self, path: str, reason: str, value: object = NO_VALUE) -> None:
        self.path = path
        self.reason = reason
        self.value = value
        super().__init__(field_message(path, reason, value))


class TransformFailed(EdgeError):
    """A stage's input transform raised while it built the next inputs (the pipeline's fault).

    The request reached the transform well formed (its inputs passed every check of the
    first stage): what the transform raised — a ``ConfigError`` from a ``Fanout`` it built
    wrong, a ``KeyError``, any error not typed as a refusal of the request — is its own
    code's failure. Not a ``ValueError``, so ``edge serve`` answers 500 (code
    ``transform_failed``) and ``edge run`` exits 1, never 400 or 2 as for the request's or
    the file's fault. A transform refuses the request itself by raising an
    ``edge_contracts`` error (``InvalidValue`` naming the request's field) or one that
    declares a request fault (:mod:`edge_contracts.request_faults`): those pass unchanged.

    The original error is :attr:`error` (and ``__cause__``).

    Attributes:
        path: The stage's ``input_transform`` (``pipelines[p].stages[b].input_transform``).
        reason: The transform and the type it raised (``transform m:f raised ConfigError``).
        value: The original error's message.
        error: The original error.
    """

    def __init__(self, path: str, transform: str, error: BaseException) -> None:
        self.path = path
        self.transform = transform
        self.error = error
        self.reason = f"{transform} raised {type(error).__name__}"
        self.value = str(error)
        super().__init__(f"{path}: {self.reason}: {self.value}" if self.value
                         else f"{path}: {self.reason}")

    def __reduce__(self) -> tuple[type[TransformFailed], tuple[str, str, BaseException]]:
        """Rebuild from the three arguments (keeps copy and deepcopy working)."""
        return (type(self), (self.path, self.transform, self.error))


class NumericsRefused(EdgeError):
    """The warm-up outputs differ from the reference by more than the declared bound."""


class DemandExceeded(ResourceUnavailable):
    """A stage's observed peak memory exceeds the demand it reserved: the demand was wrong."""


class RequestCancelled(EdgeError):
    """The request was cancelled (its epoch fenced); it produces no output."""


class RequestFailed(WorkerError):
    """The worker ended the request with an error event.

    Attributes:
        error_type: The error's type name as the worker reported it.
        error_message: The worker's message.
        traceback: The worker's formatted traceback (its last 8192 characters), when the
            worker sent one; shown in ``str()`` after the message.
        request_fault: What the worker's error declared when it was the request's own
            fault (a client error; :mod:`edge_contracts.request_faults`): its code word
            and the field at fault. None for a server error.
    """

    def __init__(self, request_id: str, error_type: str, error_message: str,
                 *, traceback: str | None = None,
                 request_fault: RequestFault | None = None) -> None:
        self.request_id = request_id
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback
        self.request_fault = request_fault
        text = f"request {request_id!r}: {error_type}: {error_message}"
        if traceback:
            text += f"\n--- worker traceback ---\n{traceback.rstrip()}"
        super().__init__(text)

    @property
    def summary(self) -> str:
        """The request, the worker's error type and message, in one line."""
        text = f"request {self.request_id!r}: {self.error_type}: {self.error_message}"
        return " ".join(text.split("\n"))

    @property
    def detail(self) -> str | None:
        """The worker's traceback, when it sent one."""
        return self.traceback


class DuplicateRequest(EdgeError, ValueError):
    """A request id is already in flight (or retained, not yet acknowledged) on the stage."""
