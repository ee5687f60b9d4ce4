"""What a small ``Pipeline.run`` leaves for the garbage collector: no cycle, little kept.

A stage call's deadline handle waits in the process's timer inbox until the timer next
empties it (about every thousand calls), after the call has ended and its handle was
cancelled. Its action named the call's record (now its ``PendingCall``), which names the handle:
a reference cycle per call, freed only by the collector, and what the action held
stayed alive (a few objects per call) until then, filling the collector's youngest
generation, so that it ran every hundred or so calls on the per-call path. Counted, not
timed: the objects the collector finds unreachable, and the cancelled handles that still
hold an action.
"""

from __future__ import annotations

import gc
import time
from collections import Counter

import numpy as np

from edge_core.runtime import Pipeline
from edge_core.runtime.deadlines import TimerHandle, no_action, timer
from edge_core.runtime.pending import PendingCall

from .conftest import OpenPipeline, echo_stage

REQUESTS = 100


def _run(pipeline: Pipeline, count: int) -> None:
    x = np.arange(4, dtype=np.float32)
    for _ in range(count):
        result = pipeline.run({"x": x})
        np.testing.assert_array_equal(result.outputs["x"], x * 2)  # echo doubles
        result.ack()


def _drained() -> None:
    """Have the timer empty its inbox now (a deadline due at once wakes it), and wait."""
    timer().schedule(time.monotonic(), no_action)
    end = time.monotonic() + 10
    while timer().backlog()[0] and time.monotonic() < end:
        time.sleep(0.01)
    assert timer().backlog()[0] == 0


def _ours(found: object, runtime: object) -> bool:
    """A record or a deadline handle of ``runtime``'s calls (not another test's).

    A collection finds whatever became garbage in the process meanwhile: a pipeline an
    earlier test of the same pytest worker left to a background thread may be freed then.
    A handle names its runtime through its action (the runtime's bound expiry) until it
    is cancelled.
    """
    if isinstance(found, PendingCall):
        return found.stage is runtime
    return getattr(found.action, "__self__", None) is runtime  # type: ignore[attr-defined]


def test_a_small_request_leaves_no_reference_cycle(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s0"))
    runtime = pipeline.stage("s0")
    _run(pipeline, 30)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage
    try:
        _run(pipeline, REQUESTS)
        _drained()  # the ended calls' handles leave the inbox: only cycles keep them
        gc.collect()
        found = [o for o in gc.garbage if isinstance(o, PendingCall | TimerHandle)]
        cyclic = [o for o in found if _ours(o, runtime)]
        # Said on a failure: what else the collection found with them
        kinds = Counter(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    assert cyclic == [], (
        f"{len(cyclic)} records and handles of this test's calls in cycles after {REQUESTS}"
        f" calls ({len(found) - len(cyclic)} of other pipelines); the collection found"
        f" {kinds.most_common(12)}")


def test_an_ended_calls_deadline_handle_holds_nothing(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s0"))
    _drained()  # none left from earlier tests: only this test's calls' handles wait
    _run(pipeline, REQUESTS)
    holding = [o for o in gc.get_objects()
               if isinstance(o, TimerHandle) and o.cancelled
               and (o.action is not no_action or o.args)]
    assert holding == [], (f"{len(holding)} cancelled handles still hold their action "
                           "or its arguments")
