"""A worker stage's calls by request id, when an id is used again after its call ended."""

from __future__ import annotations

import numpy as np

from edge_contracts.requests import EventKind, Operation, StageRequest
from edge_core.backend import CancelOutcome
from edge_core.workerstage import WorkerStage

from .conftest import OpenPipeline, echo_stage


def test_a_stream_closed_late_leaves_the_newer_call_of_its_id_known(
    open_pipeline: OpenPipeline,
) -> None:
    """The stream of an ended call, closed only after its id was sent again (a caller
    kept it, say through an exception's traceback), leaves the new one known: the new one
    can still be cancelled in place and waited for by callback (the channel knows a call
    by its id until its terminal event is read; the stage keeps no registry of its own)."""
    pipeline = open_pipeline(echo_stage("s0", backend="echo-preemptible"))
    loaded = pipeline.stage("s0").loaded
    assert isinstance(loaded, WorkerStage)
    generation = loaded.client.generation
    inputs = {"x": np.arange(4, dtype=np.float32)}
    old = loaded.call(StageRequest("r", "s0", 0, generation, Operation.RUN), inputs)
    event, _ = next(old)
    assert event.kind is EventKind.DONE  # ended, its stream still open
    slow = loaded.call(StageRequest("r", "s0", 0, generation, Operation.RUN,
                                    params={"delay_s": 30.0}), inputs)
    old.close()
    ended: list[bool] = []
    assert loaded.on_end("r", lambda: ended.append(True))
    assert loaded.cancel("r", 0, preemptible=True) is CancelOutcome.CANCELLED_IN_PLACE
    event, _ = next(slow)
    assert event.kind is EventKind.CANCELLED
    assert ended == [True]
    slow.close()
