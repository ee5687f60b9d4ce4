"""One request through the chain: transforms, submissions, fan-out and gather.

:func:`run_chain` is what :meth:`Pipeline.run` and :meth:`Pipeline.stream` drive for each
request, in the caller's thread. Several callers (``admission > 1``) flow through the
chain at once: stage *k* works on request *i+1* while stage *k+1* works on request *i*,
each stage call taking a slot of one of the stage's replicas (:mod:`.replicas`), waiting
for one when all are taken.

Between stages the model's transform builds the next inputs; arrays that could share
memory with the previous outputs are copied before the previous result is acknowledged.
A transform that returns a :class:`~edge_core.fanout.Fanout` gets the next stage
called once per item (:func:`gather`), and the outputs gathered into lists in item order.
What a transform returns is not checked on the way: where reading it fails (no mapping,
a key that is no ``str``), :func:`malformed_return` is asked, and the request fails with
its :class:`~edge_core.runtime.errors.TransformReturnInvalid` naming the stage's transform
and the bad key (the pipeline's fault, not the request's). A transform that raises fails
the request with :class:`~edge_core.runtime.errors.TransformFailed` naming it and the
error (:func:`transform_failed`), unless the error is a typed refusal of the request's
input or one of edge-core's own server-side errors, which pass unchanged. A stage after
the first that refuses the inputs its transform built — as it would refuse a client's
malformed input — fails the request with
:class:`~edge_core.runtime.errors.TransformOutputRefused` naming that stage, the transform
and the refusal (:func:`output_refused`): the pipeline's fault, not the request's.
"""

from __future__ import annotations

import collections
import functools
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_contracts.errors import ContractError
from edge_contracts.request_faults import fault_of
from edge_contracts.requests import StageEvent
from edge_core.errors import DeadlineExceeded, EdgeError
from edge_core.fanout import CARRY_PREFIX, Call, Fanout
from edge_core.runtime.errors import (
    RequestCancelled,
    TransformFailed,
    TransformOutputRefused,
    TransformReturnInvalid,
)
from edge_core.runtime.pending import PendingCall
from edge_core.runtime.replicas import ReplicaSet
from edge_core.runtime.results import AckOutcome

if TYPE_CHECKING:
    from edge_core.runtime.request_tracker import RequestTracker

__all__ = [
    "CARRY_PREFIX",
    "GatheredCall",
    "GatheredResult",
    "Transform",
    "caller_params",
    "copy_apart",
    "gather",
    "malformed_return",
    "output_refused",
    "run_chain",
    "split_carry",
    "transform_failed",
    "with_bundles",
]

Transform = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
"""``transform(previous_outputs, pipeline_inputs) -> next inputs`` (a mapping or a Fanout)."""


def split_carry(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate a transform's output into the stage's inputs and the carried values."""
    for key in data:
        if key.startswith(CARRY_PREFIX):
            break
    else:  # the usual case: nothing carried (a copy, without a comprehension per call)
        return dict(data), {}
    inputs = {k: v for k, v in data.items() if not k.startswith(CARRY_PREFIX)}
    carry = {k: v for k, v in data.items() if k.startswith(CARRY_PREFIX)}
    return inputs, carry


def _transform_path(where: str, stage_id: str) -> str:
    """The path refusals of what a stage's transform returned name: ``...input_transform``."""
    return f"{where}.stages[{stage_id}].input_transform"


def _named(transform: Callable[..., Any] | None) -> str:
    """``transform module:qualname`` (what ``input_transform`` names), else its repr."""
    module = getattr(transform, "__module__", None)
    name = getattr(transform, "__qualname__", None)
    return f"transform {module}:{name}" if module and name else f"transform {transform!r}"


def malformed_return(produced: object, transform: Callable[..., Any] | None,
                     path: str) -> TransformReturnInvalid | None:
    """The refusal of what ``transform`` returned, when it is no mapping of input names.

    Asked only once reading a transform's return failed (nothing is checked on a good
    request's way). A transform returns a mapping of input names (``str``) to arrays, a
    :class:`~edge_core.fanout.Fanout` of such mappings or a
    :class:`~edge_core.fanout.Call`: the refusal (``path`` names the stage's
    ``input_transform``) names the transform, the first key that is not a ``str`` and its
    type, or the type of a return that is no mapping at all. None when the return is
    well formed (the failure was something else's).
    """
    name = _named(transform)
    if isinstance(produced, Call):  # (carried names are checked when it is made)
        mappings: list[tuple[str, Mapping[Any, Any]]] = [("Call.inputs", produced.inputs)]
    elif isinstance(produced, Fanout):
        mappings = [(f"Fanout.items[{index}]", item) for index, item in enumerate(produced.items)]
    elif isinstance(produced, Mapping):
        mappings = [("a mapping", produced)]
    else:
        return TransformReturnInvalid(
            path, f"{name} returned a {type(produced).__name__}, not a mapping "
            "of input names (str) to arrays, a Fanout or a Call", produced)
    for what, mapping in mappings:
        for key in mapping:
            if not isinstance(key, str):
                return TransformReturnInvalid(
                    path, f"{name} returned {what} with a key that is no "
                    f"input name (a str), not {type(key).__name__}", key)
    return None


def transform_failed(error: Exception, transform: Callable[..., Any] | None,
                     path: str) -> TransformFailed | None:
    """The failure of a request whose stage ``transform`` raised ``error``; None to pass it.

    Asked only once the transform raised. The request's own fault passes unchanged: an
    ``edge_contracts`` error (``InvalidValue`` naming a field of the request) or one that
    declares a request fault (:func:`~edge_contracts.request_faults.fault_of`); so does an
    edge-core error that is no ``ValueError`` (``BundleChanged`` from a bundle folder the
    transform read, ``DeadlineExceeded``, ``RequestCancelled``: typed already, none of them
    a client's fault). Anything else — a ``ConfigError`` (a ``Fanout`` built wrong), a
    ``KeyError``, a ``ValueError`` — is the transform's own failure: a
    :class:`~edge_core.runtime.errors.TransformFailed` naming ``path`` (the stage's
    ``input_transform``), the transform and the error's type and message.
    """
    if isinstance(error, ContractError) or fault_of(error) is not None:
        return None
    if isinstance(error, EdgeError) and not isinstance(error, ValueError):
        return None
    return TransformFailed(path, _named(transform), error)


#: The first name of a refusal's field: the input or parameter it concerns
#: (``max_tokens``, ``messages`` of ``messages[2].content``, ``inputs`` of ``inputs.x``).
_FIELD_HEAD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def output_refused(error: BaseException, transform: Callable[..., Any] | None, where: str,
                   stage_id: str, params: Mapping[str, Any] | None = None,
                   asked: Mapping[str, Any] | None = None,
                   ) -> TransformOutputRefused | None:
    """The failure of a request whose stage ``stage_id`` refused what ``transform`` built.

    Asked only once a call of a stage after the first failed (nothing is checked on a good
    request's way). Its inputs are the pipeline's own: ``transform`` made them (each item
    of a ``Fanout`` included) from the previous stage's outputs. A refusal of them — what
    a front end answers as the request's fault: an ``edge_contracts`` error
    (``ShapeRefused``, ``InvalidValue``, a tensor over ``max_io_bytes``), an error that
    declares a request fault (a worker's ``RequestFailed`` carrying one included,
    :func:`~edge_contracts.request_faults.fault_of`) or an edge-core error that is a
    ``ValueError`` (``RequestTooLarge``) — is the transform's fault: a
    :class:`~edge_core.runtime.errors.TransformOutputRefused` naming the stage's
    ``input_transform`` (``where``: ``pipelines[p]``), the stage, the transform and the
    refusal. Any other error passes unchanged (None): typed already, and none of them the
    client's (``WorkerLost``, ``DeadlineExceeded``, a worker's undeclared error).

    ``params``: the caller's parameters, for the last stage (they reach it);
    ``asked``: the parameters the transform's ``Call`` set there, which win over the
    caller's of the same name (:func:`caller_params`). A refusal naming a parameter the
    stage got from the caller — its field's first name (``max_tokens``, ``messages`` of
    ``messages[2].content``) — is the request's own and passes unchanged: a generate
    stage's sampling settings and a prompt over its context are the client's to mend. One
    naming a parameter the transform set is the transform's, whether or not the caller
    sent that name too (the stage never saw the caller's value). A declared request fault
    that names no field at all (the stage refused the request as a whole and cannot say
    which value) is the request's own when any of the caller's parameters reached the
    stage — they are part of what it refused, and only the caller can change them — and
    the transform's when none did (the stage was sent only what the pipeline built).
    """
    fault = fault_of(error)
    if fault is None and not isinstance(error, ContractError) and not (
            isinstance(error, EdgeError) and isinstance(error, ValueError)):
        return None
    field = fault.param if fault is not None else getattr(error, "field", None)
    if params:
        own = caller_params(params, asked)
        if isinstance(field, str):
            head = _FIELD_HEAD.match(field.removeprefix("params."))
            if head is not None and head.group() in own:
                return None
        elif fault is not None and own:  # no field named: the caller's values among it
            return None
    return TransformOutputRefused(_transform_path(where, stage_id), stage_id,
                                  _named(transform), error)


def caller_params(params: Mapping[str, Any] | None,
                  asked: Mapping[str, Any] | None) -> dict[str, Any]:
    """The caller's ``params`` the last stage got as sent: those ``asked`` did not replace.

    The last stage is sent the caller's parameters with what its transform's ``Call``
    asked merged over them (``{**params, **asked}``); a name in both carries the
    transform's value. Asked on the failure path only (:func:`output_refused`).
    """
    if not params:
        return {}
    if not asked:
        return dict(params)
    return {name: value for name, value in params.items() if name not in asked}


def copy_apart(arrays: Mapping[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """The next stage's inputs, copied wherever they could share memory with ``previous``."""
    result: dict[str, Any] = {}
    olds: list[np.ndarray] = []
    for value in previous.values():
        if isinstance(value, np.ndarray):
            olds.append(value)
        elif isinstance(value, list):  # gathered outputs of a fan-out
            olds.extend(v for v in value if isinstance(v, np.ndarray))
    for name, value in arrays.items():
        if isinstance(value, np.ndarray) and any(np.may_share_memory(value, o) for o in olds):
            value = value.copy()
        result[name] = value
    return result


class GatheredResult:
    """The outputs of every item of a fan-out, each name mapped to a list in item order.

    Every item's own result was acknowledged when it was gathered; acknowledging this
    one frees nothing more (it exists so that it can stand where a stage result does).

    Attributes:
        outputs: Output name to the list of arrays, one per item; carried values as given.
        latency_s: From the first submission to the last item's result.
        items: How many calls were made.
    """

    __slots__ = ("_acked", "items", "latency_s", "outputs")

    def __init__(self, outputs: dict[str, Any], latency_s: float, items: int) -> None:
        self.outputs = outputs
        self.latency_s = latency_s
        self.items = items
        self._acked = False

    @property
    def data(self) -> Mapping[str, Any]:
        """No terminal event of its own: empty."""
        return {}

    def ack(self) -> AckOutcome:
        """Acknowledged the first time, stale afterwards (the items were acked already)."""
        if self._acked:
            return AckOutcome.STALE
        self._acked = True
        return AckOutcome.ACKNOWLEDGED

    def __enter__(self) -> GatheredResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ack()


class GatheredCall:
    """A finished fan-out standing where a :class:`PendingCall` would (for the last stage)."""

    def __init__(self, result: GatheredResult) -> None:
        self._result = result

    def events(self) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
        """A fan-out streams nothing: its outputs are gathered."""
        return iter(())

    def result(self) -> GatheredResult:
        """The gathered result."""
        return self._result

    def close(self) -> None:
        """The caller is done with it: acknowledge the gathered result."""
        self._result.ack()

    def cancel(self) -> None:
        """Nothing runs any more."""

    def abandon(self) -> None:
        """The caller leaves without it (failed, or interrupted): as :meth:`close`."""
        self.close()


def _private(value: Any) -> Any:
    """A copy of an array that is a read-only view (a worker's shared memory)."""
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        return np.array(value, copy=True)
    return value


def _drain(pending: collections.deque[tuple[int, PendingCall]]) -> None:
    """Let the items still in flight end, acknowledging (and dropping) their results."""
    while pending:
        _, call = pending.popleft()
        try:
            call.result().ack()
        except Exception:  # noqa: S112 - the request already failed; nothing to deliver
            continue


def gather(group: ReplicaSet, fan: Fanout, *, params: Mapping[str, Any] | None,
           until: float | None, cancelled: Callable[[], bool],
           where: str, request_id: str | None = None,
           transform: Callable[..., Any] | None = None) -> GatheredResult:
    """Call ``group`` once per item, in parallel up to its free slots; gather in order.

    ``until`` (monotonic) bounds each item's call; with ``request_id`` item ``i`` is sent
    as ``request_id#i``, so that cancelling the request finds its items. ``transform``
    (the one that returned ``fan``) is named when an item has a key that is no ``str``.

    Raises:
        RequestCancelled: the request was cancelled; no item's output is delivered.
        TransformReturnInvalid: an item has a key that is no ``str`` (nothing was sent).
        Whatever an item's call raised (after the others in flight have ended).
    """
    try:
        items = [split_carry(item) for item in fan.items]
    except (AttributeError, TypeError):
        refusal = malformed_return(fan, transform, _transform_path(where, group.stage_id))
        if refusal is not None:
            raise refusal from None  # the transform's fault, not the code that read it
        raise
    gathered: list[dict[str, Any] | None] = [None] * len(items)
    pending: collections.deque[tuple[int, PendingCall]] = collections.deque()
    # Every item's call as its stage registers it (``into``), until its result is
    # acknowledged: a Ctrl-C anywhere leaves each call it holds here, abandoned below
    held: list[PendingCall] = []
    started = time.perf_counter()
    submitted = 0
    try:
        while submitted < len(items) or pending:
            if cancelled():
                raise RequestCancelled(f"{where}: cancelled during a fan-out of {len(items)}")
            if submitted < len(items):
                inputs = items[submitted][0]
                rid = None if request_id is None else f"{request_id}#{submitted}"
                call = group.try_submit(inputs, params=params, until=until, request_id=rid,
                                        into=held)
                if call is None and not pending:
                    call = group.submit(inputs, params=params, until=until, request_id=rid,
                                        abandoned=cancelled, into=held)
                if call is not None:
                    pending.append((submitted, call))
                    submitted += 1
                    continue
            index, call = pending.popleft()
            try:
                result = call.result()
            except BaseException:
                group.note_failure(call.stage)
                raise
            try:
                gathered[index] = {name: _private(value)
                                   for name, value in result.outputs.items()}
            finally:
                result.ack()  # this item's worker memory goes back now
            held.remove(call)
        if cancelled():
            raise RequestCancelled(f"{where}: cancelled during a fan-out of {len(items)}")
    except BaseException as exc:
        if isinstance(exc, Exception):  # failed: the items in flight end first, as before
            _drain(pending)
        for call in held:  # interrupted (or left): each call not acknowledged, abandoned
            call.abandon()
        raise
    outputs: dict[str, Any] = {}
    for (_, carried), produced in zip(items, gathered, strict=True):
        assert produced is not None
        for name, value in {**produced, **carried}.items():
            outputs.setdefault(name, []).append(value)
    outputs.update(fan.carry)
    return GatheredResult(outputs, time.perf_counter() - started, len(items))


def with_bundles(transform: Callable[..., Any] | None,
                 bundles: Callable[[], Mapping[str, Any]]) -> Transform | None:
    """``transform`` as a two-argument transform: one taking ``bundles`` gets them bound.

    A transform may take a third argument, ``bundles`` (stage id → its verified bundle
    directory, as ``finish`` gets): model assets such as a character table live there.
    ``bundles()`` is asked at every call (a restarted stage loads from a new directory);
    each folder holds the bytes its stage loaded, a bundle verified in place checked when
    looked up, and ``bundles.read(stage_id, member)`` returns a member's bytes as verified
    (:mod:`edge_core.runtime.bundle_folders`).
    """
    if transform is None:
        return None
    import inspect

    try:
        parameters = list(inspect.signature(transform).parameters.values())
    except (TypeError, ValueError):
        return transform
    positional = [p for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 3:
        return transform
    bound = transform

    @functools.wraps(transform)  # named as the transform is (in a refusal of its return)
    def call(previous: Mapping[str, Any], source: Mapping[str, Any]) -> Any:
        return bound(previous, source, bundles())

    return call


def run_chain(
    groups: Sequence[ReplicaSet],
    transforms: Sequence[Transform | None],
    inputs: Mapping[str, Any],
    *,
    params: Mapping[str, Any] | None,
    until: float | None,
    cancelled: Callable[[], bool],
    where: str,
    request_id: str | None = None,
    tracker: RequestTracker | None = None,
    into: list[PendingCall] | None = None,
) -> tuple[PendingCall | GatheredCall, dict[str, float], dict[str, Any],
           Mapping[str, Any]]:
    """Run every stage but the last to completion; submit the last and return it.

    ``until`` (a ``time.monotonic()`` deadline) bounds the whole request: it is checked
    before each stage and bounds each stage call. With ``request_id`` and ``tracker`` the
    request carries that id on every stage and can be cancelled alone
    (:class:`~edge_core.runtime.request_tracker.RequestTracker`). ``into``: the caller's
    list of its calls, each stage's call appended as it is registered
    (:meth:`StageRuntime.submit <edge_core.runtime.stage_runtime.StageRuntime.submit>`):
    a ``KeyboardInterrupt`` before a call is held here leaves it for the caller to
    abandon.

    Returns:
        The last stage's call (or its gathered fan-out), each earlier stage's latency,
        the values carried past the last stage, and the parameters the last stage's
        transform asked for (its ``Call``'s, merged over the caller's ``params``; empty
        otherwise), which the caller's answer to a failed last call needs
        (:func:`output_refused`).
    """
    latencies: dict[str, float] = {}
    # Pipeline inputs named carry:* (an image the transforms crop from, say) are not sent to
    # the first stage; every transform sees them in ``inputs``, and so does ``finish``.
    data: Mapping[str, Any] = split_carry(inputs)[0]
    carry: dict[str, Any] = {}
    previous: Any = None
    try:
        for position, group in enumerate(groups):
            last = position == len(groups) - 1
            transform = transforms[position]
            fan: Fanout | None = None
            asked: Mapping[str, Any] = {}
            if transform is not None and previous is not None:
                try:  # a good request pays 2 bytecodes per transform (a NOP, a jump past)
                    produced = transform(previous.outputs, inputs)
                except Exception as error:
                    failed = transform_failed(error, transform,
                                              _transform_path(where, group.stage_id))
                    if failed is None:
                        raise
                    raise failed from error
                try:  # what it returned is read here (checked only if that fails)
                    if isinstance(produced, Call):
                        asked = produced.params
                        data, carry = split_carry(copy_apart(produced.inputs,
                                                             previous.outputs))
                        carry.update(copy_apart(produced.carry, previous.outputs))
                    elif isinstance(produced, Fanout):
                        fan = Fanout([copy_apart(item, previous.outputs)
                                      for item in produced.items],
                                     copy_apart(produced.carry, previous.outputs))
                    else:
                        data, carry = split_carry(copy_apart(produced, previous.outputs))
                except (AttributeError, TypeError):
                    refusal = malformed_return(produced, transform,
                                               _transform_path(where, group.stage_id))
                    if refusal is not None:
                        raise refusal from None  # the transform's fault, not the reader's
                    raise
                del produced  # may hold views of previous outputs, released below
            if previous is not None:
                previous.ack()  # the next inputs are private copies by now
                previous = None
                if into:  # the earlier stages' calls, all acknowledged: not kept (and
                    into.clear()  # their outputs with them) while the later stages run
            if cancelled():  # cancelled between two stages
                raise RequestCancelled(f"{where}: cancelled")
            if until is not None and time.monotonic() >= until:
                raise DeadlineExceeded(f"{where}: deadline_s expired before stage "
                                       f"{group.stage_id!r}")
            abandoned: Callable[[], bool] | None = None
            if tracker is not None and request_id is not None:
                tracker.enter(request_id, group)  # raises when it was cancelled
                abandoned = partial(tracker.cancelled, request_id)
            stage_params = ({**(params or {}), **asked} if last else asked) or None
            stop = cancelled if abandoned is None else (
                lambda done=abandoned: cancelled() or done())
            try:  # a good request pays 1 bytecode per stage here (the try's NOP)
                if fan is not None:
                    previous = gather(group, fan, params=stage_params, until=until,
                                      cancelled=stop, where=where, request_id=request_id,
                                      transform=transform)
                    if last:
                        done, previous = previous, None
                        return GatheredCall(done), latencies, {}, asked
                else:
                    pending = group.submit(data, params=stage_params, until=until,
                                           request_id=request_id, abandoned=stop, into=into)
                    if last:
                        return pending, latencies, carry, asked
                    try:
                        previous = pending.result()
                    except BaseException:
                        pending.abandon()  # interrupted while it ran: its slot given back
                        group.note_failure(pending.stage)
                        raise
                    previous.outputs.update(carry)
            except Exception as error:
                refused = None if not position else output_refused(
                    error, transform, where, group.stage_id, params if last else None,
                    asked)
                if refused is None:
                    raise
                raise refused from error
            latencies[group.stage_id] = previous.latency_s
    finally:
        if previous is not None:  # a transform or a submission failed
            previous.ack()
    raise AssertionError("unreachable: a pipeline has at least one stage")
