"""A whole pipeline: opened as one plan, served as a linear chain, closed, reported.

:meth:`Pipeline.open` runs the flow of DESIGN.md through a
:class:`~edge_core.runtime.opener.StageOpener`: resolve each stage's backend (an
unavailable one is refused with its probe's reason) → check the topology → reserve every
stage's demands on every pool at once → load each stage → warm-up placement gate,
numerical check and observed-memory check. Stages that list candidates are opened one
candidate at a time instead (:mod:`edge_core.runtime.candidates`). Any failure unwinds in
reverse — retire the started workers, release their reservations (or quarantine them
when retirement was not verified) — and re-raises the first error. Once every gate has
passed, the reference runs are made (:mod:`edge_core.runtime.reference_run`).

Serving (:meth:`Pipeline.run`, :meth:`~Pipeline.stream`, :meth:`~Pipeline.submit`) takes
the pipeline's admission and drives one request through the chain
(:mod:`edge_core.runtime.chain`); :meth:`Pipeline.close` retires every stage and settles
each reservation; :meth:`Pipeline.execution_plan` reports what was admitted and how.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from edge_contracts.heap import (
    HEAP_ENV,
    HEAP_POLICIES,
    apply_heap_policy,
    unknown_heap_policy,
)
from edge_core.config.model import PipelineConfig
from edge_core.errors import ConfigError, DeadlineExceeded, ResourceUnavailable, StageClosed
from edge_core.host.loop_calls import call_soon_once
from edge_core.host.warm_pool import Zygote
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime.admission import SlotPool, take_slot
from edge_core.runtime.bundle_folders import BundleFolders
from edge_core.runtime.candidates import open_stages
from edge_core.runtime.chain import (
    CARRY_PREFIX,
    GatheredCall,
    GatheredResult,
    Transform,
    output_refused,
    run_chain,
    split_carry,
)
from edge_core.runtime.deadlines import deadline_until
from edge_core.runtime.early_zygotes import end_early_zygotes, start_early_zygotes
from edge_core.runtime.errors import RequestCancelled
from edge_core.runtime.event_gate import EventGate, OnEvent
from edge_core.runtime.execution_plan import execution_plan
from edge_core.runtime.health import pipeline_health
from edge_core.runtime.memory_check import memory_report
from edge_core.runtime.opener import StageOpener
from edge_core.runtime.pending import PendingCall
from edge_core.runtime.pipeline_result import (
    PipelineResult,
    Release,
    start_unacknowledged_drain,
)
from edge_core.runtime.reference_run import run_references
from edge_core.runtime.replicas import ReplicaSet
from edge_core.runtime.request_inputs import malformed_inputs
from edge_core.runtime.request_tracker import RequestTracker
from edge_core.runtime.results import StageResult
from edge_core.runtime.selection_policy import SelectionPolicy, open_selected
from edge_core.runtime.serving_lineup import Serving, ServingLineup
from edge_core.runtime.stage_runtime import StageRuntime, close_all
from edge_core.runtime.stage_slot import ExampleInputs, StageSlot, UnverifiedRetirement
from edge_core.runtime.submission import RequestAnswer, Submission, submit
from edge_core.selection.gates import GateStore
from edge_core.selection.store import DecisionStore
from edge_core.selection.workload import Workload

if TYPE_CHECKING:  # typing only: edge run imports no asyncio
    import asyncio

__all__ = ["CARRY_PREFIX", "SEND_NOW_BYTES", "Pipeline", "PipelineResult", "Transform",
           "split_carry"]

SEND_NOW_BYTES = 256 * 1024
"""Largest inputs :meth:`Pipeline.submit` sends from an event loop's thread (``loop``)."""

CLOSE_HEAL_WAIT_S = 2.0
"""How long ``close()`` waits for a quarantined worker tree that was just killed to go."""


def _input_bytes(inputs: Mapping[str, Any]) -> int:
    """The bytes of a request's arrays (what sending them copies).

    Inputs that are no mapping count as too many to send from the loop: the request
    thread refuses them (``InvalidValue`` naming ``inputs``) through the result.
    """
    total = 0
    try:
        for value in inputs.values():  # (a loop: no generator made per request)
            total += int(getattr(value, "nbytes", 0))
    except (AttributeError, TypeError):
        return SEND_NOW_BYTES + 1
    return total


_NO_CARRY: dict[str, Any] = {}  # a one-stage request's carried values: none (never changed)


def _wake(done: Any) -> None:
    """Set an awaited future's result, unless its task was cancelled meanwhile."""
    if not done.done():
        done.set_result(None)


def _epoch_moved(pipeline: weakref.ref[Pipeline], epoch: int) -> bool:
    """True once ``pipeline`` was cancelled since ``epoch`` (its epoch then), or is gone."""
    alive = pipeline()
    return alive is None or alive.epoch != epoch


def _leave(admitting: threading.RLock, lineup: ServingLineup, admission: SlotPool,
           serving: Serving) -> None:
    """Give back what a delivered request held: its placement and its admission slot.

    ``admitting`` is the lock the lineup and the admission share: one section for both.
    """
    with admitting:
        lineup.leave_held(serving)
        if admission.used <= 0:  # SlotPool.release_held, without its call
            raise RuntimeError(f"{admission.what}: release without a matching acquire")
        admission.used -= 1
        if admission.waiters:
            admission.wake_held()
    if admission.listeners:  # (called without the lock)
        for listener in admission.listeners:
            listener()


def _leave_once(admitting: threading.RLock, lineup: ServingLineup, admission: SlotPool,
                serving: Serving | None, left: list[bool]) -> None:
    """:func:`_leave`, for a holder whose own release a Ctrl-C may cut short: given once.

    The placement's hold and the admission slot are counted given back, and ``left``
    appended to, in one run of statements without a call (see :attr:`SlotPool.used`):
    called again after an interrupt, it gives back nothing twice (and wakes the waiters
    again). ``serving`` None: the admission slot alone.
    """
    with admitting:
        if not left:
            if serving is not None:
                serving.holds -= 1
            admission.used -= 1
            left.append(True)
        if serving is not None:
            lineup.left_held(serving)
        if admission.waiters:
            admission.wake_held()
    if admission.listeners:  # (called without the lock)
        for listener in admission.listeners:
            listener()


def _acknowledge(submission: Submission) -> None:
    """Acknowledge a result nobody will take (an error is the abandoned request's own)."""
    try:
        result = submission.result(0)
    except Exception:  # how an abandoned request ended is nobody's business now
        return
    result.ack()


def _abandon(submission: Submission) -> None:
    """Fence a request whose awaiting task was cancelled; acknowledge its result if any."""
    submission.cancel(interrupt=False)
    submission.add_done_callback(partial(_acknowledge, submission))


def _abandon_submitted(submitting: Any) -> None:
    """:func:`_abandon` the submission a cancelled task was still waiting to get."""
    if not submitting.cancelled() and submitting.exception() is None:
        _abandon(submitting.result())


class Pipeline:
    """An admitted, loaded, gated pipeline. Open with :meth:`open`; close with :meth:`close`.

    Args:
        opener: The opener that opened ``slots`` (it reloads them on restart).
        slots: Every stage replica, opened and gated, in data-flow order. Their reference
            runs are made here; if that raises, everything is closed first.

    Attributes:
        config: The pipeline's configuration.
        plugins: The plugins its stages run on.
        ledger: Where its reservations are charged.
        admission: The pipeline's admission slots (``admission`` requests at once).
        requests: Where each submitted request is, to cancel it alone.
        candidates: Stage id → each candidate tried at open (or the last restart), in
            order.
    """

    def __init__(self, opener: StageOpener, slots: list[StageSlot],
                 policy: SelectionPolicy | None = None) -> None:
        config = opener.config
        self.config = config
        self.plugins = opener.plugins
        self.ledger = opener.ledger
        self.opener = opener
        self.policy = policy or SelectionPolicy.fixed(config)
        """How the stages' candidates were (and are being) chosen: its ``record`` is the
        plan's ``selection`` section (:mod:`edge_core.runtime.selection_policy`)."""
        # The lineup's lock is the admission's too: a request takes its slot and its
        # placement in one lock section, and gives both back in one
        self._admitting = threading.RLock()
        self.lineup = ServingLineup(Serving(slots, self.policy.decisions(),
                                            measured_at=self.policy.measured_at()),
                                    lock=self._admitting)
        """The placement requests are served on (switched by a first-ready start)."""
        self.admission = SlotPool(config.admission, f"pipelines[{config.name}].admission",
                                  lock=self._admitting)
        self._where = f"pipelines[{config.name}]"  # names the pipeline in refusals
        self.requests = RequestTracker(config.name)
        # The on_event gates of the submitted requests, closed by cancel() (held weakly:
        # a request's gate goes with its submission and its request thread's work)
        self._gates: weakref.WeakSet[EventGate] = weakref.WeakSet()
        self._gates_lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._ids = iter(range(1, 1 << 62))
        self.epoch = 0
        # A delivered request's release and receipt (stateless partials), made again only
        # when its placement or their generations differ from the last request's (read
        # and replaced whole; none refers to this pipeline: no reference cycle).
        self._delivery_parts: tuple[Serving, int | tuple[int | None, ...],
                                    Release, Callable[[], Any]] | None = None
        # A one-stage request's abandoned() of the current epoch, with that epoch: made
        # again when the epoch moved (it refers to this pipeline weakly: no cycle)
        self._epoch_moved_since: tuple[int, Callable[[], bool]] | None = None
        self.opened_at = opener.started_at
        self.closed = False
        self.candidates: dict[str, list[dict[str, Any]]] = opener.tried
        start_unacknowledged_drain()  # a result dropped unacknowledged is acknowledged
        try:  # after every gate passed; a reference that fails only withholds a label
            run_references(opener, slots)
            self.policy.serving(self.lineup)  # a first-ready start goes on in the background
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(
        cls,
        config: PipelineConfig,
        plugins: PluginSet,
        ledger: ResourceLedger,
        *,
        progress: Callable[[str], None] | None = None,
        retire_deadline_s: float = 5.0,
        workload: Workload | None = None,
        store: DecisionStore | None = None,
        remeasure: bool = False,
        gates: GateStore | None = None,
        parallel_start: bool = True,
        full_gates: bool = False,
    ) -> Pipeline:
        """Resolve, check, reserve, load and gate every stage; unwind on any failure.

        A stage with several candidates gets the one the pipeline's ``selection`` says:
        measured on ``workload`` (default: the pipeline's own, else the first stage's
        bundled examples), the decision kept in ``store`` (default: the user's cache
        directory) and reused while its key matches unless ``remeasure``; or the first
        that passes. ``start = "first-ready"`` serves before the measurement ends
        (:mod:`edge_core.runtime.selection_policy`). Stages admitted together start in
        parallel; a stage whose full load gate is stored in ``gates`` (default: the
        user's cache directory) under the same key checks one point of each dynamic
        entry, unless ``remeasure`` or ``full_gates`` (:mod:`edge_core.selection.gates`);
        ``parallel_start=False`` starts them one after another (a traced profile).

        Raises:
            BackendUnavailable: a stage's backend is not installed or its probe says no.
            TopologyRefused: the stages are not a linear chain.
            ResourceUnavailable: the plan does not fit the ledger (nothing is charged).
            PlacementRefused / NumericsRefused / DemandExceeded: a stage failed its gate.
            CandidatesRefused: every candidate of a stage that lists some was refused.
            ConfigError: ``EDGE_HEAP`` names no heap policy (before anything starts).
            Any error from a plugin's load or warm-up, after unwinding.
        """
        if (unknown := unknown_heap_policy()) is not None:  # before anything is charged
            policies = ", ".join(HEAP_POLICIES)
            raise ConfigError(HEAP_ENV, f"names no heap policy (one of {policies}; unset "
                              "means rest)", unknown)
        apply_heap_policy()  # the controller gives freed memory back at rest (EDGE_HEAP)
        # the warm pool's zygotes import while this side plans, reserves and verifies
        early: list[Zygote] = []
        try:
            start_early_zygotes(config, plugins, early)
            opener = StageOpener(config, plugins, ledger, progress=progress,
                                 retire_deadline_s=retire_deadline_s,
                                 gates=gates if gates is not None else GateStore(),
                                 reuse_gates=not (remeasure or full_gates),
                                 parallel_start=parallel_start)
            policy = open_selected(opener, workload=workload, store=store,
                                   remeasure=remeasure)
            if policy is not None:
                return cls(opener, policy.slots, policy)
            if any(stage.candidates for stage in config.stages):
                return cls(opener, open_stages(opener))
            return cls(opener, opener.open_all())
        finally:  # those no start was given: a failed open, or a key expected wrongly
            end_early_zygotes(early)

    # -- serving ---------------------------------------------------------------------------

    @property
    def _slots(self) -> list[StageSlot]:
        """The slots of the placement requests start on now."""
        return self.lineup.current.slots

    @property
    def _groups(self) -> list[ReplicaSet]:
        """The replica set of each stage of the current placement."""
        return self.lineup.current.groups

    @property
    def stages(self) -> list[StageRuntime]:
        """The stage runtimes, in data-flow order."""
        return [s.runtime for s in self._slots if s.runtime is not None]

    def bundle_directories(self) -> BundleFolders:
        """Stage id → the folder of the verified bundle its worker loaded (or None).

        What ``finish`` gets: the bytes each stage loaded, never a rewrite since — a
        folder verified in place is checked when looked up, ``BundleChanged`` once
        rewritten (:mod:`~edge_core.runtime.bundle_folders`).
        """
        return self.lineup.current.bundle_directories()

    def example_inputs(self) -> ExampleInputs | None:
        """The first stage's bundled example inputs, as it loaded them.

        What its bundle held when the stage verified it (:meth:`StageSlot.example_inputs`),
        never a rewrite since: that is refused with ``BundleChanged``. ``None`` when the
        first stage has no bundle or its bundle no example inputs.
        """
        return self._slots[0].example_inputs()

    def stage(self, stage_id: str) -> StageRuntime:
        """One stage's runtime by id."""
        for s in self._slots:
            if s.context.stage_id == stage_id and s.runtime is not None:
                return s.runtime
        raise KeyError(stage_id)

    def input_buffer(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """An array to fill in place as the first stage's input ``name``, sent by reference.

        See :meth:`StageRuntime.input_buffer`; pass the very array to :meth:`run`. With
        replicas, it lives on one of them and requests carrying it are routed there
        (:meth:`ReplicaSet.input_buffer`).
        """
        return self._groups[0].input_buffer(name, shape, dtype)

    def owns_input_buffer(self, value: Any) -> bool:
        """True when ``value`` is a first-stage input buffer in shared memory."""
        return self._groups[0].owner_of({"value": value}) is not None

    def input_buffer_counts(self) -> dict[str, int]:
        """The first stage's :meth:`ReplicaSet.input_buffer_counts`."""
        return self._groups[0].input_buffer_counts()

    def _chain(
        self, serving: Serving, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
        until: float | None, request_id: str | None = None,
        into: list[PendingCall] | None = None,
    ) -> tuple[PendingCall | GatheredCall, dict[str, float], dict[str, Any],
               Mapping[str, Any]]:
        """Run every stage but the last to completion; submit the last and return it.

        Every stage runs on ``serving``, the placement the request entered. ``until``
        (monotonic) bounds every stage call; ``request_id`` is the request's id on every
        stage, tracked so that :meth:`Submission.cancel` finds it. ``into``: the caller's
        list of its stage calls (see :func:`~edge_core.runtime.chain.run_chain`).
        """
        epoch = self.epoch
        return run_chain(serving.groups, serving.transforms, inputs, params=params,
                         until=until, cancelled=lambda: self.epoch != epoch,
                         where=self._where,
                         request_id=request_id, tracker=self.requests, into=into)

    def run(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
            deadline_s: float | None = None) -> PipelineResult:
        """Run one request through every stage; acknowledge the result when done with it.

        Args:
            inputs: The first stage's inputs (name to array).
            params: Request parameters for the final stage (e.g. sampling parameters).
            deadline_s: Bound on the whole request, from now to its result, waiting for
                admission and in-flight slots included. Without it a full pipeline
                refuses at once (``ResourceUnavailable``), an admitted request waits for
                each stage's in-flight slot (held until the results that hold one are
                acknowledged), and each stage call is still bounded by its stage's
                ``call_timeout_s``.

        Raises:
            DeadlineExceeded: the deadline (or a stage's ``call_timeout_s``) expired; a
                preemptible stage cancelled the call in place, a non-preemptible one had
                its worker retired and is ``failed``.
            WorkerUnresponsive / WorkerGone: the worker stopped answering or died.
            RequestTooLarge: the inputs exceed a stage's ``max_io_bytes``.
            InvalidValue: ``inputs`` are no mapping of input names to arrays.
            StageClosed: the pipeline was closed (``pipelines[p]: closed``, waiting for
                admission too), or no stage serves.
        """
        lone = self.lineup.current.lone  # check_params, without the call
        if lone is not None and (check := getattr(lone.loaded, "check_params", None)) is not None:
            check(dict(params or {}))
        until = None if deadline_s is None else deadline_until(deadline_s)
        return self._run(inputs, params, until, None)

    def _run(self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
             until: float | None, request_id: str | None, admitted: bool = False,
             on_event: EventGate | None = None) -> PipelineResult:
        # What the request holds is known from what is set, at every point where a
        # Ctrl-C can act (where a call returns, where a function starts: see
        # test_interrupted_calls), and the failure path gives back what is set: the
        # admission slot and the placement are counted taken in one run of statements
        # without a call, ``serving`` set with them (under a deadline the slot is waited
        # for first, ``taken`` says when it was); each stage call is appended to
        # ``calls`` as its stage registers it; the result holds it all once made.
        if until is not None and not admitted:  # its refusals raised as they are
            taken: list[bool] = []  # the slot, once take_slot counted it taken
            try:
                take_slot(self.admission, until, taken)  # (waits: not in the section below)
                admitted = True
            except BaseException:
                if taken:  # interrupted as it returned: the slot taken, given back
                    self.admission.release()
                raise
        serving: Serving | None = None  # entered, its admission slot taken with it
        last: PendingCall | GatheredCall | None = None  # the last call (abandoned on failure)
        calls: list[PendingCall] = []  # every stage call, as it is registered
        result: PipelineResult | None = None
        try:
            with self._admitting:  # the lineup's and the admission's lock
                if not admitted:  # take_slot without a deadline: free now, else refused
                    admission = self.admission
                    if admission.used >= admission.limit:
                        raise admission.refusal(None)
                    admission.used += 1
                    admitted = True
                epoch = self.epoch
                if on_event is not None:  # (read with the epoch: see cancel)
                    on_event.epoch = epoch
                serving = self.lineup.current  # ServingLineup.enter_held, without its call
                serving.holds += 1
            if serving.direct is not None:  # one stage: no chain to run
                direct = last = self._direct(serving.direct, inputs, params, until,
                                             request_id, epoch, into=calls)
                assert direct is not None  # (waits for a slot: never None)
                if on_event is not None:
                    for event, tensors in direct.events():
                        on_event(event, tensors)
                final: StageResult | GatheredResult = direct.result()
                latencies: dict[str, float] = {}
                carry: dict[str, Any] = _NO_CARRY  # (only read)
            else:
                chained, latencies, carry, asked = self._chain(serving, inputs, params,
                                                               until, request_id, calls)
                last = chained
                try:  # a good request pays 2 bytecodes here (the try's NOP, a jump past)
                    if on_event is not None:
                        for event, tensors in chained.events():
                            on_event(event, tensors)
                    final = chained.result()
                except Exception as error:  # the last stage's answer: refused its inputs?
                    refused = self._last_refused(serving, error, params, asked)
                    if refused is None:
                        raise
                    raise refused from error
            release, receipt = self._delivery(serving, final, epoch, request_id, latencies,
                                              carry)
            # Made in two steps: once __init__ ran to its end the result holds the request
            # (a result dropped gives it back through its drain); until then this does
            result = PipelineResult.__new__(PipelineResult)
            PipelineResult.__init__(result, final, latencies, release, (), receipt)
            return result
        except BaseException as exc:
            if result is not None and result.made:
                raise  # the result holds what the request held: given back when dropped
            if last is not None:  # it may still hold its stage's slot (or its result)
                last.abandon()
            for call in calls:  # each stage call, held or not yet (abandoned once: the
                call.abandon()  # last, each earlier one acknowledged or abandoned already)
            if serving is not None:
                _leave(self._admitting, self.lineup, self.admission, serving)
            elif admitted:  # taken under a deadline (or by the caller), no placement yet
                self.admission.release()
            if isinstance(exc, Exception) and (refusal := self._refusal(exc, inputs)):
                raise refusal from None  # the inputs' fault, or the closed pipeline's
            raise

    def _last_refused(self, serving: Serving, error: Exception,
                      params: Mapping[str, Any] | None,
                      asked: Mapping[str, Any]) -> Exception | None:
        """``TransformOutputRefused`` for the last stage's refusal of its inputs, else None.

        Asked once the last stage of a chain (more than one stage) answered with an error
        (a worker's, declaring a request fault): the inputs its transform built were
        refused, as the chain finds for every stage before it
        (:func:`~edge_core.runtime.chain.output_refused`). A refusal naming one of the
        caller's ``params`` that the transform's ``asked`` did not replace stays the
        request's own, as does one naming no field when any such parameter reached it.
        """
        return output_refused(error, serving.transforms[-1], self._where,
                              serving.groups[-1].stage_id, params, asked)

    def _refusal(self, error: Exception, inputs: object) -> Exception | None:
        """What a failed request raises instead of ``error`` (asked on the failure path).

        Inputs that are no mapping of input names: their ``InvalidValue`` naming
        ``inputs`` (:func:`~edge_core.runtime.request_inputs.malformed_inputs`), not the
        error of the code that read them. A stage's ``StageClosed`` once the pipeline is
        closed: ``StageClosed`` naming the pipeline (``pipelines[p]: closed``), as
        :meth:`submit` refuses after :meth:`close`.
        """
        if refusal := malformed_inputs(inputs):
            return refusal
        if self.closed and isinstance(error, StageClosed):
            return StageClosed(f"{self._where}: closed")
        return None

    def _delivery(self, serving: Serving, final: StageResult | GatheredResult, epoch: int,
                  request_id: str | None, latencies: dict[str, float],
                  carry: dict[str, Any]) -> tuple[Release,
                                                  Callable[[], Sequence[Mapping[str, Any]]]]:
        """What a request's :class:`PipelineResult` is made of: (its release, its receipt).

        Gives back nothing itself (the caller does on failure). A request cancelled while
        its last stage ran delivers nothing: its result is acknowledged and
        ``RequestCancelled`` raised.
        """
        if self.epoch != epoch or (  # cancelled while the last stage ran: deliver nothing
                request_id is not None and self.requests.cancelled(request_id)):
            final.ack()
            raise RequestCancelled(f"pipelines[{self.config.name}]: cancelled")
        if carry:
            final.outputs.update(carry)
        latencies[serving.final_stage_id] = final.latency_s
        # The placement's generations as compared with the last request's: the one
        # worker's own (an int, no tuple made per request), else every stage's
        seen: int | tuple[int | None, ...]
        if serving.single_worker and isinstance(final, StageResult):
            seen = final.key.generation
        else:
            seen = serving.generations()
        parts = self._delivery_parts
        if parts is None or parts[0] is not serving or parts[1] != seen:
            # (partials, C: no closure and its cells), made again only when the placement
            # or its generations changed since the last request's
            generations = (seen,) if isinstance(seen, int) else seen
            parts = self._delivery_parts = (
                serving, seen,
                partial(_leave_once, self._admitting, self.lineup, self.admission, serving),
                partial(serving.receipt_of, generations))
        return parts[2], parts[3]

    def _direct(self, group: ReplicaSet, inputs: Mapping[str, Any],
                params: Mapping[str, Any] | None, until: float | None,
                request_id: str | None, epoch: int, *, now: bool = False,
                into: list[PendingCall] | None = None) -> PendingCall | None:
        """Submit a request of a one-stage placement to its stage, as the chain would.

        What :func:`~edge_core.runtime.chain.run_chain` does for a chain of one stage,
        without its loop: carried inputs stay out of the stage's inputs (and out of the
        result: only a transform carries values on), the pipeline's cancel and the
        request's deadline are checked first, the request is tracked on the stage and
        its parameters go to the stage as they are. ``now``: only on a replica with a
        free slot (:meth:`ReplicaSet.try_submit`), else None, without waiting. ``into``:
        the caller's list of its calls (see :meth:`StageRuntime.submit`).
        """
        for key in inputs:  # carried values stay out of the stage's inputs
            if key.startswith(CARRY_PREFIX):
                data: Mapping[str, Any] = split_carry(inputs)[0]
                break
        else:  # the usual case: the inputs as given (sent before the submission returns)
            data = inputs
        if self.epoch != epoch:
            raise RequestCancelled(f"{self._where}: cancelled")
        if until is not None and time.monotonic() >= until:
            raise DeadlineExceeded(f"{self._where}: deadline_s expired before stage "
                                   f"{group.stage_id!r}")
        # The stage asks abandoned() as it registers the request (a cancel meanwhile):
        # a partial of a method, not a closure (no cells, no function made per request)
        abandoned: Callable[[], bool]
        if request_id is not None:
            self.requests.enter(request_id, group)  # raises when it was cancelled
            abandoned = partial(self._request_abandoned, epoch, request_id)
        else:  # the same for every request of an epoch: made again when the epoch moved
            moved = self._epoch_moved_since
            if moved is None or moved[0] != epoch:
                moved = self._epoch_moved_since = (
                    epoch, partial(_epoch_moved, weakref.ref(self), epoch))
            abandoned = moved[1]
        if now:  # a free slot now, or None
            return group.try_submit(data, params=dict(params) if params else None,
                                    until=until, request_id=request_id, abandoned=abandoned,
                                    into=into)
        return group.submit(data, params=dict(params) if params else None, until=until,
                            request_id=request_id, abandoned=abandoned, into=into)

    def _request_abandoned(self, epoch: int, request_id: str) -> bool:
        """True once the pipeline or request ``request_id`` was cancelled since ``epoch``."""
        return self.epoch != epoch or self.requests.cancelled(request_id)

    def stream(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
               deadline_s: float | None = None,
               ) -> Generator[tuple[Any, Mapping[str, Any]], None, None]:
        """Run the chain and yield the final stage's non-terminal events (tokens) as they come.

        The admission slot is held until the stream ends; the final result is acknowledged
        when the generator finishes or is closed. ``deadline_s`` bounds the whole stream
        (see :meth:`run`). A ``KeyboardInterrupt`` (Ctrl-C) wherever CPython acts on it, as
        the generator is advanced or in the caller's loop (the generator then closed or
        dropped), leaves nothing held, as for :meth:`run`.
        """
        self.check_params(params)
        until = None if deadline_s is None else deadline_until(deadline_s)
        # As _run: what the stream holds is known from what is set at every point where a
        # Ctrl-C can act, and its end gives back what is set: once more, to its end, where
        # an interrupt cut that short (_end_stream)
        admitted = False
        if until is not None:  # its refusals raised as they are
            taken: list[bool] = []  # the slot, once take_slot counted it taken
            try:
                take_slot(self.admission, until, taken)  # (waits: not in the section below)
                admitted = True
            except BaseException:
                if taken:  # interrupted as it returned: the slot taken, given back
                    self.admission.release()
                raise
        serving: Serving | None = None  # entered, its admission slot taken with it
        calls: list[PendingCall] = []  # every stage call, as it is registered
        left: list[bool] = []  # the placement and the admission slot, once given back
        interrupted = False  # by a Ctrl-C (not an error, not the generator's close)
        try:
            with self._admitting:  # the lineup's and the admission's lock
                if not admitted:  # no deadline: a slot free now, else refused
                    admission = self.admission
                    if admission.used >= admission.limit:
                        raise admission.refusal(None)
                    admission.used += 1
                    admitted = True
                serving = self.lineup.current  # ServingLineup.enter_held, without its call
                serving.holds += 1
            try:
                pending, _, _, asked = self._chain(serving, inputs, params, until, None, calls)
            except Exception as exc:
                if refusal := self._refusal(exc, inputs):
                    raise refusal from None
                raise
            try:
                yield from pending.events()
            except Exception as error:  # the last stage's answer: a refusal of its inputs?
                refused = None if serving.direct is not None else self._last_refused(
                    serving, error, params, asked)
                if refused is None:
                    raise
                raise refused from error
        except (Exception, GeneratorExit):
            raise
        except BaseException:  # a Ctrl-C (KeyboardInterrupt, the command line's SIGTERM)
            interrupted = True
            raise
        finally:  # ended, failed, closed or dropped (GeneratorExit), or interrupted
            try:
                self._end_stream(calls, serving, admitted, left, interrupted)
            except BaseException:  # cut short (a Ctrl-C): the rest given back, then raised
                self._end_stream(calls, serving, admitted, left, True)
                raise

    def _end_stream(self, calls: list[PendingCall], serving: Serving | None, admitted: bool,
                    left: list[bool], interrupted: bool) -> None:
        """Give back what a stream held: its stage calls, its placement, its admission slot.

        Each call is closed (its result acknowledged, or a call not ended cancelled and
        read to its end), then the placement and the admission slot are given back once
        (``left`` records it: :func:`_leave_once`). ``interrupted`` (a Ctrl-C, as the
        stream ran or as this ran before): each call is abandoned instead, as
        :meth:`run` abandons its calls (:meth:`PendingCall.abandon`: read to its end by
        the thread that reads it, never cancelled, its worker never retired for it).
        """
        for call in calls:
            if interrupted:
                call.abandon()
            else:
                call.close()
        if admitted:
            _leave_once(self._admitting, self.lineup, self.admission, serving, left)

    async def arun(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
                   deadline_s: float | None = None) -> PipelineResult:
        """:meth:`run` for asyncio code: :meth:`submit` off the loop, its result awaited.

        Cancelling the awaiting task fences the request, as ``Submission.cancel(interrupt=
        False)`` does: one still waiting (for admission, a stage's slot, a replica) never
        runs and gives its admission back now; a call running is left to finish (no worker
        is retired) and its result acknowledged when it arrives.
        """
        import asyncio  # where used: importing it (ssl with it) is ~20 ms of edge run's start

        loop = asyncio.get_running_loop()
        # Admission may be waited for (up to the deadline): in a thread, not on the loop.
        submitting = loop.run_in_executor(None, partial(self.submit, inputs, params=params,
                                                        deadline_s=deadline_s))
        try:
            submission = await asyncio.shield(submitting)
        except asyncio.CancelledError:  # the request is fenced once it is submitted
            submitting.add_done_callback(_abandon_submitted)
            raise
        done = loop.create_future()

        def settled() -> None:  # in the thread that settled it (or here, when done)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits
                loop.call_soon_threadsafe(_wake, done)

        submission.add_done_callback(settled)
        try:
            await done
        except asyncio.CancelledError:
            _abandon(submission)
            raise
        return submission.result(0)

    def submit(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
               deadline_s: float | None = None, request_id: str | None = None,
               on_event: OnEvent | None = None,
               loop: asyncio.AbstractEventLoop | None = None,
               interrupt_at_deadline: bool = True) -> Submission:
        """Submit one request; returns its :class:`Submission` (id, result, own cancel).

        Admission is taken here (at once, or waiting up to ``deadline_s``, which bounds
        the whole request as in :meth:`run`); the request then runs on one of the
        pipeline's request threads. See :func:`edge_core.runtime.submission.submit`.
        ``on_event(event, tensors)`` is called on that thread with each non-terminal
        event of the final stage (tokens) as it arrives, as :meth:`stream` yields them.
        ``Submission.cancel(interrupt=False)`` cancels it without ever retiring a worker
        (:mod:`edge_core.runtime.fence`).

        ``loop`` (an asyncio event loop; call this on its thread): a request that can go
        at once — a one-stage placement, an admission slot and a stage slot free now,
        inputs of at most :data:`SEND_NOW_BYTES`, no ``on_event`` — is sent from the
        loop, and no request thread takes part: the loop reads the worker's channel
        itself while the request is open (:class:`~edge_core.host.loop_reading.
        LoopReading`, for a stage that can call back: ``on_end`` on its loaded handle),
        and settles the submission on its thread once the reply is in — its done
        callbacks run there. Its deadline, its own cancel, the tracking, a worker's death
        and the acknowledgement are as on the request threads. Any other request goes to
        them as without ``loop``.

        ``interrupt_at_deadline=False``: the deadline bounds the wait for admission, and
        when it passes before the answer the request is *fenced*, as
        ``Submission.cancel(interrupt=False)`` fences it, never interrupted: the result
        raises ``DeadlineExceeded`` from then on (:meth:`Submission.fence_at`), no further
        stage starts, a call a non-preemptible stage is running is left to finish (its
        worker kept, its result discarded, the stage's slot and the admission slot freed
        at its end) and a preemptible stage stops it in place. Each stage call is then
        bounded by its stage's ``call_timeout_s`` alone, which still retires a worker
        whose call overruns it. For a server, where one client's short deadline must not
        retire a worker that every other client shares.
        """
        if self.closed:
            raise StageClosed(f"pipelines[{self.config.name}]: closed")
        lone = self.lineup.current.lone  # check_params, without the call (as run)
        if lone is not None and (check := getattr(lone.loaded, "check_params", None)) is not None:
            check(dict(params or {}))
        rid = request_id or f"{self.config.name}-{next(self._ids)}"
        until = None if deadline_s is None else deadline_until(deadline_s)
        fenced = until is not None and not interrupt_at_deadline
        calls_until = None if fenced else until  # fenced: call_timeout_s bounds each call
        if (loop is not None and on_event is None
                and self.lineup.current.direct is not None  # one stage in every placement
                and _input_bytes(inputs) <= SEND_NOW_BYTES):
            sent = self._send_now(inputs, params, until, rid, loop, calls_until)
            if isinstance(sent, Submission):
                if until is not None and fenced:
                    sent.fence_at(until)
                return sent
            admitted = sent  # admitted and tracked, no stage slot free now: a thread waits
        else:
            admitted = False
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.config.admission, thread_name_prefix=f"edge-{self.config.name}")
        gate = None
        if on_event is not None:  # called through its gate, which a cancel closes
            gate = EventGate(on_event)
            with self._gates_lock:
                self._gates.add(gate)
        try:
            submission = submit(self._executor, self.requests, self.admission,
                                lambda _, rid: self._run(inputs, params, calls_until, rid,
                                                         admitted=True, on_event=gate),
                                rid, until, admitted=admitted, gate=gate)
        except RuntimeError:  # the executor shut down: a close came after the check above
            if not self.closed:  # (its admission was given back by submit)
                raise
            raise StageClosed(f"pipelines[{self.config.name}]: closed") from None
        if until is not None and fenced:
            submission.fence_at(until)
        return submission

    def _send_now(self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
                  until: float | None, request_id: str, loop: asyncio.AbstractEventLoop,
                  calls_until: float | None) -> Submission | bool:
        """Send a one-stage request from this thread, settled by its reply (see :meth:`submit`).

        ``until`` is the request's deadline, ``calls_until`` the bound its stage call gets
        (None where the deadline fences the request instead of interrupting it).

        Returns its submission; else True when the request is tracked and admitted but
        no stage slot is free now (a request thread takes it on), False when nothing
        was taken (no admission slot free now).
        """
        requests, admission = self.requests, self.admission
        # As _run: what the request holds is known from what is set at every point where
        # a Ctrl-C can act, and a Ctrl-C gives back what is set (_unsent), then is raised:
        # the tracking (begun first: ended there, unless DuplicateRequest refused it), the
        # admission slot and the placement (taken in one run of statements without a call,
        # serving set with them), the stage call once it is registered. Once the call's
        # end is handed to the loop (on_end), settle owns the request: it settles it
        # exactly once, and a Ctrl-C in it is raised once the request is whole.
        serving: Serving | None = None  # entered, its admission slot taken with it
        calls: list[PendingCall] = []  # the stage call, as its stage registers it
        answer = RequestAnswer(request_id)  # set by whoever ends the request
        submission = Submission(request_id, None, requests, until, admission.release, answer)
        # (a cell) True once settle began, or once an interrupt here gave the request back
        settling = False
        on_loop = threading.get_ident()
        try:
            requests.begin(request_id)  # DuplicateRequest: raised as submit raises it
            with self._admitting:  # a slot free now, with the placement: one section, as _run
                if admission.used >= admission.limit:  # none free now: nothing taken
                    requests.end(request_id)  # but the tracking
                    refusal = admission.refusal(None)
                    if isinstance(refusal, ResourceUnavailable):
                        return False
                    raise refusal  # (closed)
                # SlotPool.take_held and ServingLineup.enter_held, without their calls
                admission.used += 1
                epoch = self.epoch
                serving = self.lineup.current
                serving.holds += 1
            group = serving.direct
            assert group is not None  # one stage in every placement (checked by submit)
            pending = self._direct(group, inputs, params, calls_until, request_id, epoch,
                                   now=True, into=calls)
        except Exception as exc:
            if serving is None:  # refused before it was sent (nothing held)
                raise
            if isinstance(exc, StageClosed):  # no replica serves now: a request thread
                self.lineup.leave(serving, answered=False)  # waits for one
                return True
            for call in calls:  # (a call registered before the error: let go)
                call.abandon()
            _leave(self._admitting, self.lineup, admission, serving)
            requests.end(request_id)
            answer.fail(malformed_inputs(inputs) or exc)  # the request's own error
            return submission
        except BaseException:  # a Ctrl-C: what is held given back, then raised
            self._unsent(request_id, serving, calls)
            raise
        if pending is None:  # every stage slot is taken: a request thread waits for one
            self.lineup.leave(serving, answered=False)
            return True

        def settle() -> None:
            nonlocal settling
            if settling:  # settled already (called again after a Ctrl-C), or given back
                return
            settling = True  # (no point between the test and the store)
            result: PipelineResult | None = None
            try:
                latencies: dict[str, float] = {}
                final = pending.result()  # its end is here: nothing waits
                # (a request cancelled meanwhile delivers nothing: RequestCancelled)
                release, receipt = self._delivery(serving, final, epoch, request_id,
                                                  latencies, _NO_CARRY)
                # Made in two steps, as in _run: once __init__ ran to its end the result
                # holds the request (a result dropped gives it back through its drain)
                result = PipelineResult.__new__(PipelineResult)
                PipelineResult.__init__(result, final, latencies, release, (), receipt)
                requests.end(request_id)
                answer.deliver(result)  # (acknowledged there where it was fenced meanwhile)
            except Exception as exc:  # the request's own error
                if result is not None and result.made:  # its result holds it: delivered
                    self._settle_interrupted(request_id, pending, serving, answer, result)
                else:  # (not given back twice: review40c)
                    self._settle_failed(request_id, serving, answer, exc)
            except BaseException:  # a Ctrl-C: the request left whole, then raised
                self._settle_interrupted(request_id, pending, serving, answer, result)
                raise

        def ended() -> None:  # in the thread that read the reply (or ended the call)
            if not loop.is_running():  # stopped or closed: it may never settle it
                settle()
            else:  # on the loop's thread: after the channel's read, not inside it. Settled
                # once, whatever the loop does: where it is closed meanwhile, or stopped and
                # closed with settle still queued, here or in the thread that closes it
                call_soon_once(loop, settle, threadsafe=threading.get_ident() != on_loop)

        try:
            on_end = getattr(getattr(pending.stage, "loaded", None), "on_end", None)
            if on_end is not None:
                if not on_end(pending.request_id, ended, loop):
                    ended()  # its end was read before the callback could be set: nothing waits
            else:  # The stage cannot call back: a request thread waits for its reply.
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        self.config.admission, thread_name_prefix=f"edge-{self.config.name}")
                self._executor.submit(settle)
        except BaseException:  # a Ctrl-C before settle began: given back here, then raised
            if not settling:
                settling = True  # (no point between the test and the store)
                self._unsent(request_id, serving, calls)
            raise
        return submission

    def _unsent(self, request_id: str, serving: Serving | None,
                calls: list[PendingCall]) -> None:
        """Give back what a request :meth:`_send_now` was sending holds (a Ctrl-C came).

        Its stage call, if registered, is abandoned (read to its end by whichever thread
        reads the channel, its slot given back then; never cancelled), then its placement
        and its admission slot, then its tracking (begun first: a Ctrl-C as begin began
        leaves none, and ends none but a request of the same id begun meanwhile).
        """
        for call in calls:
            call.abandon()
        if serving is not None:
            _leave(self._admitting, self.lineup, self.admission, serving)
        self.requests.end(request_id)

    def _settle_failed(self, request_id: str, serving: Serving, answer: RequestAnswer,
                       error: Exception) -> None:
        """Give back what a request that failed on the loop held, then answer its error.

        Its placement and admission slot, then its tracking, each once: a Ctrl-C in it
        runs it again to its end, then is raised.
        """
        left: list[bool] = []
        ended: list[bool] = []
        try:
            _leave_once(self._admitting, self.lineup, self.admission, serving, left)
            self.requests.end(request_id, ended)
            answer.fail(error)
        except BaseException:
            _leave_once(self._admitting, self.lineup, self.admission, serving, left)
            self.requests.end(request_id, ended)
            answer.fail(error)
            raise

    def _settle_interrupted(self, request_id: str, pending: PendingCall, serving: Serving,
                            answer: RequestAnswer, result: PipelineResult | None) -> None:
        """Leave a request whole whose settle on the loop a Ctrl-C cut short.

        Its result, once made, holds its slots: its tracking is ended and it is delivered
        (unless the answer holds it already). Else (cut short as its reply was taken, or
        its result made) its stage call is abandoned (its slot given back as :meth:`run`
        gives it back), then its placement and admission slot, and its answer is
        ``RequestCancelled``. The tracking is ended before the answer is set: ended again
        unless the answer holds the result (cut short as the end returned, that ends none
        but a request of the same id another thread began in that instant).
        """
        if result is not None and result.made:
            if not answer.holds(result):
                self.requests.end(request_id)
                answer.deliver(result)  # (acknowledged there where the answer was set)
            return
        pending.abandon()
        _leave(self._admitting, self.lineup, self.admission, serving)
        self.requests.end(request_id)
        answer.fail(RequestCancelled(f"request {request_id!r}: interrupted (Ctrl-C) as its "
                                     "reply was settled"))

    def check_params(self, params: Mapping[str, Any] | None) -> None:
        """Refuse, before admission, parameters the stage can tell are the request's fault.

        Where the caller's parameters reach the final stage as they are — a pipeline of
        one stage (a transform before a later stage merges its own over them) — and that
        stage's handle has the optional ``check_params(params)``
        (:class:`edge_core.stage.LoadedStage`), it is called here: what it raises (the
        request's own fault, e.g. a prompt and ``max_tokens`` that cannot fit a
        generate stage's context) is raised before any admission slot, stage slot or
        worker is touched. :meth:`run`, :meth:`stream` and :meth:`submit` call it first.
        """
        lone = self.lineup.current.lone  # (run and submit have the same lines: no call)
        if lone is not None and (check := getattr(lone.loaded, "check_params", None)) is not None:
            check(dict(params or {}))

    def health(self) -> dict[str, Any]:
        """The pipeline's health, each stage runtime's and how many replicas serve.

        Replica r > 0 is named ``stage#r`` (see :func:`~.health.pipeline_health`);
        ``memory`` compares each stage's peak so far with its declared demand
        (:func:`~.memory_check.memory_report`).
        """
        health = pipeline_health(self.config.name, self.closed,
                                 [s.health() for s in self.stages],
                                 {g.stage_id: g.summary() for g in self._groups})
        record = self.policy.plan_record()
        background = record.get("background") or {}
        health["placement"] = {"number": self.lineup.current.number,
                               "decision": record.get("decision"),
                               "switches": record.get("switches") or [],
                               "background": background.get("state")}
        health["memory"] = memory_report(self._slots)
        return health

    def cancel(self) -> dict[str, str]:
        """Cancel everything in flight; stage id (``stage#r`` for replica r > 0) → outcome.

        The pipeline's own epoch is bumped first, so a request between two stages is
        stopped before its next submission; then every stage is fenced and asked to stop
        (one stage failing to stop does not keep the others from being fenced). Last,
        the ``on_event`` of every request it cancelled (those that started under an
        older epoch) is closed off, as :meth:`Submission.cancel` closes its own: once
        this returns none is running and none is called again (a request still waiting
        for admission starts under the new epoch and is not cancelled).
        """
        with self._admitting:  # (as requests read it: see _run)
            self.epoch += 1
            epoch = self.epoch
        answers: dict[str, str] = {}
        for stage in [*self.policy.finishing(), *self._slots]:
            if stage.runtime is None:
                continue
            try:
                answers[stage.runtime.name] = stage.runtime.cancel().value
            except Exception as exc:
                answers[stage.runtime.name] = f"failed: {type(exc).__name__}: {exc}"
        for gate in self._open_gates():
            if gate.epoch is not None and gate.epoch < epoch:
                gate.close()
        return answers

    def _open_gates(self) -> list[EventGate]:
        """The gates of the submitted requests that still have one."""
        while True:
            try:
                with self._gates_lock:
                    return list(self._gates)
            except RuntimeError:  # one collected in another thread as they were listed
                continue

    async def acancel(self) -> dict[str, str]:
        """:meth:`cancel` for asyncio code."""
        import asyncio

        return await asyncio.to_thread(self.cancel)

    # -- closing -----------------------------------------------------------------------

    def close(self) -> dict[str, Any]:
        """Retire every stage and settle each reservation in reverse order (idempotent).

        Serving stops first (admission, the request threads, the policy's background work
        and what it held: :meth:`SelectionPolicy.stop`); then the stages' workers are
        retired at once (:func:`~edge_core.runtime.stage_runtime.close_all`: each verified
        as always, so the close costs the slowest one, not the sum). A stage whose
        retirement raises is reported, and its reservation quarantined; the other stages
        are still retired. An interruption (Ctrl-C, SIGTERM) anywhere in it cuts nothing
        short: as serving stops, as the stages retire or as they are settled, the step it
        came in is run to its end, every stage is retired and settled, then it is raised
        (and no summary returned); a second one meanwhile is ignored by the command line
        (it is the exception in flight: :mod:`edge_core.cli`). So is an error of the
        policy's stop: raised once every stage is retired and settled.

        Returns:
            Stage id (``stage#r`` for replica r > 0) → {"retire": outcome, "release":
            released / quarantined / none}.
        """
        summary: dict[str, Any] = {}
        self.closed = True
        self._delivery_parts = None  # (its placement's slots go with the stages)
        try:
            self._stop_serving()
        except BaseException:  # before any stage retired: each is, before it goes on
            with contextlib.suppress(Exception):  # the step it cut short, to its end
                self._stop_serving()
            self._retire_stages(summary)
            raise
        self._retire_stages(summary)
        return summary

    def _stop_serving(self) -> None:
        """End admission, the request threads and the background work (idempotent).

        Run again after an interruption: each step ends where it already ended (the
        background thread is joined again, what it held retired once).
        """
        # a request waiting for admission ends now, refused as any after the close is
        self.admission.close("closed", named=self._where)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.policy.stop()  # background opening and measuring end, what they held retired

    def _retire_stages(self, summary: dict[str, Any]) -> None:
        """Retire every stage at once, settle each in reverse order; fill ``summary``.

        An interruption that came as they retired (handed back by ``close_all``) is raised
        once all are settled; one as they are settled lets the rest be settled first.
        """
        finishing = self.policy.finishing()  # switched out, still waiting for requests
        stages = list(reversed([*finishing, *self._slots]))
        # every stage's worker retired at once; each settled below, in reverse order
        outcomes, interrupted = close_all([stage.runtime for stage in stages])
        try:
            if interrupted is not None:  # Ctrl-C, SIGTERM: raised once all is settled
                raise interrupted
        finally:  # while it is in flight, a second one is ignored (edge_core.cli)
            pending = list(zip(stages, outcomes, strict=True))
            try:
                while pending:
                    self._settle_stage(*pending[0], finishing, summary)
                    del pending[0]
            except BaseException:  # came as one was settled: the rest are settled too
                for stage, outcome in pending:  # the first again (its settle cut short)
                    self._settle_stage(stage, outcome, finishing, summary,
                                       again=stage is pending[0][0])
                raise
            finally:
                self.closed = True
            self._heal_on_close(summary)

    def _settle_stage(self, stage: StageSlot, outcome: Any, finishing: list[StageSlot],
                      summary: dict[str, Any], *, again: bool = False) -> None:
        """Settle one retired stage's reservation by its outcome; its ``summary`` entry.

        ``again``: its settle was interrupted (:meth:`StageSlot.settle`'s ``again``).
        """
        if isinstance(outcome, BaseException):
            outcome = UnverifiedRetirement(f"retire failed: {type(outcome).__name__}: {outcome}")
        if stage.token is not None:
            stage.settle(self.ledger, outcome, again=again)
        name = f"{stage.name}~{stage.candidate}" if stage in finishing else stage.name
        summary[name] = {
            "retire": (outcome.to_dict()
                       if outcome is not None and hasattr(outcome, "to_dict") else outcome),
            "release": stage.release_outcome,
        }

    def _heal_on_close(self, summary: dict[str, Any]) -> None:
        """Release every quarantine whose recorded tree is gone (waiting a bounded time)."""
        if not self.ledger.quarantined():
            return
        owners = {stage.owner: stage for stage in self._slots}
        for token in self.ledger.heal("close", wait_s=CLOSE_HEAL_WAIT_S):
            stage = owners.get(token.owner)
            if stage is not None:
                stage.release_outcome = "released"
                summary[stage.name]["release"] = "released"
                summary[stage.name]["healed_by"] = "close"

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reporting ------------------------------------------------------------------------

    def execution_plan(self) -> dict[str, Any]:
        """The JSON execution plan: identities, route, reservations, placement, numerics."""
        plan = execution_plan(self.config, self._slots, self.opened_at, self.ledger,
                              self.candidates)
        plan["selection"] = self.policy.plan_record()
        return plan
