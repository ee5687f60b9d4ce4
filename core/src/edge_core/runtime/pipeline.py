"""A whole pipeline: admitted, loaded and gated as one plan, served as a linear chain.

:meth:`Pipeline.open` runs the flow of DESIGN.md: resolve each stage's backend (an
unavailable one is refused with its probe's reason) → check the topology → reserve every
stage's demands on every pool at once → load each stage → warm-up placement gate,
numerical check and observed-memory check. Any failure unwinds in reverse — retire the
started workers, release their reservations (or quarantine them when retirement was not
verified) — and re-raises the first error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import attrs

from edge_core.binding import OwnerBinding, backend_table, bind_owner
from edge_core.config.model import PipelineConfig, StageConfig
from edge_core.config.transforms import resolve_input_transform
from edge_core.errors import BackendUnavailable, EdgeError, StageClosed
from edge_core.ledger import ReservationToken, ResourceLedger
from edge_core.placement import PlacementPolicy, WarmupReport, check_placement
from edge_core.plugins import PluginSet
from edge_core.runtime.candidates import open_stages, reload_in_order
from edge_core.runtime.chain import (
    CARRY_PREFIX,
    GatheredCall,
    Transform,
    run_chain,
    split_carry,
    with_bundles,
)
from edge_core.runtime.errors import DemandExceeded, NumericsRefused, RequestCancelled
from edge_core.runtime.flow import SlotPool, take_slot
from edge_core.runtime.gate import check_buckets
from edge_core.runtime.health import RestartMode, RestartPolicy, pipeline_health
from edge_core.runtime.independent import run_references
from edge_core.runtime.pipeline_result import PipelineResult, _Unverified
from edge_core.runtime.plan import execution_plan
from edge_core.runtime.replicas import ReplicaSet
from edge_core.runtime.stage_runtime import PendingCall, StageRuntime
from edge_core.runtime.submission import OnEvent, RequestTracker, Submission, submit
from edge_core.runtime.topology import check_linear_chain
from edge_core.stage import RETIRE_OUTCOME_ATTR, LoadedStage, StageContext

__all__ = ["CARRY_PREFIX", "Pipeline", "PipelineResult", "Transform", "split_carry"]

PROBE_TIMEOUT_S = 10.0

CLOSE_HEAL_WAIT_S = 2.0
"""How long ``close()`` waits for a quarantined worker tree that was just killed to go."""


class _Stage:
    """Everything the pipeline keeps per stage while opening and serving."""

    def __init__(self, config: StageConfig, binding: OwnerBinding, context: StageContext,
                 transform: Transform | None) -> None:
        self.config = config
        self.binding = binding
        self.context = context
        self.transform = transform
        self.token: ReservationToken | None = None
        self.demands: Mapping[str, int] = {}
        self.runtime: StageRuntime | None = None
        self.warmup: WarmupReport | None = None
        self.observed: Mapping[str, int] = {}
        self.memory_check: dict[str, str] = {}
        self.release_outcome: str | None = None
        #: The independent reference run's record (``reference_backend``), if any.
        self.reference: dict[str, Any] | None = None


def _name(stage: _Stage) -> str:
    """A stage's name in reports: its id, ``stage#r`` for replica r > 0."""
    replica = f"#{stage.context.replica}" if stage.context.replica else ""
    return f"{stage.context.stage_id}{replica}"


def _owner(stage: _Stage) -> str:
    """The ledger owner of a stage: ``pipeline/stage``, ``pipeline/stage#r`` for replica r > 0.

    Pipelines may share a ledger.
    """
    return f"{stage.context.pipeline}/{_name(stage)}"


def _groups(stages: list[_Stage]) -> list[ReplicaSet]:
    """The replicas of each configured stage, in data-flow order."""
    by_id: dict[str, list[StageRuntime]] = {}
    for stage in stages:
        assert stage.runtime is not None
        by_id.setdefault(stage.context.stage_id, []).append(stage.runtime)
    return [ReplicaSet(runtimes) for runtimes in by_id.values()]


def _settle(ledger: ResourceLedger, token: ReservationToken | None, outcome: Any) -> str:
    """Release a reservation after retirement; quarantine it when retirement is unverified."""
    if token is None:
        return "none"
    verified = bool(getattr(outcome, "verified", outcome is None))
    reason = getattr(outcome, "reason", None)
    # the identities of the worker's tree, re-checked by ledger.heal() if quarantined
    tree = [p for p in getattr(outcome, "tree", ()) if callable(getattr(p, "is_alive", None))]
    return ledger.release(token, verified=verified, reason=reason, processes=tree).value


class Pipeline:
    """An admitted, loaded, gated pipeline. Open with :meth:`open`; close with :meth:`close`."""

    def __init__(self, config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger,
                 stages: list[_Stage]) -> None:
        self.config = config
        self.plugins = plugins
        self.ledger = ledger
        self._stages = stages
        self._groups: list[ReplicaSet] = []
        self._transforms: list[Transform | None] = []
        self.admission = SlotPool(config.admission, f"pipelines[{config.name}].admission")
        self._where = f"pipelines[{config.name}]"  # names the pipeline in refusals
        self.requests = RequestTracker(config.name)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._ids = iter(range(1, 1 << 62))
        self.epoch = 0
        self.opened_at = time.time()
        self.closed = False
        self.candidates: dict[str, list[dict[str, Any]]] = {}
        """Stage id → each candidate tried at open (or the last restart), in order."""

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        config: PipelineConfig,
        plugins: PluginSet,
        ledger: ResourceLedger,
        *,
        progress: Callable[[str], None] | None = None,
        retire_deadline_s: float = 5.0,
    ) -> Pipeline:
        """Resolve, check, reserve, load and gate every stage; unwind on any failure.

        Raises:
            BackendUnavailable: a stage's backend is not installed or its probe says no.
            TopologyRefused: the stages are not a linear chain.
            ResourceUnavailable: the plan does not fit the ledger (nothing is charged).
            PlacementRefused / NumericsRefused / DemandExceeded: a stage failed its gate.
            Any error from a plugin's load or warm-up, after unwinding.
        """
        say = progress or (lambda _message: None)
        if any(stage.candidates for stage in config.stages):
            pipeline = cls(config, plugins, ledger, [])
            return pipeline._serving(open_stages(pipeline, say, retire_deadline_s),
                                     retire_deadline_s)
        stages = [replica for index in range(len(config.stages))
                  for replica in cls._resolve(config, index, plugins)]
        check_linear_chain(config)
        plan: dict[str, Mapping[str, int]] = {}
        for stage in stages:
            stage.demands = dict(stage.binding.reserve(stage.context))
            plan[_owner(stage)] = stage.demands
        tokens = ledger.reserve_plan(plan)
        for stage in stages:
            stage.token = tokens[_owner(stage)]
        pipeline = cls(config, plugins, ledger, stages)
        started: list[_Stage] = []
        try:
            for stage in stages:
                started.append(stage)
                pipeline._start(stage, say, retire_deadline_s)
        except BaseException:
            pipeline._unwind(started, stages)
            raise
        return pipeline._serving(stages, retire_deadline_s)

    def _serving(self, stages: list[_Stage], retire_deadline_s: float) -> Pipeline:
        self._stages = stages
        try:  # after every gate passed; a reference that fails only withholds a label
            run_references(self, stages, retire_deadline_s)
        except BaseException:
            self.close()
            raise
        self._groups = _groups(stages)
        self._transforms = [with_bundles(s.transform, self.bundle_directories)
                            for s in stages if s.context.replica == 0]
        return self

    def _start(self, stage: _Stage, say: Callable[[str], None],
               retire_deadline_s: float) -> None:
        """Load one reserved stage, give it its runtime and run its gate."""
        say(f"loading stage {stage.context.stage_id} on {stage.binding.backend.name}")
        try:
            loaded = stage.binding.load(stage.context)
        except BaseException as error:
            # A plugin that retired its own worker while failing says how that went.
            outcome = getattr(error, RETIRE_OUTCOME_ATTR, None)
            if outcome is not None:
                stage.release_outcome = _settle(self.ledger, stage.token, outcome)
                stage.token = None
            raise
        stage.runtime = self._runtime_for(stage, loaded, retire_deadline_s)
        say(f"warming up stage {stage.context.stage_id}")
        self._gate(stage, loaded)

    @staticmethod
    def _resolve(config: PipelineConfig, index: int, plugins: PluginSet,
                 stage: StageConfig | None = None, path: str | None = None) -> list[_Stage]:
        """The replicas of stage ``index`` on ``stage`` (a candidate; default: its own)."""
        stage = stage or config.stages[index]
        path = path or f"stages[{index}]"
        owner = backend_table(plugins).get(stage.backend.name)
        if owner is None:
            bind_owner(plugins, stage.backend.name)  # raises, naming what is installed
        assert owner is not None
        answer = plugins.probe(owner[1], timeout_s=PROBE_TIMEOUT_S)
        if answer.error:
            raise BackendUnavailable(
                f"{path}.backend.name: probe of plugin {owner[1]!r} failed "
                f"({answer.error}): {stage.backend.name!r}"
            )
        report = next((r for r in answer.result or () if r.backend == stage.backend.name), None)
        if report is None or not report.available:
            reason = report.reason if report is not None else "the probe did not report it"
            raise BackendUnavailable(f"{path}.backend.name: unavailable: {reason}: "
                                     f"{stage.backend.name!r}")
        binding = bind_owner(plugins, stage.backend.name)
        options = stage.backend.validated
        if options is None:
            defaults = binding.config_defaults(stage.backend.name) or {}
            options = binding.validate_stage(
                stage.backend.name, {**defaults, **dict(stage.backend.options)},
                f"{path}.backend.options",
            )
        manifest = stage.manifest
        manifest_dir = (manifest if manifest is None or manifest.is_dir() else manifest.parent)
        context = StageContext(
            pipeline=config.name, stage_id=stage.id, backend=stage.backend.name,
            options=options, manifest_dir=Path(manifest_dir) if manifest_dir else None,
            route=stage.backend.route, max_io_bytes=stage.max_io_bytes,
            placement=stage.placement.to_policy(),
            declared_demands=dict(stage.resources.demands), generation=1,
            shapes=tuple(stage.shapes),
        )
        transform = None
        if stage.input_transform is not None:
            transform = resolve_input_transform(stage.input_transform,
                                                f"{path}.input_transform")
        return [_Stage(stage, binding, attrs.evolve(context, replica=replica),
                       cast("Transform | None", transform))
                for replica in range(stage.replicas)]

    def _runtime_for(self, stage: _Stage, loaded: LoadedStage,
                     retire_deadline_s: float) -> StageRuntime:
        def settle(outcome: Any) -> None:
            stage.release_outcome = _settle(self.ledger, stage.token, outcome)
            stage.token = None

        def reload(generation: int) -> LoadedStage:
            return reload_in_order(self, stage, generation)

        limit = getattr(loaded, "max_in_flight", None)
        config = stage.config
        policy = RestartPolicy(RestartMode(config.restart), config.max_restarts,
                               config.restart_backoff_s)
        return StageRuntime(stage.binding, stage.context, loaded, on_retired=settle,
                            reload=reload, retire_deadline_s=retire_deadline_s,
                            max_in_flight=limit if isinstance(limit, int) else None,
                            call_timeout_s=config.call_timeout_s, policy=policy)

    def _gate(self, stage: _Stage, loaded: LoadedStage) -> None:
        sid = stage.context.stage_id
        report = stage.binding.warmup_placement(loaded)
        if not isinstance(report, WarmupReport):
            raise EdgeError(f"stages[{sid}]: edge_warmup_placement returned {report!r}, "
                            "not a WarmupReport")
        stage.warmup = report
        policy = stage.context.placement
        if policy.target is None:
            policy = PlacementPolicy(target=report.placement.target,
                                     min_fraction_on_target=policy.min_fraction_on_target,
                                     allowed_providers=policy.allowed_providers)
        if report.placement.target != policy.target:
            raise EdgeError(f"stages[{sid}].placement.target: the backend reported on "
                            f"{report.placement.target!r}: {policy.target!r}")
        check_placement(sid, report.placement, policy)
        check_buckets(sid, report, policy)
        numerics = report.numerics
        if numerics is not None and not numerics.get("passed", False):
            raise NumericsRefused(
                f"stages[{sid}].numerics: outputs differ from the {numerics.get('reference')} "
                f"reference beyond the bound {numerics.get('bound')}: "
                f"max_abs_error={numerics.get('max_abs_error')}, "
                f"normalised_error={numerics.get('normalised_error')}"
            )
        stage.observed = dict(loaded.observed_memory())
        # A demanded pool the backend observes nothing of (VRAM, say) is not checked: the
        # plan records it as "unobserved", never as passed.
        stage.memory_check = {pool: "checked" if pool in stage.observed else "unobserved"
                              for pool in stage.demands}
        for pool, peak in stage.observed.items():
            demand = stage.demands.get(pool)
            if demand is not None and peak > demand:
                raise DemandExceeded(
                    f"stages[{sid}].resources.demands[{pool!r}]: observed peak {peak} bytes "
                    f"after load and warm-up exceeds the demand: {demand}"
                )

    def _reload(self, stage: _Stage, generation: int) -> LoadedStage:
        """Restart one stage: reserve again, load under ``generation`` and re-run the gate."""
        stage.context = attrs.evolve(stage.context, generation=generation)
        self.ledger.heal("restart")  # a quarantine whose tree is gone by now is released
        if stage.token is None:
            stage.token = self.ledger.reserve(_owner(stage), stage.demands)
        loaded: LoadedStage | None = None
        try:
            loaded = stage.binding.load(stage.context)
            self._gate(stage, loaded)
        except BaseException as error:
            outcome = (stage.binding.retire(loaded, 5.0) if loaded is not None
                       else getattr(error, RETIRE_OUTCOME_ATTR, None))
            stage.release_outcome = _settle(self.ledger, stage.token, outcome)
            stage.token = None
            raise
        return loaded

    def _unwind(self, started: list[_Stage], stages: list[_Stage]) -> None:
        for stage in reversed(started):
            outcome = None
            try:
                if stage.runtime is not None:
                    outcome = stage.runtime.close()
            except Exception as exc:  # keep unwinding; the first error is re-raised
                outcome = _Unverified(f"retire failed: {type(exc).__name__}: {exc}")
            stage.release_outcome = _settle(self.ledger, stage.token, outcome)
            stage.token = None
        for stage in stages:
            if stage.token is not None:  # reserved but never started: nothing to retire
                stage.release_outcome = _settle(self.ledger, stage.token, None)
                stage.token = None

    # -- serving ---------------------------------------------------------------------------

    @property
    def stages(self) -> list[StageRuntime]:
        """The stage runtimes, in data-flow order."""
        return [s.runtime for s in self._stages if s.runtime is not None]

    def bundle_directories(self) -> dict[str, Path | None]:
        """Stage id → the directory its worker loaded the verified bundle from (or None)."""
        found: dict[str, Path | None] = {}
        for s in self._stages:
            bundle = getattr(s.runtime.loaded, "bundle", None) if s.runtime else None
            found[s.context.stage_id] = getattr(bundle, "directory", None)
        return found

    def stage(self, stage_id: str) -> StageRuntime:
        """One stage's runtime by id."""
        for s in self._stages:
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
        self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
        until: float | None, request_id: str | None = None,
    ) -> tuple[PendingCall | GatheredCall, dict[str, float], dict[str, Any]]:
        """Run every stage but the last to completion; submit the last and return it.

        ``until`` (monotonic) bounds every stage call; ``request_id`` is the request's id
        on every stage, tracked so that :meth:`Submission.cancel` finds it.
        """
        epoch = self.epoch
        return run_chain(self._groups, self._transforms, inputs, params=params,
                         until=until, cancelled=lambda: self.epoch != epoch,
                         where=self._where,
                         request_id=request_id, tracker=self.requests)

    def run(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
            deadline_s: float | None = None) -> PipelineResult:
        """Run one request through every stage; acknowledge the result when done with it.

        Args:
            inputs: The first stage's inputs (name to array).
            params: Request parameters for the final stage (e.g. sampling parameters).
            deadline_s: Bound on the whole request, from now to its result, waiting for
                admission and in-flight slots included. Without it a full pipeline or
                stage refuses at once (``ResourceUnavailable``), and each stage call is
                still bounded by its stage's ``call_timeout_s``.

        Raises:
            DeadlineExceeded: the deadline (or a stage's ``call_timeout_s``) expired; a
                preemptible stage cancelled the call in place, a non-preemptible one had
                its worker retired and is ``failed``.
            WorkerUnresponsive / WorkerGone: the worker stopped answering or died.
            RequestTooLarge: the inputs exceed a stage's ``max_io_bytes``.
        """
        until = None if deadline_s is None else time.monotonic() + deadline_s
        return self._run(inputs, params, until, None)

    def _run(self, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
             until: float | None, request_id: str | None, admitted: bool = False,
             on_event: OnEvent | None = None) -> PipelineResult:
        if not admitted:
            take_slot(self.admission, until)
        epoch = self.epoch
        try:
            pending, latencies, carry = self._chain(inputs, params, until, request_id)
            if on_event is not None:
                for event, tensors in pending.events():
                    on_event(event, tensors)
            final = pending.result()
            if self.epoch != epoch or (  # cancelled while the last stage ran: deliver nothing
                    request_id is not None and self.requests.cancelled(request_id)):
                final.ack()
                raise RequestCancelled(f"pipelines[{self.config.name}]: cancelled")
            final.outputs.update(carry)
        except BaseException:
            self.admission.release()
            raise
        latencies[self._stages[-1].context.stage_id] = final.latency_s
        return PipelineResult(final, latencies, self.admission.release)

    def stream(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
               deadline_s: float | None = None) -> Iterator[tuple[Any, Mapping[str, Any]]]:
        """Run the chain and yield the final stage's non-terminal events (tokens) as they come.

        The admission slot is held until the stream ends; the final result is acknowledged
        when the generator finishes or is closed. ``deadline_s`` bounds the whole stream
        (see :meth:`run`).
        """
        until = None if deadline_s is None else time.monotonic() + deadline_s
        take_slot(self.admission, until)
        try:
            pending, _, _ = self._chain(inputs, params, until)
            try:
                yield from pending.events()
            finally:
                if pending._result is not None:
                    pending._result.ack()
                elif not pending._done:
                    pending.cancel()
        finally:
            self.admission.release()

    async def arun(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
                   deadline_s: float | None = None) -> PipelineResult:
        """:meth:`run` for asyncio code (the blocking work runs in a worker thread)."""
        return await asyncio.to_thread(self.run, inputs, params=params, deadline_s=deadline_s)

    def submit(self, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
               deadline_s: float | None = None, request_id: str | None = None,
               on_event: OnEvent | None = None) -> Submission:
        """Submit one request; returns its :class:`Submission` (id, result, own cancel).

        Admission is taken here (at once, or waiting up to ``deadline_s``, which bounds
        the whole request as in :meth:`run`); the request then runs on one of the
        pipeline's request threads. See :func:`edge_core.runtime.submission.submit`.
        ``on_event(event, tensors)`` is called on that thread with each non-terminal
        event of the final stage (tokens) as it arrives, as :meth:`stream` yields them.
        ``Submission.cancel(interrupt=False)`` cancels it without ever retiring a worker
        (:mod:`edge_core.runtime.fence`).
        """
        if self.closed:
            raise StageClosed(f"pipelines[{self.config.name}]: closed")
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.config.admission, thread_name_prefix=f"edge-{self.config.name}")
        return submit(self._executor, self.requests, self.admission,
                      lambda until, rid: self._run(inputs, params, until, rid, admitted=True,
                                                   on_event=on_event),
                      request_id or f"{self.config.name}-{next(self._ids)}", deadline_s)

    def health(self) -> dict[str, Any]:
        """The pipeline's health, each stage runtime's and how many replicas serve.

        Replica r > 0 is named ``stage#r`` (see :func:`~.health.pipeline_health`).
        """
        return pipeline_health(self.config.name, self.closed,
                               [s.health() for s in self.stages],
                               {g.stage_id: g.summary() for g in self._groups})

    def cancel(self) -> dict[str, str]:
        """Cancel everything in flight; stage id (``stage#r`` for replica r > 0) → outcome.

        The pipeline's own epoch is bumped first, so a request between two stages is
        stopped before its next submission; then every stage is fenced and asked to stop
        (one stage failing to stop does not keep the others from being fenced).
        """
        self.epoch += 1
        answers: dict[str, str] = {}
        for stage in self._stages:
            if stage.runtime is None:
                continue
            try:
                answers[stage.runtime.name] = stage.runtime.cancel().value
            except Exception as exc:
                answers[stage.runtime.name] = f"failed: {type(exc).__name__}: {exc}"
        return answers

    async def acancel(self) -> dict[str, str]:
        """:meth:`cancel` for asyncio code."""
        return await asyncio.to_thread(self.cancel)

    # -- closing -----------------------------------------------------------------------

    def close(self) -> dict[str, Any]:
        """Retire every stage in reverse order and settle each reservation (idempotent).

        A stage whose retirement raises is reported, and its reservation quarantined; the
        other stages are still retired.

        Returns:
            Stage id (``stage#r`` for replica r > 0) → {"retire": outcome, "release":
            released / quarantined / none}.
        """
        summary: dict[str, Any] = {}
        self.closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for stage in reversed(self._stages):
            try:
                outcome = stage.runtime.close() if stage.runtime is not None else None
            except Exception as exc:
                outcome = _Unverified(f"retire failed: {type(exc).__name__}: {exc}")
            if stage.token is not None:
                stage.release_outcome = _settle(self.ledger, stage.token, outcome)
                stage.token = None
            summary[_name(stage)] = {
                "retire": (outcome.to_dict() if outcome is not None and hasattr(outcome, "to_dict")
                           else outcome),
                "release": stage.release_outcome,
            }
        self._heal_on_close(summary)
        self.closed = True
        return summary

    def _heal_on_close(self, summary: dict[str, Any]) -> None:
        """Release every quarantine whose recorded tree is gone (waiting a bounded time)."""
        if not self.ledger.quarantined():
            return
        owners = {_owner(stage): stage for stage in self._stages}
        for token in self.ledger.heal("close", wait_s=CLOSE_HEAL_WAIT_S):
            stage = owners.get(token.owner)
            if stage is not None:
                stage.release_outcome = "released"
                summary[_name(stage)]["release"] = "released"
                summary[_name(stage)]["healed_by"] = "close"

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reporting ------------------------------------------------------------------------

    def execution_plan(self) -> dict[str, Any]:
        """The JSON execution plan: identities, route, reservations, placement, numerics."""
        return execution_plan(self.config, self._stages, self.opened_at, self.ledger,
                              self.candidates)
