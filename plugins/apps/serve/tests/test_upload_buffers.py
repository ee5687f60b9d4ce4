"""An uploaded file's ``prepare`` writes into the pipeline's input buffers (no copy).

In-process: the ASGI application over a real echo pipeline (a real worker process with
shared memory), driven through httpx's ASGI transport. The ``prepare`` here reads a file of
numbers, as the echo test package's does, but takes the ``input_buffer`` keyword, so the
server offers it the pipeline's buffer and the array travels to the worker by reference.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.errors import StageClosed
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_serve.app import ServerState, build_app
from edge_serve.served import ServedPipeline, private_upload_dir

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

COUNT = 64 * 1024
"""Numbers in the uploaded file: 256 KiB of float32, well above the shared-memory threshold."""


class BufferPrepare:
    """A file of numbers -> ``{"x": float32}``, written into ``input_buffer`` when offered."""

    def __init__(self) -> None:
        self.offered = 0

    def __call__(self, source: str, input_buffer: Callable[..., Any] | None = None,
                 ) -> dict[str, np.ndarray]:
        values = np.asarray(Path(source).read_text().split(), dtype=np.float32)
        if input_buffer is None:
            return {"x": values}
        self.offered += 1
        out = input_buffer("x", values.shape, np.float32)
        out[...] = values
        return {"x": out}


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * 1024**3)])
    config = load_pipeline({"name": "echo", "stages": [
        {"id": "e", "backend": {"name": "echo"}}]})
    opened = Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "echo"}), ledger,
                           retire_deadline_s=3.0)
    try:
        yield opened
    finally:
        opened.close()
        assert ledger.snapshot()["reservations"] == []


def test_an_upload_is_prepared_into_the_pipelines_input_buffer(pipeline: Pipeline) -> None:
    numbers = np.arange(COUNT, dtype=np.float32)
    text = " ".join(str(int(v)) for v in numbers).encode()
    with ThreadPoolExecutor(4) as executor:
        served = ServedPipeline(pipeline, executor, private_upload_dir())
        served.prepare = prepare = BufferPrepare()
        app = build_app(ServerState({"echo": served}, pipeline.ledger, max_body_bytes=1 << 22))
        sent_before = pipeline.input_buffer_counts()["sent"]

        async def scenario() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
                return await client.post("/v1/pipelines/echo/run",
                                         files={"file": ("n.txt", text, "text/plain")})

        reply = asyncio.run(scenario())
    assert reply.status_code == 200, reply.text
    outputs = reply.json()["outputs"]
    assert outputs["x"]["shape"] == [COUNT]
    assert prepare.offered == 1
    assert pipeline.input_buffer_counts()["sent"] == sent_before + 1  # by reference


def test_a_stage_that_cannot_give_a_buffer_is_its_error_not_the_files(
        pipeline: Pipeline) -> None:
    with ThreadPoolExecutor(1) as executor:
        served = ServedPipeline(pipeline, executor, private_upload_dir())
        served.prepare = BufferPrepare()
        pipeline.close()  # the stage no longer serves: no buffer to give
        with pytest.raises(StageClosed):  # 503 (not 400 naming the file)
            served.prepared(b"1 2 3", ".txt")
        assert list(served.upload_dir.iterdir()) == []  # the upload is gone all the same
