"""A worker's malformed event whose outputs came through shared memory gives it back.

Real echo-based workers (:mod:`workers.forged_shm_events`) send, through the serve loop's
own packing, events whose outputs are in their shared memory but whose fields break the
protocol (an error on a DONE or an OUTPUT). The controller reads the frame, maps the
segment, then finds the event malformed when it checks it: a ``ProtocolViolation``
naming the stage and the field, as for an inline one. Before, it rose before the
segment was acknowledged, so the worker's lease was never returned: under the stage's
shared-memory cap (room for one 64 MiB frame) the next large output could not be leased
(the worker's ``ShmCapExceeded``), and an OUTPUT's later DONE sat unread in a call nobody
read, its memory held too.

The conftest's leak check fails each test that leaves a process, a segment or a
descriptor (a view's mapping) behind. Each test here is exact through the cap: a 40 MiB
output fits only when the worker holds no other leased output (30 or 40 MiB) any more.
(For ``output``, the first forgery, on a worker with no segment yet, always leases its
DONE's 30 MiB beside its OUTPUT's; a later one may find the DONE's lease refused by the
cap while the OUTPUT's reused 40 MiB segment is not yet acknowledged: that DONE then
carries no memory to give back.)
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_contracts.requests import Operation, StageRequest
from edge_contracts.shm import segment_names
from edge_core.host.errors import ProtocolViolation
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline
from edge_core.workerstage import WorkerStage

from .conftest import MiB, OpenPipeline, echo_stage

WORKERS = Path(__file__).parent / "workers"
X = {"x": np.ones((2, 2), np.float32)}
BIG = 40 * MiB


def _forging_stage() -> dict[str, Any]:
    stage = echo_stage("a", scale=2.0)
    stage["backend"]["route"] = {"name": "forged", "interpreter": sys.executable,
                                 "entry": "forged_shm_events:create",
                                 "python_path": [str(WORKERS)]}
    return stage


def _worker_segments(pipeline: Pipeline) -> list[str]:
    """The worker's own segments: named ones in /dev/shm, sealed (memfd) ones it maps."""
    loaded = pipeline.stage("a").loaded
    assert isinstance(loaded, WorkerStage)
    client = loaded.client
    start = f"edge_{client._worker_prefix}_"
    with open(f"/proc/{client.identity.pid}/maps", encoding="ascii", errors="replace") as maps:
        mapped = {line.split("/memfd:", 1)[1].split()[0] for line in maps if "/memfd:" in line}
    return sorted(n for n in {*segment_names(), *mapped} if n.startswith(start))


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


def _serves_large_outputs(pipeline: Pipeline, times: int) -> None:
    """``times`` requests each answered with a 40 MiB output in the worker's memory."""
    for _ in range(times):
        with pipeline.run(X, params={"pad_output_bytes": BIG}, deadline_s=30.0) as result:
            pad = result.outputs["pad"]
            assert pad.nbytes == BIG and not pad.flags.owndata  # a view of the segment
            assert float(result.outputs["x"][0, 0]) == 2.0
            del pad


@pytest.mark.parametrize(("forge", "size"), [("done", BIG), ("output", 30 * MiB)])
def test_a_malformed_event_in_shared_memory_is_refused_and_its_memory_given_back(
    open_pipeline: OpenPipeline, ledger: ResourceLedger, forge: str, size: int,
) -> None:
    """``done``: a DONE carrying an error; ``output``: an OUTPUT carrying one, then its
    well-formed DONE (dropped, as the request has ended: its memory acknowledged too).
    Three times over: each refusal is a ``ProtocolViolation`` naming the stage and
    ``event.error``, the same worker then serves two 40 MiB outputs (none would fit
    beside a lease never given back), and no slot, charge or segment is left."""
    pipeline = open_pipeline(_forging_stage())
    loaded = pipeline.stage("a").loaded
    assert isinstance(loaded, WorkerStage)
    pid = loaded.describe()["pid"]
    held = ledger.holdings()
    for _ in range(3):  # the first on a worker that has leased nothing yet
        with pytest.raises(ProtocolViolation) as caught:
            pipeline.run(X, params={"forge": forge, "pad_bytes": size}, deadline_s=30.0)
        assert caught.value.field == "stages[a].event.error", caught.value
        assert "the worker sent a malformed event" in caught.value.reason, caught.value
        # The worker's own end of the refused call heard (an OUTPUT's call is cancelled:
        # its later DONE is dropped when read, its memory acknowledged before that).
        _wait_for(lambda: loaded.client.outstanding() == 0)
        _serves_large_outputs(pipeline, 2)
        assert loaded.describe()["pid"] == pid
        assert ledger.holdings() == held
        assert loaded.health().in_flight == 0
    assert len(_worker_segments(pipeline)) <= 2  # reused, not one per forged event
    pipeline.close()
    assert ledger.snapshot()["reservations"] == []


def test_the_events_queued_behind_a_malformed_one_give_their_memory_back_too(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """The stage's stream read only once the call's every event is here: the malformed
    OUTPUT (30 MiB) and the DONE behind it (30 MiB more), both queued. The refusal gives
    back the OUTPUT's memory and takes the DONE off the queue, giving its memory back
    too (before, both stayed leased, read by nobody); the stream is over, and the same
    worker serves 40 MiB outputs again."""
    pipeline = open_pipeline(_forging_stage())
    loaded = pipeline.stage("a").loaded
    assert isinstance(loaded, WorkerStage)
    held = ledger.holdings()
    request = StageRequest("r", "a", 0, loaded.client.generation, Operation.RUN,
                           params={"forge": "output", "pad_bytes": 30 * MiB})
    stream = loaded.call(request, X)
    ended = threading.Event()
    assert loaded.on_end("r", ended.set)
    assert ended.wait(15.0)  # both events queued, none read yet
    with pytest.raises(ProtocolViolation) as caught:
        next(stream)
    assert caught.value.field == "stages[a].event.error", caught.value
    with pytest.raises(StopIteration):
        next(stream)
    assert not loaded.client.in_flight("r") and loaded.client.outstanding() == 0
    _serves_large_outputs(pipeline, 2)
    assert ledger.holdings() == held
    pipeline.close()
    assert ledger.snapshot()["reservations"] == []


def test_an_event_whose_error_is_no_object_is_a_protocol_violation_naming_it(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """A DONE with a 40 MiB output in shared memory whose meta says ``"error": 5``: the
    client could not read the frame's meta (``5.get``): the worker was lost as one whose
    frame "could not be delivered" (``WorkerGone``, as for a segment it cannot map).
    Now it is what it is, the worker's ``ProtocolViolation`` naming ``header.meta.error``
    and the value; the worker is lost as for any frame it cannot read, and nothing is
    left after close (its segments acknowledged before the error rose, then swept)."""
    pipeline = open_pipeline(_forging_stage())
    loaded = pipeline.stage("a").loaded
    assert isinstance(loaded, WorkerStage)
    held = ledger.holdings()
    with pytest.raises(ProtocolViolation) as caught:
        pipeline.run(X, params={"forge": "error_not_object", "pad_bytes": BIG},
                     deadline_s=30.0)
    assert (caught.value.field, caught.value.reason, caught.value.value) == (
        "header.meta.error", "must be an object or null", 5), caught.value
    assert loaded.health().state in {"lost", "retired"}  # (retired once the runtime saw it)
    assert ledger.holdings() == held
    pipeline.close()
    assert ledger.snapshot()["reservations"] == []
