"""A chain keeps no earlier stage's result while a later stage runs.

Each stage call is listed where a Ctrl-C's unwinding finds it (``run_chain``'s
``into``); once an earlier stage's result is acknowledged (the next stage's inputs are
private copies by then) its call leaves that list too, so its outputs are not held by
the request until its end: a page's detection maps, say, while its lines are read.
"""

from __future__ import annotations

import gc
import time
import uuid

import numpy as np

from edge_core.runtime.results import StageResult

from .conftest import OpenPipeline, echo_stage


def test_an_earlier_stages_result_is_let_go_while_the_next_stage_runs(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(
        echo_stage("a"),
        echo_stage("b", transform="edge_echo.transforms:passthrough", delay_s=0.5))
    x = np.ones(1000, np.float32)
    rid = f"chain-memory-{uuid.uuid4().hex}"  # (only this test's results are looked at)
    submitted = pipeline.submit({"x": x}, request_id=rid)
    try:
        deadline = time.monotonic() + 10
        while pipeline.stage("b").outstanding == 0 and time.monotonic() < deadline:
            time.sleep(0.005)  # until stage b runs (0.5 s)
        assert pipeline.stage("b").outstanding == 1
        gc.collect()
        alive = [o for o in gc.get_objects()
                 if type(o) is StageResult and o.key.request_id == rid]
        assert alive == [], [o.outputs for o in alive]
    finally:
        result = submitted.result(10)
    with result:
        np.testing.assert_array_equal(result.outputs["x"], x * 4)
