"""The harness the conformance checks run in: opening the stage, bounding waits, leaks.

Every helper goes through the real runtime; :func:`opened` fails a check whose stage
does not retire verifiably, leaves the ledger charged, or leaves a process, one of its
workers' shared-memory segments or a descriptor behind.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
import numpy as np
import psutil

from edge_core.config import load_pipeline
from edge_core.errors import EdgeError
from edge_core.host.client import WorkerClient
from edge_core.host.identity import described_identity, start_time
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline
from edge_core.runtime.health import StageState
from edge_core.runtime.pipeline_files import default_ledger
from edge_core.runtime.stage_runtime import StageRuntime
from edge_core.testing.conformance_stage import ConformanceStage
from edge_core.testing.leaks import Snapshot, leaks_since, snapshot
from edge_core.testing.subject import Subject

__all__ = ["SETTLE_S", "WAIT_S", "CheckFailed", "CheckSkipped", "OpenStage", "bounded",
           "compare_outputs", "first_stage", "gone", "no_leftovers", "open_stage", "opened",
           "pipeline_config", "pipeline_inputs", "run_once", "shared", "stage_of",
           "track_prefixes", "worker_identity"]

#: Bound on any single wait of the kit (a call, a cancel, a lost channel).
WAIT_S = 30.0

_T = TypeVar("_T")


class CheckFailed(EdgeError):
    """The backend does not conform; the message says where and why."""


class CheckSkipped(EdgeError):
    """The check cannot run on this backend here; the message says why."""


def pipeline_inputs(previous: Mapping[str, Any], inputs: Mapping[str, Any]) -> Mapping[str, Any]:
    """Input transform of the kit's chained stages: each stage gets the pipeline's inputs."""
    return inputs


def stage_of(subject: Subject) -> ConformanceStage:
    """The subject's conformance stage; skip the check when there is none."""
    if subject.stage is None:
        raise CheckSkipped(subject.stage_problem or "no conformance stage")
    return subject.stage


def pipeline_config(subject: Subject, ids: tuple[str, ...] = ("s",),
            stage: Mapping[str, Any] | None = None) -> Any:
    """The pipeline running the stage once per id (chained), optionally another table."""
    conformance = stage_of(subject)
    table = conformance.pipeline(ids)
    if stage is not None:
        table["stages"] = [{**dict(stage), "id": sid} for sid in ids]
    for later in table["stages"][1:]:
        later["input_transform"] = f"{__name__}:pipeline_inputs"
    return load_pipeline(table, base_dir=conformance.workdir)


def bounded(what: str, function: Callable[[], _T], timeout_s: float = WAIT_S) -> _T:
    """Run ``function`` in a thread; a hang becomes a failure instead of a stuck kit."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = function()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name=f"edge-conformance-{what}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CheckFailed(f"{what}: no answer within the bound: {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def track_prefixes(runtime: StageRuntime, prefixes: set[str]) -> None:
    """Remember the shared-memory producer prefixes of the stage's worker channel."""
    client = getattr(runtime.loaded, "client", None)
    if isinstance(client, WorkerClient):
        prefixes.update(client.shm_prefixes)


def _leftovers(what: str, before: Snapshot, prefixes: set[str] | None) -> None:
    """Fail when something appeared since ``before`` (see :func:`no_leftovers`)."""
    report = leaks_since(before)
    mine = tuple(name for name in report.segments
                 if any(name.startswith(f"edge_{p}_") for p in prefixes or ()))
    report = attrs.evolve(report, segments=mine)
    if report:
        raise CheckFailed(f"{what}: left behind: {report.describe()}")


@contextlib.contextmanager
def no_leftovers(what: str, prefixes: set[str] | None = None) -> Iterator[None]:
    """Fail when the block leaves a process, an edge segment or a descriptor behind.

    /dev/shm is machine-wide, so only segments of ``prefixes`` (the producers of the
    workers the block started) count: other processes' segments are not this backend's.
    """
    before = snapshot()
    yield
    _leftovers(what, before, prefixes)


#: How long :meth:`OpenStage.whole` waits for the worker channel to drop a delivered call.
SETTLE_S = 1.0


@attrs.define(eq=False)
class OpenStage:
    """An open conformance pipeline with what its close must verify.

    Attributes:
        what: The check using it now (named in a failure of its close).
        pipeline: The open pipeline.
        ledger: The ledger it was admitted on (empty again after the close).
        prefixes: The shared-memory producer prefixes of every worker it ran.
        before: What this process held before it was opened.
    """

    what: str
    pipeline: Pipeline
    ledger: ResourceLedger
    prefixes: set[str]
    before: Snapshot

    def track(self) -> None:
        """Remember the current workers' segment prefixes."""
        for runtime in self.pipeline.stages:
            track_prefixes(runtime, self.prefixes)

    def whole(self) -> bool:
        """Every stage ready, with nothing outstanding in the runtime or on the channel."""
        for runtime in self.pipeline.stages:
            if runtime.state is not StageState.READY or runtime.outstanding:
                return False
            client = getattr(runtime.loaded, "client", None)
            if isinstance(client, WorkerClient):
                end = time.monotonic() + SETTLE_S
                while (health := client.health()).state == "ready" and health.in_flight:
                    if time.monotonic() > end:
                        return False
                    time.sleep(0.01)
                if health.state != "ready":
                    return False
        return True

    def close(self) -> None:
        """Close it, requiring verified retirement, an empty ledger and no leftovers."""
        self.track()
        summary = self.pipeline.close()
        for stage_id, closed in summary.items():
            retire = closed.get("retire") or {}
            if not (isinstance(retire, Mapping) and retire.get("verified")):
                raise CheckFailed(f"{self.what}: stages[{stage_id}].retire: not verified: "
                                  f"{retire}")
        if not self.ledger.is_empty():
            raise CheckFailed(f"{self.what}: ledger: still charged after close: "
                              f"{self.ledger.snapshot()}")
        _leftovers(self.what, self.before, self.prefixes)

    def abandon(self) -> None:
        """Close it without judging the close (the check already failed or raised)."""
        self.pipeline.close()


def open_stage(subject: Subject, what: str) -> OpenStage:
    """Open the subject's stage on the host's ledger, recording what to verify at close."""
    before = snapshot()
    config = pipeline_config(subject)
    ledger = default_ledger(config, subject.plugins)
    pipeline = Pipeline.open(config, subject.plugins, ledger)
    stage = OpenStage(what=what, pipeline=pipeline, ledger=ledger, prefixes=set(),
                      before=before)
    stage.track()
    return stage


@contextlib.contextmanager
def _abandoned_if_raised(stage: OpenStage) -> Iterator[Pipeline]:
    """Lend the stage's pipeline to a block; one that raises has it closed unjudged, re-raised."""
    try:
        yield stage.pipeline
    except BaseException:
        stage.track()
        stage.abandon()
        raise


@contextlib.contextmanager
def opened(subject: Subject, what: str) -> Iterator[Pipeline]:
    """Open the stage on the host's ledger; close it, requiring verified retirement."""
    stage = open_stage(subject, what)
    with _abandoned_if_raised(stage) as pipeline:
        yield pipeline
    stage.close()


@contextlib.contextmanager
def shared(subject: Subject, what: str) -> Iterator[Pipeline]:
    """Like :func:`opened`, on the pipeline the previous check left open when there is one.

    The pipeline stays open after the block only when the runner said the next check
    shares it (``subject.share.keep_open``) and the block left it whole (see
    :meth:`OpenStage.whole`); otherwise it is closed here and judged as :func:`opened`
    judges it. A block that raises has the pipeline closed, never lent on.
    """
    share = subject.share
    held = share.take()
    stage = held if isinstance(held, OpenStage) else open_stage(subject, what)
    stage.what = what
    with _abandoned_if_raised(stage) as pipeline:
        yield pipeline
    stage.track()
    if share.keep_open and stage.whole():
        share.held = stage
        return
    stage.close()


def first_stage(pipeline: Pipeline) -> StageRuntime:
    """The pipeline's first stage runtime."""
    return pipeline.stages[0]


def compare_outputs(outputs: Mapping[str, Any], data: Mapping[str, Any],
                    expected: Mapping[str, Any], bound: Mapping[str, float]) -> list[str]:
    """Problems found comparing a result with the expected values (empty: it matches).

    Float arrays are compared within ``bound`` (``max_abs_error`` and
    ``normalised_error`` = L2(a - b) / L2(b)); other arrays and JSON values exactly. A name
    missing from the output tensors is looked up in the terminal event's data.
    """
    problems = []
    for name, want in expected.items():
        if name in outputs:
            got = outputs[name]
        elif name in data:
            got = data[name]
        else:
            problems.append(f"outputs.{name}: missing (got {sorted(outputs)}): None")
            continue
        if not isinstance(want, np.ndarray):
            if got != want:
                problems.append(f"outputs.{name}: differs from {want!r}: {got!r}")
            continue
        got = np.asarray(got)
        if got.shape != want.shape:
            problems.append(f"outputs.{name}.shape: expected {want.shape}: {got.shape}")
            continue
        if got.dtype != want.dtype:
            problems.append(f"outputs.{name}.dtype: expected {want.dtype}: {got.dtype}")
            continue
        if not np.issubdtype(want.dtype, np.floating):
            if not np.array_equal(got, want):
                problems.append(f"outputs.{name}: differs from the expected values exactly: "
                                f"{got.ravel()[:8].tolist()}")
            continue
        if bool(np.any(np.isnan(got) != np.isnan(want))):
            problems.append(f"outputs.{name}: NaN where the expected value has none (or the "
                            f"reverse): {int(np.isnan(got).sum())} NaN")
            continue
        diff = np.nan_to_num(got.astype(np.float64) - want.astype(np.float64), nan=0.0)
        max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
        scale = float(np.linalg.norm(np.nan_to_num(want.astype(np.float64))))
        normalised = float(np.linalg.norm(diff)) / scale if scale else max_abs
        if max_abs > bound["max_abs_error"] or normalised > bound["normalised_error"]:
            problems.append(f"outputs.{name}: beyond the bound {dict(bound)}: "
                            f"max_abs_error={max_abs:.3g}, normalised_error={normalised:.3g}")
    return problems


def run_once(runtime: StageRuntime, subject: Subject) -> Any:
    """Submit the stage's request and wait (bounded) for its result; acknowledge it."""
    stage = stage_of(subject)
    pending = runtime.submit(stage.inputs, params=stage.params)
    return bounded("call", pending.result)


def worker_identity(runtime: StageRuntime) -> tuple[int, float]:
    """The worker's (pid, start time) as the loaded stage describes it.

    The start time is :func:`edge_core.host.identity.start_time`'s (since boot on Linux),
    so a step of the wall clock never makes a live worker look replaced or gone.

    Raises:
        CheckFailed: the stage does not describe its worker's identity — every worker must
            announce one, and the retire and cancel checks cannot verify anything without it.
    """
    described = runtime.loaded.describe()
    identity = described_identity(described)
    if identity is not None:
        return identity.pid, identity.start_time
    pid, created = described.get("pid"), described.get("create_time")
    raise CheckFailed(f"describe(): no worker identity (pid, start_time or create_time): "
                      f"{{'pid': {pid!r}, 'start_time': {described.get('start_time')!r}, "
                      f"'create_time': {created!r}}}")


def gone(identity: tuple[int, float]) -> bool:
    """True when that exact process (pid, start time) is gone (a reused PID does not count)."""
    try:
        proc = psutil.Process(identity[0])
        return (abs(start_time(proc) - identity[1]) > 0.01
                or proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
