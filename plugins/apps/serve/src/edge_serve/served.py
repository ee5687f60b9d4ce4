"""One opened pipeline as the server holds it: its ends, its states, its blocking work.

A file upload's blocking part — ``prepare`` on the uploaded file, :meth:`Pipeline.submit`
and the wait for its result, ``finish`` and the acknowledgement — runs as one function on
the server's thread pool, so the result's worker memory is given back in the same thread
that read it. A tensor request is submitted from the event loop itself
(:meth:`ServedPipeline.answer_direct`): to a one-stage pipeline with a slot free it is
sent from the loop, which reads the worker's reply itself, settles it and builds a small
answer (``Pipeline.submit``'s ``loop``); otherwise
the pipeline's request thread runs it and only wakes the loop. Before
either starts, the request waits for its turn in the pipeline's admission queue
(:mod:`edge_serve.queueing`): first come first served, up to the queue's length and the
request's deadline. :meth:`ServedPipeline.waiting` awaits it while watching the client
(:class:`~edge_serve.submitted.DisconnectWatch`): a client that disconnects cancels its
request alone (:mod:`edge_serve.submitted`; outcome ``cancelled``). The request's deadline
is the runtime's to enforce: it fences the request when the deadline passes, as a
disconnect does, retiring no worker (a preemptible stage stops the call in place, a
non-preemptible one finishes it and its result is discarded), and raises
``DeadlineExceeded``: 504.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from starlette.requests import Request

from edge_core.artifacts.errors import BundleChanged
from edge_core.config.transforms import call_prepare, resolve_input_transform
from edge_core.errors import DeadlineExceeded
from edge_core.runtime.event_gate import OnEvent
from edge_core.runtime.health import StageState, replica_summary
from edge_core.runtime.pipeline import Pipeline
from edge_core.runtime.pipeline_result import PipelineResult
from edge_core.runtime.submission import Submission
from edge_serve.draining import Drain
from edge_serve.outcomes import (
    HttpRefusal,
    deadline_passed,
    finish_answer_invalid,
    finish_failed,
    server_stopping,
    stage_unready,
)
from edge_serve.queueing import AdmissionQueue, QueuePolicy
from edge_serve.signals import Signals
from edge_serve.submitted import DisconnectWatch, RequestHandle
from edge_serve.tensors import encode_tensors

__all__ = ["Answer", "ServedPipeline", "retrieve", "unencodable"]

T = TypeVar("T")

READY = "ready"

SERVING = frozenset({READY, "degraded"})
"""Stage states that take requests: ready, or a replica set some of whose replicas serve."""

BUNDLE_CHANGED = "bundle-changed"
"""The readiness of a stage that takes requests but whose bundle changed since it loaded
(:meth:`ServedPipeline.readiness`)."""

BACKSTOP_S = 2.0
"""How long after a request's deadline the server answers 504 without the runtime."""

UNWIND_WAIT_S = 10.0
"""How long a cancelled request is waited for to unwind (its admission slot given back)."""

OUTCOME_KEY = "edge.outcome"
"""The scope key that tells the accounting an outcome the status does not (``cancelled``)."""

DIRECT_BUILD_BYTES = 256 * 1024
"""Largest tensor answer built on the event loop (a larger one is encoded on a thread)."""

#: The JSON an answer is sent as (Starlette's ``JSONResponse`` form, one encoder for all).
_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _render(body: dict[str, Any]) -> str:
    """``_encoder.encode(body)``: the C encoder it makes, made here without its three calls.

    The same encoder (fresh circular-reference markers, its ``default``, the separators,
    no NaN), or ``encode`` itself where the interpreter has no C encoder.
    """
    if c_make_encoder is None:  # pragma: no cover (CPython has it)
        return _encoder.encode(body)
    return "".join(c_make_encoder({}, _encoder.default, encode_basestring, None, ":", ",",
                                  False, False, False)(body, 0))


class Answer:
    """What one request produced: the JSON answer, rendered, and each stage's latency.

    Attributes:
        body: The answer as a JSON object.
        content: ``body`` as the UTF-8 JSON bytes the response sends (rendered where the
            answer is built: on the thread pool for ``finish`` or a large answer).
        latencies: Each stage's latency in seconds.
    """

    __slots__ = ("body", "content", "latencies")

    def __init__(self, body: dict[str, Any], latencies: Mapping[str, float]) -> None:
        self.body = body
        self.content = _render(body).encode()
        self.latencies = dict(latencies)


def retrieve(future: asyncio.Future[Any]) -> None:
    """Take a dropped request's outcome so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


class ServedPipeline:
    """An opened pipeline behind the HTTP routes.

    Args:
        pipeline: The admitted, loaded, gated pipeline (the server closes it).
        executor: Where the blocking part of each request runs.
        upload_dir: A private directory (0700) for uploaded files on their way to
            ``prepare``.
        drain: What ends the requests still open when the grace period ends (the
            server's; default: one of its own).
        queue: How many requests may wait for admission, and how long (default
            :class:`QueuePolicy`'s).
    """

    def __init__(self, pipeline: Pipeline, executor: Executor, upload_dir: Path,
                 drain: Drain | None = None, queue: QueuePolicy | None = None) -> None:
        config = pipeline.config
        self.pipeline = pipeline
        self.name = config.name
        self.queue = AdmissionQueue(config.name, pipeline.admission, queue or QueuePolicy())
        self.executor = executor
        self.upload_dir = upload_dir
        self.drain = drain if drain is not None else Drain()
        self.prepare: Callable[..., Any] | None = None
        self.finish: Callable[..., Any] | None = None
        #: ``finish``'s reference as the pipeline file names it ('' without one).
        self.finish_name = ""
        if config.prepare is not None:
            self.prepare = resolve_input_transform(config.prepare, "prepare")
        if config.finish is not None:
            self.finish = resolve_input_transform(config.finish, "finish")
            self.finish_name = config.finish.reference
        last = pipeline.stages[-1]
        self.generates = "generate" in {k.value for k in last.binding.backend.kinds}
        #: How the OpenAI routes feed it: ``"prompt"`` (its only stage generates: the
        #: prompt or chat is the stage's parameter), ``"image"`` (graph stages then a
        #: generate stage, fed by ``prepare`` from a chat's image part), or None.
        self.openai: str | None = None
        if self.generates:
            if len(pipeline.stages) == 1:
                self.openai = "prompt"
            elif self.prepare is not None:
                self.openai = "image"

    # -- states ---------------------------------------------------------------------------

    def stage_states(self) -> dict[str, str]:
        """Stage id → state (``ready``, ``needs-restart``, ``failed``, ``restarting``...).

        A replicated stage's is its replica set's (:func:`~edge_core.runtime.health.
        replica_summary`): ``ready`` when every replica is, ``degraded`` while some serve
        (requests go to them), ``unavailable`` when none does.
        """
        grouped: dict[str, list[StageState]] = {}
        for runtime in self.pipeline.stages:
            grouped.setdefault(runtime.stage_id, []).append(runtime.state)
        return {stage: states[0].value if len(states) == 1
                else str(replica_summary(states)["state"])
                for stage, states in grouped.items()}

    def bundles_changed(self) -> dict[str, str]:
        """Stage id → the ``BundleChanged`` message met reading its bundle folder, if any.

        The bundle the stage opened with changed since it loaded (a bundle verified in
        place rewritten): a ``finish`` or transform that reads its folder fails every
        request so (503 ``bundle_changed``) until the stage loads again under a new
        generation, or the server is started again
        (:meth:`~edge_core.runtime.stage_runtime.StageRuntime.note_bundle_changed`). The
        stage's worker still serves: its state is unchanged, the pipeline is not ready.
        """
        changed: dict[str, str] = {}
        for runtime in self.pipeline.stages:
            record = runtime.bundle_changed
            if record is not None:
                changed.setdefault(runtime.stage_id, record["message"])
        return changed

    def readiness(self) -> dict[str, str]:
        """Stage id → whether requests can be answered there: the one view of readiness.

        The stage's state (:meth:`stage_states`), except :data:`BUNDLE_CHANGED`
        (``bundle-changed``) for a stage that takes requests (``ready``, ``degraded``) but
        whose bundle changed since it loaded (:meth:`bundles_changed`): every request that
        reads its folder fails until it loads again, though its worker serves. The
        pipeline is ready when every stage's entry is ``ready``: ``/health`` (200 or 503),
        the pipeline's ``state`` in ``GET /v1/pipelines`` and ``edge_stage_up`` on
        ``/metrics`` all read it here, so they cannot disagree.
        """
        states = self.stage_states()
        for stage in self.bundles_changed():
            if states.get(stage) in SERVING:
                states[stage] = BUNDLE_CHANGED
        return states

    def ready(self) -> bool:
        """True when every stage's :meth:`readiness` is ``ready``."""
        return all(state == READY for state in self.readiness().values())

    def restarts(self) -> dict[str, int]:
        """Stage id → worker restarts so far (generations after the first; every replica's)."""
        counts: dict[str, int] = {}
        for runtime in self.pipeline.stages:
            counts[runtime.stage_id] = counts.get(runtime.stage_id, 0) + runtime.generation - 1
        return counts

    def require_ready(self) -> None:
        """Refuse (503) while any stage serves no request (a degraded replica set serves)."""
        for runtime in self.pipeline.stages:  # every replica ready (the usual): no more
            if runtime.state is not StageState.READY:
                break
        else:
            return
        for stage, state in self.stage_states().items():
            if state not in SERVING:
                why = "; ".join(f"{r.name}: {r.state.value}: {r.closed_reason}"
                                for r in self.pipeline.stages
                                if r.stage_id == stage and r.closed_reason)
                raise stage_unready(self.name, stage, state, why)

    def refuse_unread_params(self, params: Mapping[str, Any] | None) -> None:
        """Refuse (400, ``unsupported_parameter``) a parameter the final stage does not read.

        A request's ``params`` reach the pipeline's final stage only (a transform before it
        merges its own over them), whose backend declares the names its stages read
        (``BackendInfo.params``): any other name is refused, naming it and its value, so
        that a misspelt parameter is not silently ignored. A backend that declares none
        (``None``) is passed every name.
        """
        if not params:
            return
        last = self.pipeline.lineup.current.slots[-1]  # the placement serving now
        backend = last.binding.backend
        if backend.params is None:
            return
        unread = sorted((key for key in params if key not in backend.params), key=str)
        if unread:
            read = ", ".join(sorted(backend.params)) or "none"
            raise HttpRefusal(400, f"params.{unread[0]}", "not a parameter of this pipeline "
                              f"(its final stage {last.context.stage_id}, on {backend.name}, "
                              f"reads: {read})", params[unread[0]],
                              kind="UnsupportedParameter", code="unsupported_parameter")

    def refuse_file(self, field: str = "file") -> None:
        """Refuse (400, ``unsupported_parameter``) a file when the pipeline has no ``prepare``.

        Only ``prepare`` reads an uploaded file: without one the pipeline takes tensors
        alone, and a file is a parameter it does not read. Called before the request waits
        for admission, as :meth:`refuse_unread_params` is.
        """
        if self.prepare is None:
            raise self._no_prepare(field)

    def _no_prepare(self, field: str) -> HttpRefusal:
        return HttpRefusal(400, field, f"pipelines[{self.name}] names no 'prepare' function "
                           "to read a file with: send tensors as JSON",
                           kind="UnsupportedParameter", code="unsupported_parameter")

    def describe(self) -> dict[str, Any]:
        """The pipeline as ``GET /v1/pipelines`` lists it."""
        plan = self.pipeline.execution_plan()
        states = self.stage_states()
        in_flight: dict[str, int] = {}
        replicas: dict[tuple[str, int], Any] = {}
        for runtime in self.pipeline.stages:  # every replica of a stage counts
            in_flight[runtime.stage_id] = in_flight.get(runtime.stage_id, 0) + runtime.outstanding
            replicas[runtime.stage_id, getattr(runtime.context, "replica", 0)] = runtime
        replicated = {stage for stage, number in replicas if number}  # more than one
        return {
            "name": self.name,
            "state": "ready" if self.ready() else "degraded",
            "bundle_changed": self.bundles_changed(),
            "admission": self.pipeline.config.admission,
            "queue": {"length": self.queue.policy.length, "wait_s": self.queue.policy.wait_s,
                      "waiting": self.queue.waiting},
            "accepts": (["tensors", "file"] if self.prepare is not None else ["tensors"])
            + {"prompt": ["completions", "chat.completions"], "image": ["chat.completions"],
               None: []}[self.openai],
            "stages": [_listed(s, states, in_flight, replicas, replicated=replicated)
                       for s in plan["stages"]],
            "plan": plan,
        }

    # -- blocking work (runs on the executor) -------------------------------------------------

    def submit(self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
               deadline_s: float | None, handle: RequestHandle,
               on_event: OnEvent | None = None,
               loop: asyncio.AbstractEventLoop | None = None) -> Submission:
        """``Pipeline.submit`` for a request whose turn came; the queue is told at once.

        Its deadline fences the request, never retires a worker
        (``interrupt_at_deadline=False``): a client's short deadline costs at most the
        rest of its own call, as a disconnect does.
        """
        handle.check()
        try:
            submission = self.pipeline.submit(inputs, params=params, deadline_s=deadline_s,
                                              on_event=on_event, loop=loop,
                                              interrupt_at_deadline=False)
        finally:
            handle.admitted()
        handle.attach(submission)
        return submission

    def answer(self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
               deadline_s: float | None, handle: RequestHandle) -> Answer:
        """Submit one request, wait for it, and build its answer.

        The answer is ``finish``'s, else the outputs as tensors; nothing is built for a
        request cancelled meanwhile.
        """
        return self.built(self.submit(inputs, params, deadline_s, handle), inputs, handle)

    def built(self, submission: Submission, inputs: Mapping[str, Any],
              handle: RequestHandle) -> Answer:
        """Wait for a submitted request and build its answer (:meth:`answered`)."""
        return self.answered(submission.result(), inputs, handle)

    def answered(self, result: PipelineResult, inputs: Mapping[str, Any],
                 handle: RequestHandle) -> Answer:
        """A request's answer from its result, which is acknowledged here.

        ``finish``'s answer, else the outputs as tensors; nothing is built for a request
        cancelled meanwhile. A ``finish`` answer that strict JSON cannot carry (NaN, an
        infinity, a value of a type JSON has no form for) is a 500 naming the path to it
        in the answer (:func:`~edge_serve.outcomes.finish_answer_invalid`), a ``finish``
        that raises a 500 naming it and the error
        (:func:`~edge_serve.outcomes.finish_failed`), except ``BundleChanged`` from the
        bundle folders it reads (a stage's bundle rewritten in place since it opened: a
        503 naming the manifest, as :func:`~edge_serve.outcomes.from_exception` answers
        it); the result is acknowledged all the same.
        """
        with result:
            handle.check()  # gone while the last stage answered: nothing further
            if self.finish is not None:
                try:
                    answer = self.finish(result.outputs, inputs,
                                         self.pipeline.bundle_directories())
                except BundleChanged:  # not its code: the pipeline cannot serve as opened
                    raise
                except Exception as exc:  # the model's own code: a 500 naming it
                    raise finish_failed(self.name, self.finish_name, exc) from None
                body = {"answer": answer}
            else:
                body = {"outputs": encode_tensors(result.outputs)}
            latencies = result.latencies
            body["placement"] = result.placement  # which backend served each stage, and why
        shown: dict[str, float] = {}
        body["latency_ms"] = shown
        for stage, seconds in latencies.items():  # (a loop: a comprehension is a call more)
            shown[stage] = round(seconds * 1e3, 3)
        try:
            return Answer(body, latencies)
        except (ValueError, TypeError):  # the encoder's refusals: only finish's can fail
            found = unencodable(body.get("answer"), "answer") if self.finish else None
            if found is None:
                raise
            raise finish_answer_invalid(self.name, self.finish_name, *found) from None

    def answer_file(self, data: bytes, suffix: str, params: Mapping[str, Any] | None,
                    until: float | None, handle: RequestHandle) -> Answer:
        """``prepare`` the uploaded bytes (from a private file), then :meth:`answer`.

        ``until`` is the :func:`time.monotonic` instant the request's deadline passes
        (None: it has none). ``prepare``'s time counts against it: the request is
        submitted with what is left afterwards, and one whose deadline passed while
        ``prepare`` ran is not submitted at all (``DeadlineExceeded``: 504).
        """
        inputs = self.prepared(data, suffix)
        return self.answer(inputs, params, self._left(until, "while prepare read the upload"),
                           handle)

    def _left(self, until: float | None, where: str) -> float | None:
        """The seconds left until ``until``; ``DeadlineExceeded`` when none are."""
        if until is None:
            return None
        left = until - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"pipelines[{self.name}]: deadline_s expired before the "
                                   f"request was submitted ({where})")
        return left

    def prepared(self, data: bytes, suffix: str, field: str = "file") -> dict[str, Any]:
        """The pipeline's inputs from an uploaded file's bytes, through ``prepare``.

        The bytes are written to a private file (random name, 0600) that ``prepare`` reads
        by path and that is removed at once; a file it cannot read is 400 naming ``field``.
        A ``prepare`` that takes ``input_buffer`` is offered the pipeline's
        (:func:`~edge_core.config.transforms.call_prepare`): it writes the first stage's
        input straight into shared memory, which then travels to the worker without a
        copy. A stage that cannot give one (not ready) is the runtime's error (503), not
        the file's.
        """
        if self.prepare is None:
            raise self._no_prepare(field)
        buffer_errors: list[Exception] = []

        def input_buffer(name: str, shape: tuple[int, ...], dtype: Any) -> Any:
            try:
                return self.pipeline.input_buffer(name, shape, dtype)
            except Exception as exc:
                buffer_errors.append(exc)
                raise

        holder = SimpleNamespace(input_buffer=input_buffer)
        path = self.upload_dir / f"{secrets.token_hex(8)}{suffix}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            try:
                inputs: Any = call_prepare(self.prepare, str(path), holder)
            except Exception as exc:
                if buffer_errors:  # the stage's, not the upload's
                    raise buffer_errors[0] from None
                shown = str(exc).replace(str(path), "<upload>")  # no server paths
                raise HttpRefusal(400, field, "the pipeline's prepare could not read it",
                                  f"{type(exc).__name__}: {shown}",
                                  kind=type(exc).__name__) from None
        finally:
            path.unlink(missing_ok=True)
        return dict(inputs)

    # -- awaiting ----------------------------------------------------------------------------

    async def within(self, request: Request, handle: RequestHandle,
                     work: Callable[[float | None], T], deadline_s: float | None) -> T:
        """Wait for the request's turn, run ``work(until)`` on the executor, await it.

        ``until`` is the :func:`time.monotonic` instant the request's deadline passes (None
        without one), fixed when its turn came: the time ``work`` spends before it submits
        (a wait for a thread, ``prepare``) counts against the deadline. See
        :meth:`waiting`; ``work`` runs on the server's thread pool.
        """
        loop = asyncio.get_running_loop()

        def start(left: float | None, wake: Callable[[], None]) -> asyncio.Future[T]:
            until = None if left is None else time.monotonic() + left
            future = loop.run_in_executor(self.executor, work, until)
            future.add_done_callback(lambda _: wake())
            return future

        return await self.waiting(request, handle, start, deadline_s, loop)

    async def answer_direct(self, request: Request, handle: RequestHandle,
                            inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
                            deadline_s: float | None) -> Answer:
        """:meth:`answer` for inputs already decoded, with no thread of the server's between.

        The request is submitted from the event loop once its turn came (its admission
        slot is then free: submitting does not wait). One that can go at once (a
        one-stage pipeline, a stage slot free, small inputs) is sent from the loop, which
        reads the worker's reply itself and settles it (``loop``): no request thread
        takes part. Any other is run by the
        pipeline's request thread, whose done callback wakes the waiting request
        directly. A small tensor answer is then built on the loop, ``finish`` or a large one
        on the thread pool. Parameters the stage can tell are the request's fault are
        refused first, before the request waits in the queue
        (:meth:`Pipeline.check_params`); in a thread when there are any, since a generate
        stage may ask its worker to count a text prompt.
        """
        if params:
            await asyncio.to_thread(self.pipeline.check_params, params)
        else:
            self.pipeline.check_params(params)
        loop = asyncio.get_running_loop()
        on_loop = threading.get_ident()

        def start(left: float | None,
                  wake: Callable[[], None]) -> asyncio.Future[Submission]:
            done: asyncio.Future[Submission] = loop.create_future()

            def settle() -> None:  # on the loop
                if not done.done():
                    done.set_result(submission)
                wake()

            def settled() -> None:  # settled on the loop, or in a request thread
                if threading.get_ident() != on_loop:
                    loop.call_soon_threadsafe(settle)
                    return
                if not done.done():  # settle(), without a call more on the usual path
                    done.set_result(submission)
                wake()

            # Sent from here when it can go at once (one stage, a slot free, small
            # inputs): the loop reads the reply itself and settles it; otherwise a
            # request thread of the pipeline takes it.
            submission = self.submit(inputs, params, left, handle, loop=loop)
            submission.add_done_callback(settled)
            return done

        submission = await self.waiting(request, handle, start, deadline_s, loop)
        if self.finish is None:
            result = submission.result(0)  # how it failed is raised here
            size = 0
            for value in result.outputs.values():
                if not isinstance(value, list):
                    size += int(getattr(value, "nbytes", 0))
            if size <= DIRECT_BUILD_BYTES:
                return self.answered(result, inputs, handle)
        return await loop.run_in_executor(self.executor, self.built, submission, inputs,
                                          handle)

    async def waiting(self, request: Request, handle: RequestHandle,
                      start: Callable[[float | None, Callable[[], None]], asyncio.Future[T]],
                      deadline_s: float | None,
                      loop: asyncio.AbstractEventLoop | None = None) -> T:
        """Wait for the request's turn, ``start(deadline left, wake)`` it, await its future.

        ``loop`` is the running loop, where the caller has it at hand. ``start`` returns
        the request's future and calls ``wake()`` on the loop once that future is done
        (one coroutine throughout: a frame less each time the request's task resumes).
        The client is watched from the start (a request that ends
        within :data:`~edge_serve.submitted.WATCH_AFTER_S` is answered before its
        watch begins: there is nothing left to cancel). While the request waits in the
        admission queue (:meth:`AdmissionQueue.enter`) a full queue is 429, a deadline that
        passes is 504, a disconnect takes it out of the queue (499, outcome ``cancelled``)
        and the end of the grace period is 503. Once it runs, a client that disconnects
        cancels the request (``handle.cancel()``), whose thread is waited for so that its
        admission slot is free when this returns; the answer is 499. The runtime bounds
        the whole request by what is left of ``deadline_s`` itself: at the deadline it
        fences the request, retiring no worker (:meth:`submit`), and its
        ``DeadlineExceeded`` is the 504; this timer is only a backstop,
        :data:`BACKSTOP_S` later, for work that does not return (a transform that hangs):
        the request is cancelled and the answer is 504. A request still running when the
        server's grace period ends is cancelled and answered 503
        (:mod:`edge_serve.draining`).
        """
        signals = Signals()
        release = self.drain.hold(signals.drain)
        if loop is None:
            loop = asyncio.get_running_loop()
        watch = DisconnectWatch(request, signals.client_gone, loop=loop)
        try:
            entered = time.monotonic()
            try:
                claim = await self.queue.enter(deadline_s, signals)
            except HttpRefusal as refusal:
                if refusal.status == 499:
                    request.scope[OUTCOME_KEY] = "cancelled"
                if refusal.status == 503:
                    raise server_stopping(self.drain.grace_s) from None
                raise
            left = None if deadline_s is None else \
                max(deadline_s - (time.monotonic() - entered), 1e-3)
            handle.on_admitted = claim.settle
            woken: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                if not woken.done():
                    woken.set_result(None)

            forget = signals.on_change(wake)  # before the request starts: nothing after it
            timer = None if left is None else loop.call_later(left + BACKSTOP_S, wake)
            try:
                try:
                    future = start(left, wake)
                except BaseException:
                    claim.finished()
                    raise
                try:
                    await woken
                except BaseException:  # the server is stopping: the request goes with it
                    future.add_done_callback(retrieve)
                    future.add_done_callback(lambda _: claim.finished())
                    raise
            finally:
                forget()
                if timer is not None:
                    timer.cancel()
            if future.done():
                claim.finished()
                return future.result()
            future.add_done_callback(lambda _: claim.finished())
            await asyncio.to_thread(handle.cancel)
            if signals.gone:
                request.scope[OUTCOME_KEY] = "cancelled"
                with contextlib.suppress(Exception):  # how it ended no longer matters
                    await asyncio.wait_for(asyncio.shield(future), UNWIND_WAIT_S)
                future.add_done_callback(retrieve)
                raise HttpRefusal(499, "request", "the client disconnected; the request was "
                                  "cancelled", kind="ClientDisconnected")
            future.add_done_callback(retrieve)
            if signals.drained:
                raise server_stopping(self.drain.grace_s)
            assert deadline_s is not None
            raise deadline_passed(self.name, deadline_s)
        finally:
            release()
            watch.stop()


def _listed(entry: Mapping[str, Any], states: Mapping[str, str], in_flight: Mapping[str, int],
            replicas: Mapping[tuple[str, int], Any], *,
            replicated: set[str]) -> dict[str, Any]:
    """One execution-plan entry as ``GET /v1/pipelines`` lists it.

    ``state`` and ``in_flight`` are the stage's (a replicated stage's: its replica set's,
    every replica counted); each replica of a replicated stage also has its own
    ``replica`` number, ``replica_state`` and ``replica_in_flight``.
    """
    stage = entry["id"]
    listed = {"id": stage, "backend": entry["backend"], "kind": entry["kind"],
              "state": states.get(stage), "generation": entry["generation"],
              "in_flight": in_flight.get(stage, 0)}
    number = entry.get("replica") or 0
    runtime = replicas.get((stage, number))
    if runtime is not None and stage in replicated:
        listed.update(replica=number, replica_state=runtime.state.value,
                      replica_in_flight=runtime.outstanding)
    return listed


def unencodable(value: object, path: str,
                within: frozenset[int] = frozenset()) -> tuple[str, str, object] | None:
    """Where strict JSON cannot carry ``value``: ``(path, what it is, the value shown)``.

    The first such value in the encoder's order, with its path from ``path`` in edge's
    spelling (``answer.scores[2]``, ``answer['a b']``): NaN or an infinity (shown as JSON's
    extended names), a value of a type JSON has no form for (its type shown), a key that
    is not a string, number, bool or null, a string holding a lone surrogate (the answer
    is UTF-8), or a container that holds itself. None when there is none. Only called
    once the encoder refused an answer: a request whose answer encodes pays nothing.
    """
    if value is None or isinstance(value, int):  # bool is an int
        return None
    if isinstance(value, str):
        return None if _utf8(value) else (path, "a string UTF-8 cannot carry (a lone "
                                          "surrogate)", value)
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return path, "a number JSON cannot carry", _json_name(value)
    if not isinstance(value, (dict, list, tuple)):
        kind = type(value)
        return path, "a value of a type JSON cannot carry", \
            f"{kind.__module__}.{kind.__qualname__}"
    if id(value) in within:
        return path, "a container that holds itself", None
    inside = within | {id(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, float) and not math.isfinite(key):
                return path, "a key JSON cannot carry", _json_name(key)
            if not (key is None or isinstance(key, (str, int, float))):
                kind = type(key)
                return path, "a key JSON cannot carry", \
                    f"{kind.__module__}.{kind.__qualname__}"
            if isinstance(key, str) and not _utf8(key):
                return path, "a key UTF-8 cannot carry (a lone surrogate)", key
            named = f"{path}.{key}" if isinstance(key, str) and key.isidentifier() \
                else f"{path}[{key!r}]"
            found = unencodable(item, named, inside)
            if found is not None:
                return found
        return None
    for index, item in enumerate(value):
        found = unencodable(item, f"{path}[{index}]", inside)
        if found is not None:
            return found
    return None


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a lone surrogate does not)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _json_name(number: float) -> str:
    """NaN and the infinities as JSON's extended forms name them."""
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def private_upload_dir() -> Path:
    """A fresh directory only this user can read, for uploads on their way to ``prepare``."""
    return Path(tempfile.mkdtemp(prefix="edge-serve-"))
