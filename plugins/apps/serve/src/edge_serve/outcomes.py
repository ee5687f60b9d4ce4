"""Runtime errors and stage states as HTTP answers: the one place that maps them.

Every refusal the server gives goes through :func:`from_exception` or is built here as an
:class:`HttpRefusal`, and is answered in the shape of OpenAI's API, the same on every
route (and, on a stream that already sent its headers, as one server-sent event)::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": "context_length_exceeded",
               "edge": {"status": 400, "kind": "ContextLengthExceeded",
                        "field": "max_tokens", "reason": "..."}}}

``param`` is the request field at fault (null when none is), ``code`` a stable machine
word, ``edge`` the server's own fields: the status, the error's type name, the field in
edge's own spelling and the reason naming the limit. Never a traceback.

Which errors are the request's fault is declared where they are raised, never decided
here by their names: a backend's error type declares a code in ``request_fault``
(:mod:`edge_contracts.request_faults`), and a worker sends that declaration with its error
event. A declared fault is 400 with that ``code`` and ``param`` (a stage after the first
refusing what the pipeline's transform built is no such fault: the runtime raises
``TransformOutputRefused`` for it, 500 below); an error a backend raises
without one is 500, and the server logs its type once (stderr). edge-core's and
edge-contracts' own input errors (``ContractError``; an ``EdgeError`` that is a
``ValueError``) are 400 too. The rest of the mapping:

=====  ================================================================================
400    a malformed body, tensor, parameter or deadline; a file ``prepare`` cannot read; a
       request fault a backend declared (``invalid_value``, ``context_length_exceeded``,
       ``unsupported_parameter`` ...)
401    a route other than ``/health`` (and the page) without the right bearer token
404    an unknown pipeline, model or route
405    a route asked with a method it does not serve (``Allow`` names those it does)
408    no more of the body arrived for ``--body-timeout`` seconds (a body shorter than its
       ``Content-Length``, a client that stopped sending): ``Connection: close``; or the
       request head was not complete within ``--header-timeout`` seconds (sent before any
       route, by :mod:`edge_serve.heads`)
413    the body exceeds the server's limit, or a tensor a stage's ``max_io_bytes``
431    the request head ran past :data:`~edge_serve.heads.MAX_HEAD_BYTES` (sent before any
       route, by :mod:`edge_serve.heads`): ``Connection: close``
429    admission full (``ResourceUnavailable``), with ``Retry-After``
500    an event of a stage's answer too large for its worker channel (``EventTooLarge``:
       code ``event_too_large``, ``edge.field`` the event's part that was too long,
       ``event.data``, ``event.error`` or ``event.outputs``); a pipeline's ``finish``
       that returned what strict JSON cannot carry (``FinishAnswerInvalid``: code
       ``finish_answer_invalid``, ``edge.field`` the path to it in the answer); a
       ``finish`` that raised (``FinishFailed``: code ``finish_failed``, naming the finish
       and the error's type and message; its traceback logged once per pipeline); a
       stage's input transform that raised (``TransformFailed``: code
       ``transform_failed``, ``edge.field`` the stage's ``input_transform``, naming the
       transform and the error's type and message; its traceback logged once per
       transform); a transform that returned no mapping of input names
       (``TransformReturnInvalid``: code ``transform_return_invalid``, ``edge.field`` the
       stage's ``input_transform``, naming the transform and what it returned; logged
       once per transform); a stage after the first that refused the inputs its
       transform built — a dtype, shape or name it does not serve, a value the wire
       cannot carry, its worker's declared request fault (``TransformOutputRefused``:
       code ``transform_output_refused``, ``edge.field`` the refusing stage's
       ``input_transform``, naming that stage, the transform and the refusal's type and
       message; logged once per transform); a stage's worker that broke the protocol
       answering — a malformed event, however its reader refused it
       (``ProtocolViolation``: code ``worker_protocol_violation``, ``edge.field`` where,
       ``stages[s].event.error``; logged once per field); anything else: the error's type
       and message (``x-should-retry: false`` on all: the same request would fail the
       same way)
503    a stage refuses work (``StageClosed``: failed, restarting, needs a restart), is not
       ready, or lost its worker (``WorkerLost``), with ``Retry-After``; a bundle a
       stage verified in place rewritten since it opened, met by ``finish`` or a
       transform reading the stage's bundle folder (``BundleChanged``: code
       ``bundle_changed``, ``edge.field`` the manifest, naming both sha256s; logged once
       per manifest; ``x-should-retry: false``: only the stage loading again mends it,
       and ``/health`` is 503 naming the stage until then); or the server is shutting
       down (``x-should-retry: false``)
504    the request's deadline passed before its answer was ready (the server's own timer,
       or the runtime's ``TimeoutError``; ``x-should-retry: false``)
=====  ================================================================================

``x-should-retry`` is the header both official OpenAI clients obey before their own
retry rules (they retry 5xx twice by default).
"""

from __future__ import annotations

import json
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from edge_contracts.error_copies import whole_reduction
from edge_contracts.errors import ContractError, EventTooLarge, PayloadTooLarge
from edge_contracts.request_faults import fault_of
from edge_core.artifacts.errors import BundleChanged
from edge_core.errors import EdgeError, ResourceUnavailable, StageClosed, WorkerLost
from edge_core.host.errors import ProtocolViolation
from edge_core.runtime.errors import (
    RequestCancelled,
    RequestFailed,
    TransformFailed,
    TransformOutputRefused,
    TransformReturnInvalid,
)

__all__ = [
    "OUTCOMES",
    "RETRY_AFTER_S",
    "HttpRefusal",
    "deadline_passed",
    "describe",
    "finish_answer_invalid",
    "finish_failed",
    "from_exception",
    "outcome_of",
    "retry_headers",
    "server_stopping",
    "stage_unready",
]

#: What ``Retry-After`` says on a 429 or 503, in seconds.
RETRY_AFTER_S = 1

#: The request outcomes counted in ``edge_requests_total{outcome=...}``.
OUTCOMES = ("ok", "bad_request", "unauthorized", "not_found", "method_not_allowed",
            "body_timeout", "too_large", "refused", "unavailable", "deadline", "cancelled",
            "error")

_OUTCOME_BY_STATUS = {400: "bad_request", 401: "unauthorized", 404: "not_found",
                      405: "method_not_allowed", 408: "body_timeout", 413: "too_large",
                      429: "refused",
                      503: "unavailable", 504: "deadline", 499: "cancelled"}

#: OpenAI's error ``type`` for each status.
_TYPES = {400: "invalid_request_error", 401: "authentication_error",
          404: "invalid_request_error", 405: "invalid_request_error",
          408: "invalid_request_error", 413: "invalid_request_error",
          431: "invalid_request_error", 429: "rate_limit_error",
          499: "invalid_request_error", 500: "server_error", 503: "server_error",
          504: "timeout_error"}

#: The ``code`` of a refusal that names none of its own.
_CODES = {400: "invalid_value", 401: "invalid_api_key", 404: "not_found",
          405: "method_not_allowed", 408: "body_timeout", 413: "request_too_large",
          431: "header_too_large", 429: "rate_limit_exceeded",
          499: "client_disconnected", 500: "internal_error", 503: "unavailable",
          504: "deadline_exceeded"}

#: Statuses whose ``param`` is the field at fault unless told otherwise (the others
#: concern the server's state, not a field of the request).
_PARAM_STATUSES = frozenset({400, 404, 413})

#: Statuses a retry of the same request cannot cure.
_NO_RETRY = frozenset({500, 504})

_UNSET: Any = object()

#: The fields an ``EventTooLarge`` may name (``event``, ``event.data``, ...).
_EVENT_FIELD = re.compile(r"event(\.[a-z_]+)?")

#: What was already logged (each is logged once): a backend's undeclared error by its
#: type, a pipeline's ``finish`` that answered what JSON cannot carry, or that raised, by
#: the pipeline, a transform that raised, returned no mapping or built inputs its stage
#: refused by its stage's ``input_transform``, a rewritten bundle by its manifest, a
#: worker's protocol violation by its field.
_logged: set[str] = set()


class HttpRefusal(Exception):
    """An HTTP error answer: status, the field at fault, the reason, extra headers.

    Args:
        status: The HTTP status code.
        field: The request field at fault in edge's spelling (``inputs['x'].shape``,
            ``deadline_s``, ...), or the subject (``admission``, ``stage``).
        reason: What is wrong, naming the limit.
        value: The offending value (shown shortened), or None.
        kind: The error's type name as the client sees it (``edge.kind``).
        code: OpenAI's ``code``, a stable machine word (default: the status's).
        param: OpenAI's ``param`` (default: ``field`` for 400, 404 and 413, else None).
        message: The whole message (default: ``field: reason: value``).
        headers: Extra response headers (``Retry-After``, ``WWW-Authenticate``).
        retry: Whether a client may retry the same request (``x-should-retry``; default:
            not after a 500 or 504, the client's own rules otherwise).
    """

    def __init__(self, status: int, field: str, reason: str, value: object = None, *,
                 kind: str = "", code: str = "", param: str | None = _UNSET,
                 message: str = "", headers: Mapping[str, str] | None = None,
                 retry: bool | None = None) -> None:
        self.status = status
        self.field = field
        self.reason = reason
        self.value = value
        self.kind = kind or type(self).__name__
        self.code = code or _CODES.get(status, "error")
        self.param: str | None = (field if status in _PARAM_STATUSES else None) \
            if param is _UNSET else param
        self.headers = dict(headers or {})
        if retry is None and status in _NO_RETRY:
            retry = False
        if retry is not None:
            self.headers["x-should-retry"] = "true" if retry else "false"
        shown = "" if value is None else f": {_short(value)}"
        super().__init__(message or f"{field}: {reason}{shown}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)

    @property
    def outcome(self) -> str:
        """The outcome label this answer is counted under."""
        return outcome_of(self.status)

    def body(self) -> bytes:
        """The JSON body of the answer."""
        return json.dumps(describe(self)).encode()


def _short(value: object, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(error: HttpRefusal) -> dict[str, Any]:
    """The answer's JSON: ``{"error": {...}}`` (a body, or a stream's error event)."""
    return {"error": {"message": str(error), "type": _TYPES.get(error.status, "server_error"),
                      "param": error.param, "code": error.code,
                      "edge": {"status": error.status, "kind": error.kind,
                               "field": error.field, "reason": error.reason}}}


def outcome_of(status: int) -> str:
    """The outcome label of an HTTP status (``ok`` below 400)."""
    if status < 400:
        return "ok"
    return _OUTCOME_BY_STATUS.get(status, "error")


def retry_headers() -> dict[str, str]:
    """``Retry-After`` for a refusal that may succeed later."""
    return {"Retry-After": str(RETRY_AFTER_S)}


def stage_unready(pipeline: str, stage: str, state: str, why: str = "") -> HttpRefusal:
    """503 for a stage that is not ready (failed, restarting, needs a restart, retired).

    ``why`` names each replica not serving and its reason (a failed restart's typed
    error, ``BundleChanged`` say); the message then says it in parentheses.
    """
    reason = "the stage is not serving" + (f" ({why})" if why else "")
    return HttpRefusal(503, f"pipelines[{pipeline}].stages[{stage}].state",
                       reason, state, kind="StageUnavailable",
                       code="stage_unavailable", headers=retry_headers())


def deadline_passed(pipeline: str, deadline_s: float) -> HttpRefusal:
    """504 for a request whose deadline passed before its answer was ready."""
    return HttpRefusal(504, "deadline_s", f"pipelines[{pipeline}]: no answer within the "
                       "deadline", deadline_s, kind="DeadlineExceeded", param="deadline_s")


def server_stopping(grace_s: float) -> HttpRefusal:
    """503 for a request still open when the server's grace period ended."""
    return HttpRefusal(503, "request", "the server is shutting down: the request was still "
                       "open (running or waiting for admission) when the grace period ended",
                       grace_s,
                       kind="ServerShuttingDown", code="server_shutting_down", retry=False)


def _log_once(key: str, line: str) -> None:
    """Print ``line`` on stderr the first time ``key`` is met (no traceback: the answer says it)."""
    if key in _logged:
        return
    _logged.add(key)
    print(line, file=sys.stderr, flush=True)


def _report_unknown(kind: str, text: str) -> None:
    """Log, once per type, an error a backend raised without declaring whose fault it is."""
    _log_once(kind, f"edge serve: error: {kind} was raised serving a request and is not "
              f"declared a request's fault: answered 500 (logged once per type): "
              f"{_short(text, 500)}")


def finish_answer_invalid(pipeline: str, finish: str, field: str, reason: str,
                          value: object) -> HttpRefusal:
    """500 for a ``finish`` whose answer strict JSON cannot carry, naming where in it.

    The pipeline's ``finish`` (the model's own code) returned NaN or an infinity (JSON has
    no such numbers), a value of a type JSON has no form for, or a container holding
    itself: the server side is at fault, not the request (500, ``param`` null,
    ``x-should-retry: false``: the same request would fail the same way), and nothing of
    that answer is sent. ``field`` is the path to the value in the answer
    (``answer.scores[2]``), ``finish`` the function's reference as the pipeline file
    names it, ``reason`` what the value is (``a number JSON cannot carry``). Logged once
    per pipeline on stderr, as a backend's undeclared error is.
    """
    refusal = HttpRefusal(500, field, f"pipelines[{pipeline}].finish ({finish}) returned "
                          f"{reason}", value, kind="FinishAnswerInvalid",
                          code="finish_answer_invalid", param=None)
    _log_once(f"finish:{pipeline}", f"edge serve: error: {refusal} (answered 500; logged "
              "once per pipeline)")
    return refusal


def finish_failed(pipeline: str, finish: str, error: BaseException) -> HttpRefusal:
    """500 for a ``finish`` that raised, naming it and the error's type and message.

    The pipeline's ``finish`` (the model's own code) raised while it built the answer from
    the request's outputs: the server side is at fault, not the request (500, ``param``
    null, ``x-should-retry: false``: the same request would fail the same way), whatever
    the error's type (a ``ValueError`` from it is no request's fault either). ``finish``
    is the function's reference as the pipeline file names it. The first failure of each
    pipeline's ``finish`` is logged on stderr with its traceback, which the operator needs
    to mend it; later ones are answered without a log line.
    """
    kind = type(error).__name__
    refusal = HttpRefusal(500, f"pipelines[{pipeline}].finish", f"{finish} raised {kind}",
                          _short(str(error), 500), kind="FinishFailed", code="finish_failed",
                          param=None)
    key = f"finish-failed:{pipeline}"
    if key not in _logged:
        trace = "".join(traceback.format_exception(error)).rstrip("\n")
        _log_once(key, f"edge serve: error: {refusal} (answered 500; logged once per "
                  f"pipeline, with its traceback):\n{trace}")
    return refusal


def _transform_failed(error: TransformFailed) -> HttpRefusal:
    """500 for a stage's input transform that raised, naming it and the error.

    The pipeline's own code failed between two stages (the request reached it well
    formed): the server side is at fault, not the request, whatever the error's type (a
    ``ConfigError`` from a ``Fanout`` built wrong is no request's fault either): 500,
    ``param`` null, ``x-should-retry: false``. ``edge.field`` is the stage's
    ``input_transform`` (``pipelines[p].stages[b].input_transform``). The first failure of
    each transform is logged on stderr with the original error's traceback.
    """
    refusal = HttpRefusal(500, error.path, error.reason, _short(error.value, 500),
                          kind=type(error).__name__, code="transform_failed", param=None)
    key = f"transform-failed:{error.path}"
    if key not in _logged:
        trace = "".join(traceback.format_exception(error.error)).rstrip("\n")
        _log_once(key, f"edge serve: error: {refusal} (answered 500; logged once per "
                  f"transform, with its traceback):\n{trace}")
    return refusal


def _transform_return_invalid(error: TransformReturnInvalid) -> HttpRefusal:
    """500 for a stage's input transform that returned no mapping of input names.

    The pipeline's own code returned something the chain cannot read as the next stage's
    inputs (``None``, a list, a mapping with a key that is no ``str``): the server side is
    at fault, not the request (500, ``param`` null, ``x-should-retry: false``).
    ``edge.field`` is the stage's ``input_transform``; the message names the transform,
    what it returned and its type. Logged once per transform (no traceback: the
    transform returned, nothing raised).
    """
    refusal = HttpRefusal(500, error.path, error.reason, kind=type(error).__name__,
                          code="transform_return_invalid", param=None, message=str(error))
    _log_once(f"transform-return:{error.path}", f"edge serve: error: {refusal} (answered "
              "500; logged once per transform)")
    return refusal


def _transform_output_refused(error: TransformOutputRefused) -> HttpRefusal:
    """500 for a stage after the first that refused the inputs its transform built.

    The request's own input passed the first stage; the pipeline's transform made the
    refusing stage's inputs, and that stage refused them as it would refuse a client's
    malformed tensor (``ShapeRefused``, ``InvalidValue``, a worker's declared request
    fault). The client cannot mend that: 500, ``param`` null, ``x-should-retry: false``,
    ``edge.field`` the refusing stage's ``input_transform``, the message naming that
    stage, the transform and the refusal's type and message. Logged once per transform.
    """
    refusal = HttpRefusal(500, error.path, error.reason, kind=type(error).__name__,
                          code="transform_output_refused", param=None, message=str(error))
    _log_once(f"transform-output:{error.path}", f"edge serve: error: {refusal} (answered "
              "500; logged once per transform)")
    return refusal


def _protocol_violation(error: ProtocolViolation) -> HttpRefusal:
    """500 for a stage whose worker broke the protocol while answering, naming where.

    A malformed reply — an event the controller could read but not accept (an ``error``
    event without its error, outputs on a failed event: ``edge.field``
    ``stages[s].event.error``), or a frame it could not read at all (``worker.channel``,
    ``frame.meta``; the worker is then lost) — is the stage's fault, never the request's,
    whatever ``ContractError`` found it: 500, ``param`` null, ``x-should-retry: false``,
    code ``worker_protocol_violation``. Logged once per field.
    """
    refusal = HttpRefusal(500, error.field, error.reason, error.value,
                          kind=type(error).__name__, code="worker_protocol_violation",
                          param=None, message=str(error))
    _log_once(f"protocol:{error.field}", f"edge serve: error: {refusal} (answered 500; "
              "logged once per field)")
    return refusal


def _bundle_changed(error: BundleChanged) -> HttpRefusal:
    """503 for a bundle rewritten since its stage opened, naming the manifest and why.

    Met where a ``finish`` or a transform reads a stage's bundle folder verified in place
    (:mod:`edge_core.runtime.bundle_folders`): the request and the pipeline's code are
    fine, but the pipeline cannot serve as it was opened — the same state as a stage
    whose restart was refused for it (503 ``stage_unavailable``). ``x-should-retry:
    false`` and no ``Retry-After``: the same request fails the same way until the
    stage loads again (the server started again, or the stage restarted with its bundle
    restored). Logged once per manifest; ``/health`` names the stage from then on
    (:meth:`~edge_serve.served.ServedPipeline.bundles_changed`).
    """
    refusal = HttpRefusal(503, error.field, error.reason, error.value,
                          kind=type(error).__name__, code="bundle_changed", param=None,
                          message=str(error), retry=False)
    _log_once(f"bundle-changed:{error.field}", f"edge serve: error: {refusal} (answered "
              "503; logged once per bundle)")
    return refusal


def _event_too_large(error: BaseException) -> HttpRefusal | None:
    """500 naming the event's field for ``EventTooLarge``, raised or sent by a worker.

    A worker refuses to send an event whose header would be over its channel's
    ``max_header_bytes``, or whose output tensors together are over its ``max_io_bytes``,
    and fails the request with this error instead (:mod:`edge_contracts.worker_events`).
    The request is not at fault (its fields are within their limits): the stage's backend
    put more in an event than the channel carries, a server error, and the same request
    would fail the same way again. Its field (``event.data``, ``event.error``, ``event``,
    or ``event.outputs`` for the tensors) is the error's own, sent by the worker as data
    (``RequestFailed.error_detail``), never read out of its message; ``event`` when the
    worker sent none, or one that names no part of an event.
    """
    kind = EventTooLarge.__name__
    if isinstance(error, EventTooLarge):
        field, text = error.field, str(error)
    elif isinstance(error, RequestFailed) and error.error_type == kind:
        text = error.error_message
        detail = error.error_detail
        field = (detail.field if detail is not None and _EVENT_FIELD.fullmatch(detail.field)
                 else "event")
    else:
        return None
    _report_unknown(kind, text)
    reason = ("(its output tensors over the stage's max_io_bytes): the stage's max_io_bytes "
              "must be raised for such answers" if field == "event.outputs" else
              "(its header over max_header_bytes): the backend must send such values as "
              "output tensors")
    return HttpRefusal(500, field, "an event of the stage's answer was too large for its "
                       f"worker channel {reason}", kind=kind,
                       code="event_too_large", param=None, message=text)


def from_exception(error: BaseException, *, field: str = "request",
                   rename: Callable[[str], str] | None = None) -> HttpRefusal:
    """The HTTP answer for an error raised while serving a request.

    Args:
        error: What the runtime, a transform or the request's decoding raised.
        field: The field to name when the error carries none of its own.
        rename: Maps a stage parameter's name to the request field a client sent it as
            (``prompt_token_ids`` is a completion's ``prompt``).
    """
    if isinstance(error, HttpRefusal):
        return error
    kind = type(error).__name__
    fault = fault_of(error)
    if fault is not None:
        if isinstance(error, RequestFailed):
            kind, text = error.error_type, error.error_message
        else:
            text = str(error)
        param = fault.param if fault.param is None or rename is None else rename(fault.param)
        return HttpRefusal(400, param or field, "the stage refused the request", kind=kind,
                           code=fault.code, param=param, message=text)
    if isinstance(error, ResourceUnavailable):
        return HttpRefusal(429, "admission", "full", str(error), kind=kind,
                           headers=retry_headers())
    if isinstance(error, StageClosed):
        return HttpRefusal(503, "stage", "the stage is not serving", str(error), kind=kind,
                           code="stage_unavailable", headers=retry_headers())
    if isinstance(error, BundleChanged):
        return _bundle_changed(error)
    if isinstance(error, TransformFailed):
        return _transform_failed(error)
    if isinstance(error, TransformOutputRefused):
        return _transform_output_refused(error)
    if isinstance(error, TransformReturnInvalid):
        return _transform_return_invalid(error)
    if isinstance(error, ProtocolViolation):
        return _protocol_violation(error)
    if isinstance(error, TimeoutError):  # the runtime's own deadline (DeadlineExceeded)
        return HttpRefusal(504, "deadline_s", "the request's deadline passed", str(error),
                           kind=kind, param="deadline_s")
    if isinstance(error, WorkerLost) or (isinstance(error, RequestFailed)
                                         and error.error_type == "WorkerLost"):
        return HttpRefusal(503, "stage", "the stage's worker was lost", str(error),
                           kind=kind, code="worker_lost", headers=retry_headers())
    if isinstance(error, RequestCancelled):
        return HttpRefusal(503, "request", "cancelled by the server (shutdown or a stage "
                           "cancel)", str(error), kind=kind, code="request_cancelled",
                           headers=retry_headers())
    too_large = _event_too_large(error)
    if too_large is not None:
        return too_large
    if isinstance(error, PayloadTooLarge):
        return HttpRefusal(413, error.field, error.reason, error.value, kind=kind)
    if isinstance(error, ContractError):
        return HttpRefusal(400, error.field, error.reason, error.value, kind=kind)
    if isinstance(error, RequestFailed):
        _report_unknown(error.error_type, error.error_message)
        return HttpRefusal(500, field, f"the stage failed the request: {error.error_type}",
                           error.error_message, kind=error.error_type, param=None)
    if isinstance(error, EdgeError) and isinstance(error, ValueError):
        return HttpRefusal(400, field, "refused", str(error), kind=kind)
    _report_unknown(kind, str(error))
    return HttpRefusal(500, field, f"internal error: {kind}", str(error), kind=kind,
                       param=None)
