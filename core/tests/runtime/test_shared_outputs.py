"""Large outputs are views of the worker's shared memory until the acknowledgement.

The worker's shared-memory cap (64 MiB by default) makes each test exact: with 40 MiB
outputs, a second request can only succeed if the first one's memory went back (or was
handed over to views still held here).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from edge_contracts.shm import segment_names
from edge_core.runtime import OutputReleased, RequestCancelled

from .conftest import MiB, OpenPipeline, echo_stage

BIG = {"x": np.ones(40 * MiB // 4, np.float32)}  # 40 MiB in, 40 MiB out


def _worker_segments(pipeline) -> list[str]:  # type: ignore[no-untyped-def]
    """The worker's own segments: named ones in /dev/shm, sealed (memfd) ones it maps."""
    client = pipeline.stage("a").loaded.client
    start = f"edge_{client._worker_prefix}_"
    with open(f"/proc/{client.identity.pid}/maps", encoding="ascii", errors="replace") as maps:
        mapped = {line.split("/memfd:", 1)[1].split()[0] for line in maps if "/memfd:" in line}
    return sorted(n for n in {*segment_names(), *mapped} if n.startswith(start))


def test_large_outputs_are_read_only_views_given_back_by_the_ack(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", scale=3.0))
    stage = pipeline.stage("a")
    seen: list[list[str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # nothing kept past the ack
        for _ in range(4):  # 4 x 40 MiB under a 64 MiB cap: each ack gives memory back
            result = stage.submit(BIG).result()
            y = result.outputs["x"]
            assert not y.flags.writeable and not y.flags.owndata
            assert float(y[0]) == 3.0 and y.shape == BIG["x"].shape
            del y
            result.ack()
            seen.append(_worker_segments(pipeline))
            with pytest.raises(OutputReleased, match=r"outputs\.x: released by ack\(\)"):
                result.outputs["x"]
    assert seen[0] == seen[-1] and len(seen[0]) == 1  # one worker segment, reused


def test_an_output_kept_past_the_ack_keeps_its_bytes(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", scale=3.0))
    stage = pipeline.stage("a")
    result = stage.submit(BIG).result()
    kept = result.outputs["x"][:1024]  # a view: it must stay valid
    held = _worker_segments(pipeline)
    with pytest.warns(ResourceWarning, match=r"outputs \['x'\] were still referenced"):
        result.ack()
    for scale in (5.0, 7.0):  # under the cap: the kept segment left the worker's books
        other = {"x": np.full(40 * MiB // 4, scale, np.float32)}
        with stage.submit(other).result() as later:
            assert float(later.outputs["x"][0]) == 3.0 * scale
    assert bool(np.all(kept == 3.0))  # never overwritten: its segment was not reused
    assert len(held) == 1 and held[0] not in _worker_segments(pipeline)  # unlinked
    del kept  # its mapping (and descriptor) go with the last view


def test_intermediate_results_go_back_once_the_next_stage_has_its_inputs(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(
        echo_stage("a", scale=2.0),
        echo_stage("b", scale=0.5, transform="edge_echo.transforms:passthrough"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        for _ in range(3):  # 40 MiB between the stages, under each worker's 64 MiB cap
            with pipeline.run(BIG) as result:
                assert float(result.outputs["x"][0]) == 1.0


def test_a_fenced_output_is_given_back_undelivered(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", scale=3.0))
    stage = pipeline.stage("a")
    client = stage.loaded.client
    pending = stage.submit(BIG)
    deadline = time.monotonic() + 10
    while client.in_flight(pending.request_id) and time.monotonic() < deadline:
        time.sleep(0.01)  # computed and sent: its output sits in worker memory
    stage.cancel(pending.request_id)  # fenced: that output must never be delivered
    with pytest.raises(RequestCancelled):
        pending.result()
    for _ in range(2):  # would exceed the cap if the fenced output were still held
        with stage.submit(BIG).result() as result:
            assert float(result.outputs["x"][0]) == 3.0
