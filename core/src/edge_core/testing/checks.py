"""The conformance checks, as plain functions shared by the pytest plugin and the CLI.

Each check takes a prepared :class:`~edge_core.testing.subject.Subject` and returns a line
saying what it verified, or raises :class:`CheckFailed` / :class:`CheckSkipped` with the
reason. Every check that starts a worker goes through the real runtime
(:class:`~edge_core.runtime.Pipeline` on a :class:`~edge_core.ledger.ResourceLedger`)
and fails when it leaves a process, a shared-memory segment or a descriptor behind, or
leaves anything charged in the ledger.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from edge_contracts.sealed import held_sealed_names
from edge_contracts.shm import segment_names
from edge_core.backend import CancelOutcome
from edge_core.discovery import ENV_ALLOWLIST, ENV_STRICT, ENV_TRACE, check_contract
from edge_core.errors import EdgeError, ManifestInvalid, ResourceUnavailable, StageClosed
from edge_core.host.client import WorkerClient
from edge_core.host.probe_process import DROP_CWD, run_probe
from edge_core.host.retire import DEFAULT_RETIRE_DEADLINE_S
from edge_core.ledger import ResourceLedger
from edge_core.plugins import EdgePluginManager
from edge_core.pools import Pool, probe_host
from edge_core.runtime import Pipeline
from edge_core.runtime.errors import RequestCancelled
from edge_core.runtime.health import StageState
from edge_core.runtime.opener import resolve_slots
from edge_core.runtime.pipeline_files import default_ledger
from edge_core.runtime.restarts import RestartMode
from edge_core.runtime.results import AckOutcome
from edge_core.runtime.stage_runtime import StageRuntime
from edge_core.testing import channel
from edge_core.testing.harness import (
    WAIT_S,
    CheckFailed,
    CheckSkipped,
    bounded,
    compare_outputs,
    first_stage,
    gone,
    no_leftovers,
    opened,
    pipeline_config,
    run_once,
    shared,
    stage_of,
    track_prefixes,
    worker_identity,
)
from edge_core.testing.subject import Subject

__all__ = ["CHECKS", "HEAVY_MODULES", "PLUGIN_PROBE_ENV_NAMES",
           "PROBE_LIMIT_S", "SHARED_CHECKS", "STAGE_CHECKS", "CheckFailed",
           "CheckSkipped", "compare_outputs"]

#: A probe slower than this (seconds, in a fresh interpreter) fails the probe check.
PROBE_LIMIT_S = 5.0
#: Runtimes a controller process must never import to probe.
HEAVY_MODULES = ("onnxruntime", "torch", "vllm", "qai_hub", "tensorflow", "jax",
                 "transformers")


# -- static checks -------------------------------------------------------------------------


def contract_version(subject: Subject) -> str:
    """The plugin declares a hook-contract version this core supports."""
    record = subject.plugins.record(subject.plugin)
    problem = check_contract(record.contract)
    if problem:
        raise CheckFailed(problem)
    from edge_core.hookspecs import CONTRACT_VERSION

    return f"declares {record.contract}; this core implements {CONTRACT_VERSION}"


def hooks_have_specs(subject: Subject) -> str:
    """Pluggy's ``check_pending()`` finds no implementation without a specification."""
    import pluggy

    from edge_core import hookspecs

    manager = EdgePluginManager()
    manager.add_hookspecs(hookspecs)
    plugin = subject.plugins.manager.get_plugin(subject.plugin)
    manager.register(plugin, name=subject.plugin)
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        raise CheckFailed(f"hooks: implementation without a specification: {exc}") from None
    names = sorted(c.name for c in manager.hook.__dict__.values()
                   if isinstance(c, pluggy.HookCaller) and c.get_hookimpls())
    return f"{len(names)} hooks, each with a specification: {', '.join(names)}"


PLUGIN_PROBE_ENV_NAMES: tuple[str, ...] = (ENV_STRICT, ENV_TRACE)
"""What the fresh interpreter of :func:`probe_fast_and_light` takes from this process's
environment besides the probe allowlist (:mod:`edge_core.host.probe_process`): the plugin
loader's own settings. ``EDGE_PLUGINS`` is set to the plugin under test."""

# The first line drops sys.path[0] (the working directory, for ``-c``) as workers do:
# the probe sees the plugins ``edge`` itself would see, and nothing planted in the folder.
_PROBE_SCRIPT = DROP_CWD + """
import json, sys, time
plugin, module, source = sys.argv[1:4]
started = time.perf_counter()
from edge_core.plugins import load_plugins
plugins = load_plugins(local_modules=[module] if source == "config" else [])
loaded = time.perf_counter()
name = plugin if source != "config" else module
answer = plugins.call_one(name, "edge_probe")
probed = time.perf_counter()
problem = next((r.error for r in plugins.records if r.name == name), None)
heavy = json.loads(sys.argv[4])
print(json.dumps({"error": problem or answer.error, "load_s": loaded - started,
                  "probe_s": probed - loaded, "reports": len(answer.result or ()),
                  "heavy": sorted(m for m in heavy if m in sys.modules)}))
"""


def probe_fast_and_light(subject: Subject) -> str:
    """A fresh interpreter loads the plugin and probes it fast, importing no heavy runtime."""
    record = subject.plugins.record(subject.plugin)
    if record.source == "object":
        raise CheckSkipped(f"plugin {subject.plugin!r} was registered as an object: it cannot "
                           "be loaded in a fresh interpreter")
    argv = [sys.executable, "-c", _PROBE_SCRIPT, subject.plugin, record.module, record.source,
            json.dumps(HEAVY_MODULES)]
    try:
        done = run_probe(argv, timeout_s=WAIT_S, declared=PLUGIN_PROBE_ENV_NAMES,
                         values={ENV_ALLOWLIST: subject.plugin})
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"probe: no answer within the bound: {WAIT_S} s") from None
    if done.returncode != 0:
        raise CheckFailed(f"probe: the fresh interpreter failed: {done.stderr.strip()[-400:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["error"]:
        raise CheckFailed(f"probe: raised in a fresh interpreter: {found['error']}")
    if found["heavy"]:
        raise CheckFailed(f"probe: imported a heavy runtime in the controller: {found['heavy']}")
    if found["probe_s"] > PROBE_LIMIT_S:
        raise CheckFailed(f"probe: slower than {PROBE_LIMIT_S} s: {found['probe_s']:.3f} s")
    return (f"probe answered in {found['probe_s'] * 1e3:.0f} ms (plugins loaded in "
            f"{found['load_s'] * 1e3:.0f} ms) importing none of {list(HEAVY_MODULES)}")


# -- admission -----------------------------------------------------------------------------


def reserve_overcommit_refused(subject: Subject) -> str:
    """A two-stage plan that fits once but not twice is refused with nothing charged."""
    config = pipeline_config(subject)
    resolved = resolve_slots(config, subject.plugins, 0)[0]
    demands = {p: int(b) for p, b in resolved.binding.reserve(resolved.context).items()
               if int(b) > 0}
    if not demands:
        raise CheckSkipped("edge_reserve: the stage demands no memory: {}")
    pools = {pool.name: pool for pool in probe_host().pools}
    for name, need in demands.items():
        total = need + need // 2
        pools[name] = (attrs.evolve(pools[name], total=total, observed_by="conformance")
                       if name in pools else Pool(name=name, total=total,
                                                  observed_by="conformance"))
    ledger = ResourceLedger(pools.values())
    single = ledger.reserve_plan({"one": demands})["one"]  # one stage alone fits
    ledger.release(single)
    with no_leftovers("over-committed open"):
        try:
            pipeline = Pipeline.open(pipeline_config(subject, ("a", "b")), subject.plugins, ledger)
        except ResourceUnavailable as exc:
            refusal = str(exc)
        else:
            pipeline.close()
            raise CheckFailed(f"reserve: a plan of twice {demands} was admitted on pools "
                              f"sized {[(n, pools[n].total) for n in demands]}")
    charged = {name: ledger.reserved(name) for name in demands}
    if not ledger.is_empty() or any(charged.values()):
        raise CheckFailed(f"ledger: charged after the refusal: {charged}")
    return f"refused ({refusal}); nothing charged, no worker started"


def tampered_manifest_refused(subject: Subject) -> str:
    """A bundle whose file changed after its manifest was written is refused at load."""
    stage = stage_of(subject)
    bundle = stage.manifest_dir
    if bundle is None:
        raise CheckSkipped("stage.manifest: the stage has no artifact bundle: None")
    from edge_contracts.manifest import MANIFEST_FILENAME

    copy = stage.workdir / f"tampered-{time.monotonic_ns()}"
    shutil.copytree(bundle, copy)
    try:
        listed = json.loads((copy / MANIFEST_FILENAME).read_text(encoding="utf-8"))["files"]
        graph = json.loads((copy / MANIFEST_FILENAME).read_text(encoding="utf-8")).get(
            "metadata", {}).get("graph")
        victim = graph if graph in listed else max(listed,
                                                   key=lambda name: (copy / name).stat().st_size)
        data = bytearray((copy / victim).read_bytes())
        data[-1] ^= 0xFF
        (copy / victim).write_bytes(bytes(data))
        manifest = Path(str(stage.stage["manifest"]))
        target = copy if (stage.workdir / manifest).is_dir() or manifest.is_dir() \
            else copy / manifest.name
        config = pipeline_config(subject, stage={**dict(stage.stage), "manifest": str(target)})
        ledger = default_ledger(config, subject.plugins)
        with no_leftovers("tampered open"):
            try:
                pipeline = Pipeline.open(config, subject.plugins, ledger)
            except ManifestInvalid as exc:
                refusal = f"{type(exc).__name__}: {exc}"
            except EdgeError as exc:
                raise CheckFailed(f"load: refused, but not as an artifact failure: "
                                  f"{type(exc).__name__}: {exc}") from None
            else:
                pipeline.close()
                raise CheckFailed(f"load: a tampered bundle was loaded: {victim!r}")
        if not ledger.is_empty():
            raise CheckFailed(f"ledger: charged after the refusal: {ledger.snapshot()}")
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return f"one byte of {victim!r} flipped: {refusal[:200]}"


def missing_bundle_handled(subject: Subject) -> str:
    """A stage without its bundle is served or refused with a typed error, never a crash.

    The stage is opened without ``manifest`` (``StageContext.manifest_dir`` is ``None``);
    a refusal must be an ``EdgeError`` and leave nothing charged.
    """
    stage = stage_of(subject)
    if stage.manifest_dir is None:
        return "the conformance stage has no bundle: every stage check ran with manifest_dir None"
    bare = {key: value for key, value in dict(stage.stage).items() if key != "manifest"}
    config = pipeline_config(subject, stage=bare)
    ledger = default_ledger(config, subject.plugins)
    with no_leftovers("open without a bundle"):
        try:
            pipeline = Pipeline.open(config, subject.plugins, ledger)
        except EdgeError as exc:
            outcome = f"refused: {type(exc).__name__}: {exc}"
        except Exception as exc:
            raise CheckFailed(f"load without a bundle (manifest_dir None): crashed with "
                              f"{type(exc).__name__}: {exc}") from None
        else:
            pipeline.close()
            outcome = "served without a bundle"
    if not ledger.is_empty():
        raise CheckFailed(f"ledger: charged after the refusal: {ledger.snapshot()}")
    return outcome[:300]


# -- serving -------------------------------------------------------------------------------


def warmup_placement_consistent(subject: Subject) -> str:
    """The warm-up placement report is present and agrees with the declaration and run."""
    with shared(subject, "placement") as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        placement = plan["placement"]
        if not placement:
            raise CheckFailed("placement: no warm-up report in the execution plan: None")
        providers = {name: share["nodes"] for name, share in placement["providers"].items()}
        total = sum(providers.values())
        if total <= 0:
            raise CheckFailed(f"placement.providers: no node reported as run: {providers}")
        stray = sorted(set(providers) - set(placement["available_providers"]))
        if stray:
            raise CheckFailed(f"placement.providers: ran on providers the session did not "
                              f"have ({placement['available_providers']}): {stray}")
        declared = subject.info.providers
        if declared and placement["target"] not in declared:
            raise CheckFailed(f"placement.target: not among the backend's declared providers "
                              f"{list(declared)}: {placement['target']!r}")
        if not placement.get("method"):
            raise CheckFailed(f"placement.method: how the split was observed is not said: "
                              f"{placement.get('method')!r}")
        if not plan["worker"]:
            raise CheckFailed("worker: the execution plan does not name the worker: {}")
    return (f"target {placement['target']} ran {providers.get(placement['target'], 0)}/"
            f"{total} nodes, split {providers}, observed by {placement['method']}")


def calls_match_expected(subject: Subject) -> str:
    """Three requests each produce the expected outputs within the bound."""
    stage = stage_of(subject)
    if stage.expected is None:
        raise CheckSkipped("expected: the stage gives no expected outputs to compare: None")
    with shared(subject, "calls") as pipeline:
        for attempt in range(3):
            with run_once(first_stage(pipeline), subject) as result:
                problems = compare_outputs(result.outputs, result.data, stage.expected,
                                           stage.bound)
            if problems:
                raise CheckFailed(f"request {attempt + 1}: " + "; ".join(problems))
    return f"3 requests matched {sorted(stage.expected)} within {dict(stage.bound)}"


def stale_ack_frees_nothing(subject: Subject) -> str:
    """Acknowledgements with a wrong id, epoch, generation or serial free no slot."""
    with shared(subject, "stale ack") as pipeline:
        runtime = first_stage(pipeline)
        result = run_once(runtime, subject)
        key = result.key
        forged = [attrs.evolve(key, request_id=key.request_id + "-other"),
                  attrs.evolve(key, epoch=key.epoch + 1),
                  attrs.evolve(key, generation=key.generation + 1),
                  attrs.evolve(key, serial=key.serial + 1)]
        for fake in forged:
            if runtime.ack(fake) is not AckOutcome.STALE or runtime.outstanding != 1:
                raise CheckFailed(f"ack: a stale acknowledgement freed the slot: {fake}")
        if result.ack() is not AckOutcome.ACKNOWLEDGED or runtime.outstanding != 0:
            raise CheckFailed(f"ack: the matching acknowledgement did not free the slot: {key}")
        if result.ack() is not AckOutcome.STALE:
            raise CheckFailed(f"ack: a second acknowledgement was not stale: {key}")
    return "4 forged acknowledgements were stale and freed nothing; the real one freed 1 slot"


def cancel_finished_call(subject: Subject) -> str:
    """Cancelling a finished request answers already-finished and keeps the worker."""
    with shared(subject, "cancel finished") as pipeline:
        runtime = first_stage(pipeline)
        before = worker_identity(runtime)
        with run_once(runtime, subject) as result:
            request_id = result.key.request_id
        outcome = runtime.cancel(request_id)
        if outcome is not CancelOutcome.ALREADY_FINISHED:
            raise CheckFailed(f"cancel: a finished request was not already-finished: "
                              f"{outcome.value}")
        if runtime.state is not StageState.READY or worker_identity(runtime) != before:
            raise CheckFailed(f"cancel: the stage changed after cancelling finished work: "
                              f"{runtime.state.value}")
        run_once(runtime, subject).ack()
    return "already-finished; same worker served the next request"


#: An in-place cancel of a running request must take effect (the request ends
#: cancelled) this soon.
CANCEL_EFFECT_S = 1.0
#: After an in-place cancel, the next request must be served this soon (from the cancel).
NEXT_REQUEST_S = 2.0
#: A retire-required cancel ends the request by retiring its worker, whose graceful
#: shutdown waits up to a second for a busy worker first: bounded by the retire deadline.
RETIRE_EFFECT_S = DEFAULT_RETIRE_DEADLINE_S
#: How long the check lets the slow request run before it cancels it, one try each: a
#: try whose request had already finished (``already-finished``: on a loaded host the
#: sleep can outlast the request) says nothing of cancelling, so the next try cancels
#: sooner; a stage whose slow request finishes before every one of them fails the check.
CANCEL_AFTER_S = (0.1, 0.03, 0.0)


def cancel_running_call(subject: Subject) -> str:
    """A running request cancels as declared: in place (preemptible) or by retiring.

    Bounded in time: an in-place cancel takes effect within :data:`CANCEL_EFFECT_S` and
    the next request is served within :data:`NEXT_REQUEST_S` of it — a backend that
    declares itself preemptible but keeps running the cancelled request (its worker
    blocked in ``submit``, say) fails here; a retire-required cancel takes effect within
    :data:`RETIRE_EFFECT_S` (the worker's retirement).
    """
    stage = stage_of(subject)
    if not stage.has_slow_request:
        raise CheckSkipped("slow_inputs/slow_params: the stage gives no request slow enough "
                           "to cancel while running: None")
    preemptible = subject.info.preemptible
    with shared(subject, "cancel running") as pipeline:
        runtime = first_stage(pipeline)
        before = worker_identity(runtime)
        for after_s in CANCEL_AFTER_S:
            pending = runtime.submit(stage.slow_inputs or stage.inputs,
                                     params=stage.slow_params or stage.params)
            time.sleep(after_s)
            started = time.monotonic()
            outcome = bounded("cancel", pending.cancel)
            try:
                bounded("cancelled call", pending.result)
            except RequestCancelled:
                pass
            else:
                raise CheckFailed("cancel: the cancelled request still delivered a result")
            effect_s = time.monotonic() - started
            if outcome is not CancelOutcome.ALREADY_FINISHED:
                break
        else:
            raise CheckFailed(f"cancel: the slow request had finished before its cancel in "
                              f"every try (cancelled after {list(CANCEL_AFTER_S)} s): "
                              f"slow_inputs/slow_params must run longer")
        bound_s = CANCEL_EFFECT_S if preemptible else RETIRE_EFFECT_S
        if effect_s > bound_s:
            raise CheckFailed(f"cancel: took effect after {effect_s:.2f} s (bound {bound_s} s)")
        if preemptible:
            if outcome is not CancelOutcome.CANCELLED_IN_PLACE:
                raise CheckFailed(f"cancel: a preemptible backend did not cancel in place: "
                                  f"{outcome.value}")
            if runtime.state is not StageState.READY or worker_identity(runtime) != before:
                raise CheckFailed("cancel: the worker was replaced after an in-place cancel")
            run_once(runtime, subject).ack()
            served_s = time.monotonic() - started
            if served_s > NEXT_REQUEST_S:
                raise CheckFailed(
                    f"cancel: the next request was served {served_s:.2f} s after the cancel "
                    f"(bound {NEXT_REQUEST_S} s): the backend declares preemptible, but the "
                    "cancelled request kept its worker busy (does submit hand the work to "
                    "another thread?)")
            return (f"cancelled in place in {effect_s * 1e3:.0f} ms; the same worker served "
                    f"the next request {served_s:.2f} s after the cancel")
        if outcome is not CancelOutcome.RETIRE_REQUIRED:
            raise CheckFailed(f"cancel: a non-preemptible backend answered {outcome.value}, not "
                              "retire-required")
        retired = runtime.last_retire
        automatic = runtime.policy.mode is RestartMode.ON_FAILURE
        settled = ((StageState.NEEDS_RESTART, StageState.RESTARTING, StageState.READY)
                   if automatic else (StageState.NEEDS_RESTART,))
        if runtime.state not in settled or not getattr(retired, "verified", False):
            raise CheckFailed(f"cancel: worker not retired verifiably: {runtime.state}, "
                              f"{retired}")
        if not gone(before):
            raise CheckFailed(f"cancel: the retired worker still runs: {before}")
        retired_prefixes: set[str] = set()
        track_prefixes(runtime, retired_prefixes)
        leftover = [name for prefix in sorted(retired_prefixes)  # named or sealed (memfd)
                    for name in [*segment_names(prefix), *held_sealed_names(prefix)]]
        if leftover:
            raise CheckFailed(f"cancel: the retired worker's segments remain: {leftover}")
        if automatic:  # the declared policy restarts it: it serves again by itself
            generation = _restarted(runtime)
            run_once(runtime, subject).ack()
            return (f"retire-required; worker retired verified, restarted automatically "
                    f"(restart = on-failure), generation {generation} served the next request")
        try:
            runtime.submit(stage.inputs, params=stage.params)
        except StageClosed:
            pass
        else:
            raise CheckFailed("cancel: the stage took work before restart()")
        runtime.restart()
        run_once(runtime, subject).ack()
        return (f"retire-required in {effect_s:.2f} s; worker retired verified, stage refused "
                f"work until restart, generation {runtime.generation} served the next request")


def _restarted(runtime: StageRuntime, timeout_s: float = 120.0) -> int:
    """Wait for an automatic restart to bring the stage back; its new generation."""
    end = time.monotonic() + timeout_s
    while runtime.state is not StageState.READY:
        if runtime.state is StageState.FAILED or time.monotonic() > end:
            raise CheckFailed(f"cancel: the automatic restart did not bring the stage back: "
                              f"{runtime.state.value} ({runtime.closed_reason})")
        time.sleep(0.05)
    return runtime.generation


# -- teardown and the channel ----------------------------------------------------------------


def retire_verified(subject: Subject) -> str:
    """Closing retires the worker tree verifiably and leaves nothing behind."""
    with opened(subject, "retire") as pipeline:
        runtime = first_stage(pipeline)
        run_once(runtime, subject).ack()
        identity = worker_identity(runtime)
    if not gone(identity):
        raise CheckFailed(f"retire: the worker still runs after close: {identity}")
    escalation = getattr(runtime.last_retire, "escalation", "?")
    return (f"worker {identity[0] if identity else '?'} retired verified ({escalation}); "
            "no process, segment, descriptor or reservation left")


def _client(runtime: StageRuntime) -> WorkerClient:
    client = getattr(runtime.loaded, "client", None)
    if not isinstance(client, WorkerClient):
        raise CheckSkipped(f"loaded stage: not served through an edge WorkerClient: "
                           f"{type(runtime.loaded).__name__}")
    return client


def _await_lost(client: WorkerClient) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        health = client.health()
        if health.state != "ready":
            return str(health.reason)
        time.sleep(0.01)
    raise CheckFailed(f"channel: the malformed frame went unnoticed for {WAIT_S} s: ready")


def _expect_typed_failure(runtime: StageRuntime, subject: Subject) -> str:
    stage = stage_of(subject)
    try:
        bounded("call after the malformed frame",
                 lambda: runtime.submit(stage.inputs, params=stage.params).result())
    except EdgeError as exc:
        return f"{type(exc).__name__}: {exc}"
    raise CheckFailed("channel: a call succeeded on a channel that broke protocol")


def malformed_frame_from_worker(subject: Subject) -> str:
    """An oversized frame header written on the worker's end: typed failure, no hang."""
    stage = stage_of(subject)
    with opened(subject, "malformed from worker") as pipeline:
        runtime = first_stage(pipeline)
        client = _client(runtime)
        pending = None
        if stage.has_slow_request:
            pending = runtime.submit(stage.slow_inputs or stage.inputs,
                                     params=stage.slow_params or stage.params)
            time.sleep(0.1)
        try:
            channel.inject_from_worker(client, channel.oversized_header())
        except channel.InjectionUnavailable as exc:
            if pending is not None:
                pending.cancel()
            raise CheckSkipped(str(exc)) from None
        reason = _await_lost(client)
        if "protocol violation" not in reason:
            raise CheckFailed(f"channel: lost for another reason than the frame: {reason}")
        if pending is not None:
            try:
                bounded("in-flight call", pending.result)
            except RequestCancelled:
                raise CheckFailed("channel: the in-flight call was reported cancelled, not "
                                  "failed by the protocol violation: RequestCancelled") from None
            except EdgeError as exc:
                failure = f"in-flight call: {type(exc).__name__}"
            else:
                raise CheckFailed("channel: the in-flight call completed after the violation")
        else:
            failure = "next call: " + _expect_typed_failure(runtime, subject)[:120]
    return f"controller refused it ({reason[:120]}); {failure}; worker retired verified"


def malformed_frame_to_worker(subject: Subject) -> str:
    """An oversized frame header sent to the worker: it refuses it, the controller sees it."""
    with opened(subject, "malformed to worker") as pipeline:
        runtime = first_stage(pipeline)
        client = _client(runtime)
        channel.inject_to_worker(client, channel.oversized_header())
        reason = _await_lost(client)
        failure = _expect_typed_failure(runtime, subject)
    return f"worker closed its channel ({reason[:120]}); next call: {failure[:120]}"


#: Every check, in the order they run: name → function.
CHECKS: dict[str, Callable[[Subject], str]] = {
    "contract_version": contract_version,
    "hooks_have_specs": hooks_have_specs,
    "probe_fast_and_light": probe_fast_and_light,
    "reserve_overcommit_refused": reserve_overcommit_refused,
    "tampered_manifest_refused": tampered_manifest_refused,
    "missing_bundle_handled": missing_bundle_handled,
    "warmup_placement_consistent": warmup_placement_consistent,
    "calls_match_expected": calls_match_expected,
    "stale_ack_frees_nothing": stale_ack_frees_nothing,
    "cancel_finished_call": cancel_finished_call,
    "cancel_running_call": cancel_running_call,
    "retire_verified": retire_verified,
    "malformed_frame_from_worker": malformed_frame_from_worker,
    "malformed_frame_to_worker": malformed_frame_to_worker,
}

#: Checks that need the backend's conformance stage.
STAGE_CHECKS = frozenset(CHECKS) - {"contract_version", "hooks_have_specs",
                                     "probe_fast_and_light"}

#: Checks that run on the pipeline the previous check left open, when it shares one and
#: left it whole (:func:`~edge_core.testing.harness.shared`): they serve, acknowledge and
#: cancel requests, and each ends with its stage ready and nothing outstanding (a
#: retire-required cancel restarts the stage first). The others open their own: they
#: open another configuration, or retire, kill or break the worker on purpose.
SHARED_CHECKS = frozenset({"warmup_placement_consistent", "calls_match_expected",
                           "stale_ack_frees_nothing", "cancel_finished_call",
                           "cancel_running_call"})
