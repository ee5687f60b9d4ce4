"""Errors raised by the runtime; all subclass :class:`edge_core.errors.EdgeError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_contracts.request_faults import RequestFault
from edge_core.errors import (
    NO_VALUE,
    ConfigError,
    EdgeError,
    ResourceUnavailable,
    WorkerError,
    field_message,
)

if TYPE_CHECKING:  # an annotation only: importing the errors stays as light as it was
    from edge_contracts.error_details import ErrorDetail

__all__ = [
    "DemandExceeded",
    "DuplicateRequest",
    "NumericsRefused",
    "RequestCancelled",
    "RequestFailed",
    "TopologyRefused",
    "TransformFailed",
    "TransformOutputRefused",
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


class TransformOutputRefused(EdgeError):
    """A stage after the first refused the inputs its transform built (the pipeline's fault).

    The request reached the stage before it well formed; the pipeline's own transform made
    this stage's inputs (a ``Fanout`` item's included) from that stage's outputs, and the
    stage refused them as it refuses a client's malformed input: a dtype, shape or input
    name it does not serve (``ShapeRefused``), a value the wire cannot carry
    (``InvalidValue``), tensors over its ``max_io_bytes``, or an error its worker declared
    a request fault (``RequestFailed`` with ``request_fault``). The client cannot mend
    that: not a ``ValueError``, so ``edge serve`` answers 500 (code
    ``transform_output_refused``) and ``edge run`` exits 1, never 400 or 2. Only the first
    stage's refusal of the request's own input, and the last stage's refusal of a
    parameter whose value it got from the caller (not one the transform's ``Call`` wrote
    over), or of the request as a whole (no field named) while such a parameter reached
    it, are the request's fault (:func:`~edge_core.runtime.chain.output_refused`).

    The original error is :attr:`error` (and ``__cause__``).

    Attributes:
        path: The refusing stage's ``input_transform``
            (``pipelines[p].stages[b].input_transform``).
        stage_id: The stage that refused.
        transform: The transform that built the refused inputs (``transform m:f``).
        field: The field the refusal named (``inputs.x``), or None.
        reason: Which stage refused what, and the refusal's type.
        value: The refusal's message (a worker's: its message alone).
        error: The original error.
    """

    def __init__(self, path: str, stage_id: str, transform: str, error: BaseException) -> None:
        self.path = path
        self.stage_id = stage_id
        self.transform = transform
        self.error = error
        if isinstance(error, RequestFailed):  # the worker's type and message, no request id
            kind, message = error.error_type, error.error_message
            fault = error.request_fault
            self.field: str | None = fault.param if fault is not None else None
        else:
            kind, message = type(error).__name__, str(error)
            field = getattr(error, "field", None)
            self.field = field if isinstance(field, str) else None
        self.reason = f"stage {stage_id!r} refused the inputs {transform} returned ({kind})"
        self.value = message
        super().__init__(f"{path}: {self.reason}: {message}")


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
        error_detail: The field, reason and value the worker's error holds, as the
            worker sent them (:class:`~edge_contracts.error_details.ErrorDetail`: the
            field it names, such as ``event.outputs`` or a file's path), or None when it
            had none that fit exactly. Read what the error names here, never out of
            :attr:`error_message`'s wording. (Not :attr:`detail`, which every edge error
            has: the text a one-line report leaves out, here the traceback.)
    """

    def __init__(self, request_id: str, error_type: str, error_message: str,
                 *, traceback: str | None = None,
                 request_fault: RequestFault | None = None,
                 error_detail: ErrorDetail | None = None) -> None:
        self.request_id = request_id
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback
        self.request_fault = request_fault
        self.error_detail = error_detail
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
