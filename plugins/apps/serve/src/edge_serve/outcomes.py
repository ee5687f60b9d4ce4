"""Runtime errors and stage states as HTTP answers: the one place that maps them.

Every refusal the server gives goes through :func:`from_exception` or is built here as an
:class:`HttpRefusal`; each answer is JSON ``{"error": {"status", "type", "field",
"reason", "message"}}`` and never carries a traceback. The mapping:

=====  ===================================================================================
400    bad input: a malformed body, tensor or parameter (``ContractError`` and other
       ``ValueError`` raised before anything ran), a file ``prepare`` cannot read
401    a route other than ``/health`` (and the page) without the right bearer token
404    an unknown pipeline or route
413    the body exceeds the server's limit, or a tensor a stage's ``max_io_bytes``
429    admission full (``ResourceUnavailable``), with ``Retry-After``
503    a stage refuses work (``StageClosed``: failed, restarting, needs a restart), is not
       ready, or lost its worker (``WorkerLost``), with ``Retry-After``
504    the request's deadline passed before its answer was ready (the server's own timer,
       or the runtime's ``TimeoutError``)
500    anything else: the error's type and message, nothing more
=====  ===================================================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from edge_contracts.errors import ContractError, PayloadTooLarge
from edge_core.errors import ResourceUnavailable, StageClosed, WorkerLost
from edge_core.runtime.errors import RequestCancelled, RequestFailed

__all__ = [
    "OUTCOMES",
    "RETRY_AFTER_S",
    "HttpRefusal",
    "deadline_passed",
    "describe",
    "from_exception",
    "outcome_of",
    "retry_headers",
    "stage_unready",
]

#: What ``Retry-After`` says on a 429 or 503, in seconds.
RETRY_AFTER_S = 1

#: The request outcomes counted in ``edge_requests_total{outcome=...}``.
OUTCOMES = ("ok", "bad_request", "unauthorized", "not_found", "too_large", "refused",
            "unavailable", "deadline", "cancelled", "error")

_OUTCOME_BY_STATUS = {400: "bad_request", 401: "unauthorized", 404: "not_found",
                      405: "bad_request", 413: "too_large", 429: "refused",
                      503: "unavailable", 504: "deadline", 499: "cancelled"}

#: Worker error types that mean the request's own inputs were wrong (answered 400).
_INPUT_ERROR_TYPES = frozenset({"InvalidValue", "BucketMismatch", "DescriptorInvalid",
                                "PayloadMismatch", "GenerateParamsInvalid",
                                "InvalidArgument", "ValueError"})


class HttpRefusal(Exception):
    """An HTTP error answer: status, the field at fault, the reason, extra headers.

    Args:
        status: The HTTP status code.
        field: The request field at fault (``inputs['x'].shape``, ``deadline_s``, ...).
        reason: What is wrong, naming the limit.
        value: The offending value (shown shortened), or None.
        kind: The error's type name as the client sees it.
        headers: Extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(self, status: int, field: str, reason: str, value: object = None, *,
                 kind: str = "", headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.field = field
        self.reason = reason
        self.value = value
        self.kind = kind or type(self).__name__
        self.headers = dict(headers or {})
        shown = "" if value is None else f": {_short(value)}"
        super().__init__(f"{field}: {reason}{shown}")

    @property
    def outcome(self) -> str:
        """The outcome label this answer is counted under."""
        return outcome_of(self.status)

    def body(self) -> bytes:
        """The JSON body of the answer."""
        error = {"status": self.status, "type": self.kind, "field": self.field,
                 "reason": self.reason, "message": str(self)}
        return json.dumps({"error": error}).encode()


def _short(value: object, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def outcome_of(status: int) -> str:
    """The outcome label of an HTTP status (``ok`` below 400)."""
    if status < 400:
        return "ok"
    return _OUTCOME_BY_STATUS.get(status, "error")


def retry_headers() -> dict[str, str]:
    """``Retry-After`` for a refusal that may succeed later."""
    return {"Retry-After": str(RETRY_AFTER_S)}


def stage_unready(pipeline: str, stage: str, state: str) -> HttpRefusal:
    """503 for a stage that is not ready (failed, restarting, needs a restart, retired)."""
    return HttpRefusal(503, f"pipelines[{pipeline}].stages[{stage}].state",
                       "the stage is not serving", state, kind="StageUnavailable",
                       headers=retry_headers())


def deadline_passed(pipeline: str, deadline_s: float) -> HttpRefusal:
    """504 for a request whose deadline passed before its answer was ready."""
    return HttpRefusal(504, "deadline_s", f"pipelines[{pipeline}]: no answer within the "
                       "deadline", deadline_s, kind="DeadlineExceeded")


def from_exception(error: BaseException, *, field: str = "request") -> HttpRefusal:
    """The HTTP answer for an error raised while serving a request.

    Args:
        error: What the runtime, a transform or the request's decoding raised.
        field: The field to name when the error carries none of its own.
    """
    if isinstance(error, HttpRefusal):
        return error
    kind = type(error).__name__
    if isinstance(error, ResourceUnavailable):
        return HttpRefusal(429, "admission", "full", str(error), kind=kind,
                           headers=retry_headers())
    if isinstance(error, StageClosed):
        return HttpRefusal(503, "stage", "the stage is not serving", str(error), kind=kind,
                           headers=retry_headers())
    if isinstance(error, TimeoutError):  # the runtime's own deadline (DeadlineExceeded)
        return HttpRefusal(504, "deadline_s", "the request's deadline passed", str(error),
                           kind=kind)
    if isinstance(error, WorkerLost):  # the stage failed; it may be restarting
        return HttpRefusal(503, "stage", "the stage's worker was lost", str(error),
                           kind=kind, headers=retry_headers())
    if isinstance(error, RequestCancelled):
        return HttpRefusal(503, "request", "cancelled by the server (shutdown or a stage "
                           "cancel)", str(error), kind=kind, headers=retry_headers())
    if isinstance(error, PayloadTooLarge):
        return HttpRefusal(413, error.field, error.reason, error.value, kind=kind)
    if isinstance(error, ContractError):
        return HttpRefusal(400, error.field, error.reason, error.value, kind=kind)
    if isinstance(error, RequestFailed):
        if error.error_type in _INPUT_ERROR_TYPES:
            return HttpRefusal(400, field, f"the stage refused the request: "
                               f"{error.error_type}", error.error_message, kind=kind)
        return HttpRefusal(500, field, f"the stage failed the request: {error.error_type}",
                           error.error_message, kind=kind)
    named = getattr(error, "field", None)
    reason = getattr(error, "reason", None)
    if isinstance(error, ValueError):
        if isinstance(named, str) and isinstance(reason, str):
            return HttpRefusal(400, named, reason, getattr(error, "value", None), kind=kind)
        return HttpRefusal(400, field, "refused", str(error), kind=kind)
    return HttpRefusal(500, field, f"internal error: {kind}", str(error), kind=kind)


def describe(error: HttpRefusal) -> dict[str, Any]:
    """The error part of a JSON answer (for streams that already sent their headers)."""
    return {"status": error.status, "type": error.kind, "field": error.field,
            "reason": error.reason, "message": str(error)}
