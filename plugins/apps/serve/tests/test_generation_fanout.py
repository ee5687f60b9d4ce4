"""A generate request whose last stage was fed a fan-out: a typed 500, its slot freed.

In-process, on a real echo pipeline (real worker processes) whose transform before the
last stage returns a ``Fanout``: :class:`Generation` runs the request as the chat route
does for a pipeline with graph stages (its image through ``prepare``) and gets the
gathered items instead of one stage's result.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_serve.generation import Generation, ImagePart, TokenFeed
from edge_serve.outcomes import HttpRefusal
from edge_serve.served import ServedPipeline, private_upload_dir

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def test_a_fanout_into_the_last_stage_is_500_unsupported_fanout_and_frees_its_slot() -> None:
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])
    config = load_pipeline({"name": "rows", "admission": 1,
                            "prepare": "edge_echo.ends:prepare", "stages": [
        {"id": "first", "backend": {"name": "echo"}},
        {"id": "rows", "backend": {"name": "echo"},
         "input_transform": "edge_echo.transforms:split_rows"}]})
    pipeline = Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger,
                             retire_deadline_s=3.0)
    try:
        with ThreadPoolExecutor(2) as executor:
            served = ServedPipeline(pipeline, executor, private_upload_dir())

            async def ended() -> Any:
                feed = TokenFeed(asyncio.get_running_loop())
                generation = Generation(served, {}, None, image=ImagePart(
                    b"1 2 3", ".txt", "messages[0].content[0]"))
                await asyncio.to_thread(generation.run, feed)
                while isinstance(item := await feed.get(), dict):
                    pass  # an item's events, if the stage sends any
                return item

            refusal = asyncio.run(ended())
        assert isinstance(refusal, HttpRefusal), refusal
        body = json.loads(refusal.body())["error"]
        assert (refusal.status, body["code"], body["param"]) == (500, "internal_error", None)
        assert body["edge"]["kind"] == "UnsupportedFanout"
        assert body["edge"]["field"] == "model"
        assert "fed a fan-out" in body["message"] and "rows" in body["message"]
        assert refusal.headers["x-should-retry"] == "false"
        # the gathered result was acknowledged: the pipeline serves the next request
        x = np.arange(6, dtype=np.float32).reshape(3, 2)
        with pipeline.run({"x": x}) as again:
            assert len(again.outputs["x"]) == 3
        assert pipeline.stage("rows").slots.used == 0
    finally:
        pipeline.close()
    assert ledger.snapshot()["reservations"] == []
